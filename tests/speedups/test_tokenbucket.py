"""TokenBucket and BucketRegistry contract, run on both twins, with an injected clock."""

from __future__ import annotations

import math
import time
from types import ModuleType

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

SETTINGS = settings(
    deadline=None, max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


class FakeClock:
    def __init__(self, t: float = 100.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_starts_full_then_waits(tokenbucket: ModuleType) -> None:
    clock = FakeClock()
    b = tokenbucket.TokenBucket(rate=2.0, burst=3.0, clock=clock)
    assert [b.take() for _ in range(3)] == [0.0, 0.0, 0.0]
    assert b.take() == 0.5  # one token at 2/s
    assert b.tokens == 0.0  # nothing consumed by the refusal
    clock.t += 0.5
    assert b.take() == 0.0
    assert b.take(2.0) == 1.0
    assert b.rate == 2.0 and b.burst == 3.0


def test_wait_is_exact_and_sufficient(tokenbucket: ModuleType) -> None:
    clock = FakeClock(0.0)
    b = tokenbucket.TokenBucket(10.0, 5.0, clock=clock)
    assert b.take(5.0) == 0.0
    wait = b.take(3.0)
    assert wait == pytest.approx(0.3)
    clock.t += wait
    assert b.take(3.0) == 0.0


def test_refill_is_capped_at_burst(tokenbucket: ModuleType) -> None:
    b = tokenbucket.TokenBucket(100.0, 4.0, now=0.0)
    assert b.take(4.0, now=0.0) == 0.0
    assert b.available(now=1000.0) == 4.0
    assert b.take(4.0, now=1000.0) == 0.0
    assert b.take(1.0, now=1000.0) == pytest.approx(0.01)


def test_clock_going_backwards_adds_nothing(tokenbucket: ModuleType) -> None:
    b = tokenbucket.TokenBucket(1.0, 2.0, now=10.0)
    assert b.take(2.0, now=10.0) == 0.0
    assert b.take(1.0, now=5.0) == 1.0  # 5 s "earlier": no refill
    assert b.last == 10.0
    assert b.take(1.0, now=10.5) == 0.5  # only the time past the latest reading counts
    assert b.take(1.0, now=11.0) == 0.0


def test_never_satisfiable(tokenbucket: ModuleType) -> None:
    b = tokenbucket.TokenBucket(1.0, 2.0, now=0.0)
    assert b.take(3.0, now=0.0) == math.inf
    assert b.tokens == 2.0
    z = tokenbucket.TokenBucket(0.0, 1.0, now=0.0)
    assert z.take(now=0.0) == 0.0
    assert z.take(now=1e9) == math.inf
    assert b.take(0.0, now=0.0) == 0.0


def test_validation(tokenbucket: ModuleType) -> None:
    for rate, burst in (
        (-1.0, 1.0),
        (math.inf, 1.0),
        (math.nan, 1.0),
        (1.0, 0.0),
        (1.0, -2.0),
        (1.0, math.inf),
    ):
        with pytest.raises(ValueError):
            tokenbucket.TokenBucket(rate, burst, now=0.0)
    b = tokenbucket.TokenBucket(1.0, 1.0, now=0.0)
    for n in (-1.0, math.nan):
        with pytest.raises(ValueError):
            b.take(n, now=0.0)
    with pytest.raises(TypeError):
        b.take("1")  # type: ignore[arg-type]
    for kwargs in ({"max_keys": 0}, {"idle_ttl": 0.0}, {"idle_ttl": math.nan}):
        with pytest.raises(ValueError):
            tokenbucket.BucketRegistry(1.0, 1.0, **kwargs)
    with pytest.raises(TypeError):
        tokenbucket.BucketRegistry(1.0, 1.0, max_keys=2.5)


def test_int_arguments_are_floats(tokenbucket: ModuleType) -> None:
    b = tokenbucket.TokenBucket(3, 5, now=1)
    assert b.take(2, now=1) == 0.0
    assert isinstance(b.tokens, float) and b.tokens == 3.0


def test_default_clock_is_time_monotonic(tokenbucket: ModuleType) -> None:
    b = tokenbucket.TokenBucket(1.0, 10.0)
    before = time.monotonic()
    b.take()
    after = time.monotonic()
    assert before <= b.last <= after
    reg = tokenbucket.BucketRegistry(1.0, 10.0)
    before = time.monotonic()
    reg.take("k", 10.0)
    after = time.monotonic()
    # the bucket was created full at the read time t: t - before of refill, capped
    assert reg.available("k", now=after + 10.0) == 10.0
    assert 0.0 <= reg.available("k", now=after) <= after - before + 1e-9


def test_injected_clock_is_used(tokenbucket: ModuleType) -> None:
    clock = FakeClock(7.0)
    b = tokenbucket.TokenBucket(1.0, 1.0, clock=clock)
    assert b.last == 7.0
    b.take()
    clock.t = 9.0
    b.take()
    assert b.last == 9.0


@SETTINGS
@given(
    rate=st.floats(1.0, 200.0),
    burst=st.floats(1.0, 100.0),
    extra=st.floats(20.0, 60.0),
    start=st.sampled_from([0.0, 12345.678, 3.5e6]),  # clock readings far from 0 round coarser
)
def test_driven_at_twice_the_rate_admits_rate_times_t_plus_burst(
    tokenbucket: ModuleType, rate: float, burst: float, extra: float, start: float
) -> None:
    seconds = 2 * burst / rate + extra  # long enough for demand (2rT) to exceed supply (rT + b)
    clock = FakeClock(start)
    b = tokenbucket.TokenBucket(rate, burst, clock=clock)
    attempts = int(2 * rate * seconds)
    admitted = 0
    for i in range(attempts):
        clock.t = start + i / (2 * rate)
        if b.take() == 0.0:
            admitted += 1
    expected = rate * (clock.t - start) + burst
    assert abs(admitted - expected) <= 0.02 * expected + 1


@SETTINGS
@given(ops=st.lists(st.tuples(st.floats(0.0, 3.0), st.floats(-1.0, 2.0)), max_size=80))
def test_tokens_stay_within_bounds_and_waits_are_honest(
    tokenbucket: ModuleType, ops: list[tuple[float, float]]
) -> None:
    t = 0.0
    b = tokenbucket.TokenBucket(2.0, 3.0, now=t)
    for n, dt in ops:
        t += dt
        before = b.available(now=t)
        wait = b.take(n, now=t)
        assert 0.0 <= b.tokens <= 3.0
        if wait == 0.0:  # admitted (within the bucket's grace of rate x GRACE below n: then emptied, never negative)
            assert b.tokens == pytest.approx(max(before - n, 0.0))
            assert before >= n - 2.0 * tokenbucket.GRACE
        else:
            assert b.tokens == before  # nothing taken
            assert wait == pytest.approx((n - before) / 2.0)


# -- registry ---------------------------------------------------------------------------


def test_registry_keys_are_independent(tokenbucket: ModuleType) -> None:
    reg = tokenbucket.BucketRegistry(1.0, 2.0, clock=FakeClock(0.0))
    assert reg.take("a", 2.0) == 0.0
    assert reg.take("a") == 1.0
    assert reg.take("b") == 0.0
    assert len(reg) == 2 and "a" in reg and "c" not in reg
    assert reg.available("c") == 2.0 and "c" not in reg  # peeking adds nothing
    assert reg.keys() == ["a", "b"]
    reg.take("a")
    assert reg.keys() == ["b", "a"]  # least recently used first
    reg.clear()
    assert len(reg) == 0 and reg.keys() == []
    assert (reg.rate, reg.burst, reg.max_keys, reg.idle_ttl) == (1.0, 2.0, 10000, 300.0)


def test_registry_evicts_lru_when_nothing_is_full(tokenbucket: ModuleType) -> None:
    reg = tokenbucket.BucketRegistry(1.0, 10.0, max_keys=3, idle_ttl=1e9)
    for key in "abc":
        reg.take(key, 10.0, now=0.0)  # drained, far from full
    reg.take("a", 0.0, now=1.0)  # a is now the most recent
    reg.take("d", now=1.0)
    assert reg.keys() == ["c", "a", "d"]  # b was the LRU


def test_registry_evicts_a_full_bucket_before_the_lru(tokenbucket: ModuleType) -> None:
    reg = tokenbucket.BucketRegistry(1.0, 10.0, max_keys=3, idle_ttl=1e9)
    reg.take("a", 10.0, now=0.0)  # drained
    reg.take("b", 1.0, now=0.0)  # full again after 1 s
    reg.take("c", 10.0, now=0.0)  # drained
    reg.take("d", now=2.0)
    assert reg.keys() == ["a", "c", "d"]  # b was as good as new: dropping it changes nothing


def test_registry_sweeps_idle_and_full_buckets_on_a_new_key(tokenbucket: ModuleType) -> None:
    reg = tokenbucket.BucketRegistry(1.0, 100.0, max_keys=100, idle_ttl=20.0)
    for i in range(10):
        reg.take(f"k{i}", 50.0, now=float(i))
    assert len(reg) == 10
    reg.take("new", now=25.0)  # k0..k5 idle >= 20 s; k6 is neither idle nor full: stop there
    assert reg.keys() == ["k6", "k7", "k8", "k9", "new"]
    reg.take("newer", now=75.0)  # everything idle >= 20 s (and full again)
    assert reg.keys() == ["newer"]


@SETTINGS
@given(
    max_keys=st.integers(1, 6),
    ops=st.lists(st.tuples(st.integers(0, 9), st.floats(0.0, 2.0), st.floats(0.0, 1.0)), max_size=100),
)
def test_registry_size_is_bounded(
    tokenbucket: ModuleType, max_keys: int, ops: list[tuple[int, float, float]]
) -> None:
    reg = tokenbucket.BucketRegistry(1.0, 3.0, max_keys=max_keys, idle_ttl=4.0)
    t = 0.0
    for key, n, dt in ops:
        t += dt
        reg.take(key, n, now=t)
        assert len(reg) <= max_keys
        assert reg.keys()[-1] == key


def test_registry_without_eviction_matches_single_buckets(tokenbucket: ModuleType) -> None:
    reg = tokenbucket.BucketRegistry(3.0, 4.0, max_keys=100, idle_ttl=1e9)
    buckets = {k: tokenbucket.TokenBucket(3.0, 4.0, now=0.0) for k in "xyz"}
    for k in "xyz":
        reg.take(k, 0.0, now=0.0)
    t = 0.0
    for i in range(300):
        t += (i % 7) * 0.05
        key = "xyz"[i % 3]
        n = 0.5 + (i % 5) * 0.5
        assert reg.take(key, n, now=t) == buckets[key].take(n, now=t)
