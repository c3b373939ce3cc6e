"""F16 (reliability plan A5): the bearer-token check takes the same time for a wrong first byte as
for a token that shares 31 of its 32 bytes with the right one.

In process, at the compare layer (``BearerAuth.check``, the function the proxy calls): 20,000
samples of each kind, interleaved in a shuffled order, each timed with ``perf_counter_ns``. Pass:
median difference < 1 us and a two-sided Mann-Whitney p > 0.01 (a p-value of equal distributions is
uniform, so the row fails by chance one time in 100: a failing run is repeated once before it counts).
The timing test runs only under the ``reliability`` marker (no wall-clock asserts in make test);
the statistics helper is checked in make test.
"""

from __future__ import annotations

import random
import statistics
import time

import pytest

from flexinfer.errors import Unauthorized
from flexinfer.proxy.auth import BearerAuth
from tests.proxy._mannwhitney import mann_whitney
from tests.proxy._rel import figure

TOKEN = "sk-" + "a1b2c3d4e5f6g7h8i9j0k1l2m3n4o"  # 32 characters


def test_mann_whitney_helper() -> None:
    same = [float(i % 17) for i in range(2000)]
    assert mann_whitney(same, list(same))[1] == pytest.approx(1.0, abs=1e-3)
    lo, hi = [float(i) for i in range(500)], [float(i) + 1000 for i in range(500)]
    u, p = mann_whitney(lo, hi)
    assert u == 0 and p < 1e-100
    rng = random.Random(3)
    shifted = mann_whitney([rng.gauss(0, 1) for _ in range(3000)], [rng.gauss(0.2, 1) for _ in range(3000)])[1]
    assert shifted < 1e-6  # a shift of 0.2 sd over 3,000 samples is found
    # by hand: U = 8, four ties of 2 -> var = 64/12 x (17 - 24/240) = 90.13, z = (24 - 0.5)/9.494
    # = 2.4753, p = erfc(z / sqrt 2) = 0.01331
    u, p = mann_whitney([1, 2, 3, 4, 5, 6, 7, 8], [5, 6, 7, 8, 9, 10, 11, 12])
    assert u == 8.0 and p == pytest.approx(0.01331, abs=1e-4)


def sample(n: int, seed: int) -> tuple[list[float], list[float]]:
    auth = BearerAuth([TOKEN])
    first = b"Bearer " + ("X" + TOKEN[1:]).encode()  # wrong at byte 1
    prefix = b"Bearer " + (TOKEN[:-1] + "X").encode()  # the right 31-byte prefix
    assert len(first) == len(prefix)
    kinds = [0] * n + [1] * n
    random.Random(seed).shuffle(kinds)
    values = ([first], [prefix])
    out: tuple[list[float], list[float]] = ([], [])
    clock = time.perf_counter_ns
    for _ in range(2000):  # warm up
        try:
            auth.check(values[_ % 2])
        except Unauthorized:
            pass
    for k in kinds:
        v = values[k]
        t0 = clock()
        try:
            auth.check(v)
        except Unauthorized:
            pass
        out[k].append(float(clock() - t0))
    return out


@pytest.mark.reliability
def test_token_compare_timing_20k() -> None:
    a, b = sample(20_000, seed=1)
    diff_us = abs(statistics.median(a) - statistics.median(b)) / 1000
    _, p = mann_whitney(a, b)
    figure("F16", samples_each=len(a), median_first_ns=statistics.median(a), median_prefix_ns=statistics.median(b),
           median_diff_us=diff_us, mann_whitney_p=p)
    assert diff_us < 1.0
    assert p > 0.01, p
