"""The scheduler kernels (``schedkern``) on both twins: Kthena's least-request score, the
least-latency blend, free KV cache and the waiting filter, unknown figures included; and the
compiled twin agreeing with the reference bit for bit on random columns."""

from __future__ import annotations

import struct
from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.speedups.conftest import load

SETTINGS = settings(deadline=None, max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])


def test_least_request(schedkern: ModuleType) -> None:
    # bases: 0, 2, 4 + 100*3 = 304, unknown running: 2 + 100*2 = 202, running > in-flight: 1
    got = schedkern.least_request([0, 2, 4, 2, 1], [0.0, 2.0, 1.0, None, 5.0])
    assert got == pytest.approx([100, 100 * 302 / 304, 0, 100 * 102 / 304, 100 * 303 / 304])
    assert schedkern.least_request([0, 0], [None, 3.0]) == [100.0, 100.0]  # all idle
    assert schedkern.least_request([], []) == []
    with pytest.raises(ValueError):
        schedkern.least_request([1, 2], [None])


def test_least_latency(schedkern: ModuleType) -> None:
    got = schedkern.least_latency([0.1, 0.3, 0.2, None, 0.1], [0.01, 0.01, 0.03, None, None])
    assert got == pytest.approx([100, 50, 25, 0, 50])
    assert schedkern.least_latency([0.2, 0.2, None], [0.02, 0.02, None]) == [100.0, 100.0, 0.0]
    with pytest.raises(ValueError):
        schedkern.least_latency([0.1], [])


def test_least_latency_extreme_spans(schedkern: ModuleType) -> None:
    # a subnormal span (50 / span is inf: the product form gave 0 x inf = NaN) and one past the largest double
    assert schedkern.least_latency([5e-324, 0.0, None], [None, None, None]) == [0.0, 50.0, 0.0]
    assert schedkern.least_latency([1e-320, 0.0, 5e-321], [None] * 3) == pytest.approx([0.0, 50.0, 25.0])
    assert schedkern.least_latency([1.7e308, -1.7e308, 0.0], [1.0, 1.0, 1.0]) == [50.0, 100.0, 75.0]


def test_kv_free_and_keep_below(schedkern: ModuleType) -> None:
    assert schedkern.kv_free([0.2, 0.5, None, 1.3, -0.1]) == pytest.approx([80, 50, 0, 0, 100])
    assert schedkern.keep_below([12.0, 3.0, None, 10.0, 9.5], 10.0) == [1, 2, 4]
    assert schedkern.keep_below([1.0, None], 10.0) is None  # nothing dropped
    assert schedkern.keep_below([10.0, 50.0], 10.0) is None  # all would go: the filter keeps all


figure = st.one_of(st.none(), st.floats(-1e6, 1e6, allow_nan=False))



def _bits(xs: list[float]) -> list[bytes]:
    """Bit for bit: each float's IEEE bytes (so two NaNs compare equal, and -0.0 differs from 0.0)."""
    return [struct.pack("<d", x) for x in xs]


@SETTINGS
@given(st.lists(st.tuples(st.integers(0, 10_000), figure, figure, figure, figure), max_size=40))
def test_twins_agree_bit_for_bit(rows: list[tuple[int, float | None, float | None, float | None, float | None]]) -> None:
    py, c = load("schedkern", "py"), load("schedkern", "c")
    f = [r[0] for r in rows]
    a, b, d, e = ([r[i] for r in rows] for i in range(1, 5))
    assert py.least_request(f, a) == c.least_request(f, a)
    ll = py.least_latency(b, d)
    assert _bits(ll) == _bits(c.least_latency(b, d))
    assert all(0.0 <= x <= 100.0 for x in ll), ll  # never a NaN, whatever the span
    assert _bits(py.kv_free(e)) == _bits(c.kv_free(e))
    assert py.keep_below(a, 10.0) == c.keep_below(a, 10.0)


opt_count = st.one_of(st.none(), st.integers(0, 30).map(float))


@SETTINGS
@given(st.lists(st.tuples(st.integers(0, 40), opt_count, opt_count, figure, figure, figure,
                          st.integers(0, 100).map(float)), min_size=1, max_size=20),
       st.lists(st.sampled_from([0, 1, 2, 3]), min_size=1, max_size=5),
       st.lists(st.sampled_from([1.0, 0.5, 2.0, 3.0]), min_size=5, max_size=5),
       st.sampled_from([-1.0, 10.0, 3.0]), st.integers(0, 50))
def test_best_of_twins_agree(rows: list[tuple[Any, ...]], codes: list[int], weights: list[float], max_waiting: float,
                             turn: int) -> None:
    py, c = load("schedkern", "py"), load("schedkern", "c")
    f, w, r, kv, t, p, ex = ([row[i] for row in rows] for i in range(7))
    extra = [ex if code == 0 else None for code in codes]
    args = (codes, weights[: len(codes)], max_waiting, f, w, r, kv, t, p, extra, turn)
    assert py.best_of(*args) == c.best_of(*args)


def test_best_of_checks_its_inputs(schedkern: ModuleType) -> None:
    with pytest.raises(ValueError):
        schedkern.best_of([1], [1.0], -1.0, [], [], [], [], [], [], [None], 0)
    with pytest.raises(ValueError):
        schedkern.best_of([0], [1.0], -1.0, [1], [None], [None], [None], [None], [None], [None], 0)
    assert schedkern.best_of([1], [1.0], -1.0, [3, 0, 0], [None] * 3, [None] * 3, [None] * 3, [None] * 3,
                             [None] * 3, [None], 5) == (2, True)  # 0 and 0 tie: turn 5 of 2 -> the second
