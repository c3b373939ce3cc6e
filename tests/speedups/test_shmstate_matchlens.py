"""SharedPrefixes.match_lens on both twins: the one-walk batch equals match_len per id while no
block is missing, is the exact (shorter) longest fully recorded prefix with a hole, validates
like match_len, and the twins agree on random histories (results and buffer bytes)."""

from __future__ import annotations

import random
from array import array
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .conftest import load

SETTINGS = settings(deadline=None, max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture
def shm(impl: str) -> ModuleType:
    return load("shmstate", impl)


@pytest.fixture
def pair() -> tuple[ModuleType, ModuleType]:
    return load("shmstate", "py"), load("shmstate", "c")


def prefixes(shm: ModuleType, sets: int = 1024) -> Any:
    return shm.SharedPrefixes(bytearray(shm.SharedPrefixes.size(sets)), sets)


def chain(seed: int, n: int) -> list[int]:
    r = random.Random(seed)
    return [r.getrandbits(64) for _ in range(n)]


def test_match_lens_equals_match_len_without_holes(shm: ModuleType) -> None:
    p = prefixes(shm)
    head = chain(1, 10)
    convs = {ep: head[:ep] + chain(100 + ep, ep) for ep in range(1, 8)}  # <= 8 ids share a hash (one set)
    for ep, hs in convs.items():
        p.record(ep, hs)
    ids = [*range(1, 8), 77, 3]
    for ep, hs in convs.items():
        want = [p.match_len(i, hs) for i in ids]
        assert p.match_lens(ids, hs) == want
        assert want[ep - 1] == len(hs)
        assert p.match_lens(tuple(ids), tuple(hs)) == want
    assert p.match_lens([], head) == [] and p.match_lens([1, 2], []) == [0, 0]


def test_match_lens_stops_at_a_hole(shm: ModuleType) -> None:
    p = prefixes(shm)
    hs = chain(2, 8)
    p.record(4, hs[:3] + hs[4:])  # block 3 missing
    assert p.match_lens([4], hs) == [3]
    assert p.match_len(4, hs) >= 3  # the binary search may land past the hole


def test_match_lens_validation(shm: ModuleType) -> None:
    p = prefixes(shm, 2)
    for ep in (0, 65536, -1):
        with pytest.raises(ValueError):
            p.match_lens([1, ep], [1])
    for h in (-1, 1 << 64):
        with pytest.raises(OverflowError):
            p.match_lens([1], [h])
    with pytest.raises(TypeError):
        p.match_lens([1], [1.0])
    with pytest.raises(TypeError):
        p.match_lens([1.0], [1])
    # the walk stops once no id matches: later (bad) hashes are not read
    assert p.match_lens([1], [5 << 20, -1]) == [0]
    p.close()
    with pytest.raises(ValueError):
        p.match_lens([1], [1])


def outcome(fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return ("ok", fn(*args))
    except Exception as exc:  # the twins must fail alike
        return ("err", type(exc).__name__)


@SETTINGS
@given(
    sets=st.sampled_from([1, 2, 4, 64]),
    pool=st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=24),
    ops=st.lists(
        st.tuples(
            st.sampled_from(["record", "match", "forget"]),
            st.lists(st.integers(0, 5), max_size=6),
            st.lists(st.integers(0, 23), max_size=12),
        ),
        max_size=40,
    ),
)
def test_match_lens_twins_agree(pair: tuple[ModuleType, ModuleType], sets: int, pool: list[int],
                                ops: list[Any]) -> None:
    bufs = [bytearray(m.SharedPrefixes.size(sets)) for m in pair]
    views = [m.SharedPrefixes(buf, sets) for m, buf in zip(pair, bufs, strict=True)]
    for op, eps, picks in ops:
        hashes = [pool[i % len(pool)] for i in picks]
        if op == "record":
            got = [outcome(v.record, eps[0] if eps else 1, hashes) for v in views]
        elif op == "forget":
            got = [outcome(v.forget, eps[0] if eps else 1) for v in views]
        else:
            got = [outcome(v.match_lens, eps, hashes) for v in views]
        assert got[0] == got[1]
        assert bufs[0] == bufs[1]
        ids = [e for e in eps if e]
        for v in views:  # on any history: never longer than match_len, and exactly the first hole
            lens = v.match_lens(ids, hashes)
            for e, n in zip(ids, lens, strict=True):
                assert n <= v.match_len(e, hashes)
                assert all(v.match_len(e, [h]) for h in hashes[:n])
                assert n == len(hashes) or not v.match_len(e, [hashes[n]])


@SETTINGS
@given(seed=st.integers(0, 10_000), n_ids=st.integers(1, 70), sets=st.sampled_from([1, 2, 64]))
def test_packed_hashes_give_the_same_answers_and_table(pair: tuple[ModuleType, ModuleType], seed: int,
                                                       n_ids: int, sets: int) -> None:
    """Block hashes as array('Q') (what the router hands over) and as lists: the same matches and
    the same table bytes, on both twins; over 64 ids the compiled twin leaves its bitmask walk."""
    r = random.Random(seed)
    head = chain(seed, 12)
    records = [(r.randrange(1, n_ids + 1), head[: r.randrange(0, 13)] + chain(seed + i, r.randrange(0, 4)))
               for i in range(20)]
    ids = [r.randrange(1, n_ids + 1) for _ in range(n_ids)]
    tables = []
    for mod in pair:
        for packed in (False, True):
            p = prefixes(mod, sets)
            for ep, hs in records:
                p.record(ep, array("Q", hs) if packed else hs)
            q = array("Q", head) if packed else head
            tables.append((p.match_lens(ids, q), [p.match_len(i, q) for i in ids[:5]]))
    assert all(t == tables[0] for t in tables), tables
