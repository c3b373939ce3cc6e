"""``SharedBuckets.charge`` (the post-response charge of token limits) on both twins: debt makes the
next ``take`` wait, refunds never make a bucket fuller than full, one charge is capped at one burst
of debt, bad ``n`` is refused, the twins agree (results and buffer bytes) on random mixes of
``take``/``charge``/``available``, and two forked processes charging one key lose no charge."""

from __future__ import annotations

import math
import mmap
import multiprocessing
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .conftest import load

SETTINGS = settings(deadline=None, max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])
S = 1_000_000_000
CTX = multiprocessing.get_context("fork")


@pytest.fixture
def shm(impl: str) -> ModuleType:
    return load("shmstate", impl)


def buckets(shm: ModuleType, slots: int = 8) -> Any:
    return shm.SharedBuckets(bytearray(shm.SharedBuckets.size(slots)), slots)


def test_debt_makes_the_next_take_wait(shm: ModuleType) -> None:
    b = buckets(shm)
    rate, burst = 10.0, 100.0  # 10 tokens/s, 100 burst
    assert b.take("k", rate, burst, 10.0, S) == 0.0  # 90 left
    # 150 tokens charged after the fact: 90 - 150 = -60, i.e. 6 s of debt
    assert b.charge("k", rate, burst, 150.0, S) == pytest.approx(6.0)
    assert b.available("k", rate, burst, S) == 0.0
    assert b.take("k", rate, burst, 0.0, S) == pytest.approx(6.0)  # even a free request waits
    assert b.take("k", rate, burst, 1.0, S) == pytest.approx(6.1)
    assert b.take("k", rate, burst, 1.0, 7 * S + S // 10) == 0.0  # paid off, 1 token there
    b.close()


def test_refund_never_fills_past_full(shm: ModuleType) -> None:
    b = buckets(shm)
    buf_before = bytes(b._raw) if hasattr(b, "_raw") else None  # the py twin exposes its view
    assert b.charge("k", 1.0, 5.0, -3.0, S) == 0.0  # a refund to a full (new) bucket: no write
    assert b.available("k", 1.0, 5.0, S) == 5.0
    if buf_before is not None:
        assert bytes(b._raw)[8:16] == buf_before[8:16]  # TAT untouched
    assert b.take("k", 1.0, 5.0, 4.0, S) == 0.0
    assert b.charge("k", 1.0, 5.0, -10.0, S) == 0.0  # more refund than taken: full, not fuller
    assert b.available("k", 1.0, 5.0, S) == 5.0
    assert b.take("k", 1.0, 5.0, 5.0, S) == 0.0
    assert b.take("k", 1.0, 5.0, 1.0, S) == pytest.approx(1.0)
    b.close()


def test_one_charge_is_capped_at_one_burst_of_debt(shm: ModuleType) -> None:
    b = buckets(shm)
    assert b.charge("k", 2.0, 10.0, 1e300, S) == pytest.approx(5.0)  # debt capped at burst: 10/2 s
    assert b.charge("k", 2.0, 10.0, 1e300, S) == pytest.approx(5.0)  # and stays capped
    assert b.take("k", 2.0, 10.0, 0.0, S) == pytest.approx(5.0)
    assert b.charge("k", 2.0, 10.0, -1e300, S) == 0.0  # a refund as large: full again
    assert b.available("k", 2.0, 10.0, S) == 10.0
    b.close()


def test_charge_validation(shm: ModuleType) -> None:
    b = buckets(shm)
    for bad in (math.nan, math.inf, -math.inf):
        with pytest.raises(ValueError):
            b.charge("k", 1.0, 1.0, bad, S)
    with pytest.raises(ValueError):
        b.charge("k", 0.0, 1.0, 1.0, S)
    with pytest.raises(ValueError):
        b.charge("k", 1.0, 1.0, 1.0, -1)
    with pytest.raises(TypeError):
        b.charge(1, 1.0, 1.0, 1.0, S)
    with pytest.raises(TypeError):
        b.charge("k", 1.0, 1.0, "1", S)
    b.close()


def test_charge_on_a_full_table(shm: ModuleType) -> None:
    b = buckets(shm, 1)
    b.charge("a", 1.0, 5.0, 1.0, S)  # busy: a's TAT is ahead of now
    with pytest.raises(shm.TableFull):
        b.charge("b", 1.0, 5.0, 1.0, S)
    b.close()


KEYS = ["a", "b", "é", "", "tokens:key:0123456789abcdef"]
LIMITS = [(1.0, 1.0), (3.0, 2.0), (100.0, 20.0), (0.7, 5.5), (1e6, 3.0), (1000.0 / 60, 1000.0), (0.1, 1e-3)]


def outcome(fn: Callable[..., Any], *args: Any) -> tuple[str, Any]:
    try:
        return "ok", fn(*args)
    except Exception as exc:  # the exception's type is part of the contract
        return "err", type(exc).__name__


@SETTINGS
@given(
    slots=st.integers(1, 5),
    ops=st.lists(
        st.tuples(
            st.integers(0, 1),
            st.sampled_from(["take", "charge", "available"]),
            st.integers(0, len(KEYS) - 1),
            st.integers(0, len(LIMITS) - 1),
            st.one_of(st.floats(-3000.0, 3000.0), st.sampled_from([0.0, 1.0, -1.0, 1e300, -1e300, math.nan, math.inf])),
            st.one_of(st.integers(-2 * S, 3 * S), st.sampled_from([0, S // 4, S, -S // 4])),
        ),
        max_size=60,
    ),
)
def test_charge_twins_agree(slots: int, ops: list[Any]) -> None:
    pair = (load("shmstate", "py"), load("shmstate", "c"))
    bufs = [bytearray(m.SharedBuckets.size(slots)) for m in pair]
    views = [[m.SharedBuckets(buf, slots) for _ in range(2)] for m, buf in zip(pair, bufs, strict=True)]
    t = 10 * S
    for who, op, k, lim, n, dt in ops:
        t = max(0, t + dt)
        rate, burst = LIMITS[lim]
        if op == "take":
            got = [outcome(v[who].take, KEYS[k], rate, burst, n, t) for v in views]
        elif op == "charge":
            got = [outcome(v[who].charge, KEYS[k], rate, burst, n, t) for v in views]
        else:
            got = [outcome(v[who].available, KEYS[k], rate, burst, t) for v in views]
        assert got[0] == got[1], (op, KEYS[k], rate, burst, n, t)
        assert bufs[0] == bufs[1]
    for v in views:
        for x in v:
            x.close()


@pytest.fixture
def shared() -> Iterator[Callable[[int], mmap.mmap]]:
    maps: list[mmap.mmap] = []

    def make(size: int) -> mmap.mmap:
        maps.append(mmap.mmap(-1, size))
        return maps[-1]

    yield make
    for m in maps:
        m.close()


def test_two_processes_charging_one_key_lose_nothing(shm: ModuleType, shared: Callable[[int], mmap.mmap]) -> None:
    """Two children charge one key 20 000 times each at one fixed now: the debt is the exact sum (a
    read-modify-write that is not atomic loses charges: checked by removing the lock / CAS)."""
    rate, burst, each, slots = 1.0, 1e6, 20_000, 16  # 1 token = 1 s = 1e9 ns, cap far away
    m = shared(shm.SharedBuckets.size(slots))
    lock, go = CTX.Lock(), CTX.Event()

    def child() -> None:
        with shm.SharedBuckets(m, slots, lock) as b:
            assert go.wait(60)
            charge = b.charge
            for _ in range(each):
                charge("k", rate, burst, 1.0, S)

    procs = [CTX.Process(target=child) for _ in range(2)]
    for p in procs:
        p.start()
    go.set()
    for p in procs:
        p.join(90)
        assert p.exitcode == 0
        p.close()
    with shm.SharedBuckets(m, slots, lock) as parent:
        assert parent.available("k", rate, burst, now_ns=S) == burst - 2 * each
