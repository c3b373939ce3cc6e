"""The one backoff: bounded, jittered, exponential; Retry-After as a floor or in place of the delay;
and the exact schedules its callers had before they shared it."""

from __future__ import annotations

import itertools
import math

from flexinfer.k8s.backoff import Backoff


def test_backoff_is_bounded_and_jittered() -> None:
    b = Backoff(0.5, 30.0, rng=lambda: 0.999)
    delays = [b.next() for _ in range(12)]
    assert delays[0] < 0.5 and all(d <= 30.0 for d in delays) and delays[-1] > 29
    assert all(x <= y for x, y in itertools.pairwise(delays))
    low = Backoff(0.5, 30.0, rng=lambda: 0.0)
    assert low.next() == 0.25  # jitter keeps at least half the delay
    assert Backoff(0.5, 30.0).next(7.0) == 7.0  # Retry-After wins when longer
    b.reset()
    assert b.next() < 0.5


def test_watch_and_patch_schedule() -> None:
    """The reflector's and the kube runtime's patches: base * 2**n (n from 0), capped, times [0.5, 1)."""
    for base, cap in ((0.5, 30.0), (0.2, 2.0)):
        for r in (0.0, 0.5, 0.999):
            b = Backoff(base, cap, rng=lambda r=r: r)
            got = [b.next() for _ in range(10)]
            assert got == [min(cap, base * 2 ** n) * (0.5 + r / 2) for n in range(10)]
    b = Backoff(0.2, 2.0, rng=lambda: 0.0)
    assert [b.next(0.3), b.next(0.3), b.next(None)] == [0.3, 0.3, 0.4]  # floor, then the plain delay


def test_operator_request_schedule_replaces_with_retry_after() -> None:
    """The operator's API client: base * 2**attempt uncapped, times [1.0, 1.2); a Retry-After is used
    instead (jittered too), and still counts as an attempt."""
    b = Backoff(0.5, math.inf, jitter=(1.0, 1.2), retry_after="replace", rng=lambda: 0.5)
    assert b.next() == 0.5 * 1.1
    assert b.next(0.0) == 0.0  # Retry-After: 0 means at once
    assert b.next(3.0) == 3.0 * 1.1
    assert b.next() == 0.5 * 8 * 1.1


def test_work_queue_schedule_has_no_jitter_and_takes_the_count() -> None:
    """The operator's work queue: min(max, base * 2**(n-1)) for the n-th failure of a key, Retry-After
    as a floor, no jitter (the random source is not even called)."""

    def no_rng() -> float:
        raise AssertionError("no jitter was asked for")

    b = Backoff(1.0, 60.0, jitter=(1.0, 1.0), rng=no_rng)
    assert [b.delay(n) for n in range(1, 9)] == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0]
    assert b.delay(1, 5.0) == 5.0 and b.delay(4, 5.0) == 8.0
    assert b.delay(10_000) == 60.0  # a key failing for days does not overflow
    assert b.failures == 0  # delay() keeps no count
