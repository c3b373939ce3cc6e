"""The compiled twins give exactly the reference twins' answers (floats compared with ==)."""

from __future__ import annotations

import math
import random
from types import ModuleType
from typing import Any

import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

SETTINGS = settings(
    deadline=None, max_examples=80, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
Twins = dict[str, tuple[ModuleType, ModuleType]]

names = st.sampled_from([f"10.0.0.{i}:8000" for i in range(12)] + ["é-node", "a", "b\ud800", ""])
keys = st.one_of(st.text(max_size=30), st.binary(max_size=30))


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@SETTINGS
@given(
    vnodes=st.integers(1, 40),
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("add"), names),
            st.tuples(st.just("remove"), names),
            st.tuples(st.just("set"), st.lists(names, max_size=8)),
        ),
        max_size=12,
    ),
    probe=st.lists(keys, min_size=1, max_size=20),
    loads=st.lists(st.integers(0, 50), min_size=16, max_size=16),
    epsilon=st.sampled_from([0.0, 0.05, 0.25, 0.5, 2.0]),
)
def test_hashring_twins_agree(
    twins: Twins, vnodes: int, ops: list[Any], probe: list[Any], loads: list[int], epsilon: float
) -> None:
    py, c = (m.HashRing(vnodes=vnodes) for m in twins["hashring"])
    for op, arg in ops:
        if op == "add":
            assert py.add(arg) == c.add(arg)
        elif op == "remove":
            assert py.remove(arg) == c.remove(arg)
        else:
            assert py.set_nodes(arg) == c.set_nodes(arg)
        assert py.nodes == c.nodes and len(py) == len(c)
        mapping = {node: loads[i] for i, node in enumerate(py.nodes)}
        seq = [loads[i] for i in range(len(py.nodes))]
        boundary = [f"{i}:{n}" for n in py.nodes for i in range(min(vnodes, 3))]
        for key in [*probe, *boundary]:
            assert py.get(key) == c.get(key)
            assert py.get_bounded(key, mapping, epsilon) == c.get_bounded(key, mapping, epsilon)
            assert py.get_bounded(key, seq, epsilon) == c.get_bounded(key, seq, epsilon)


@SETTINGS
@given(data=keys)
def test_ring_hash_twins_agree(twins: Twins, data: Any) -> None:
    py, c = twins["hashring"]
    assert py.ring_hash(data) == c.ring_hash(data)


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


@SETTINGS
@given(
    rate=st.floats(0.0, 1e4),
    burst=st.floats(0.001, 1e4),
    ops=st.lists(st.tuples(st.floats(0.0, 100.0), st.floats(-5.0, 50.0), st.booleans()), max_size=60),
)
def test_tokenbucket_twins_agree(twins: Twins, rate: float, burst: float, ops: list[Any]) -> None:
    py_mod, c_mod = twins["tokenbucket"]
    clock = Clock()
    py = py_mod.TokenBucket(rate, burst, clock=clock)
    c = c_mod.TokenBucket(rate, burst, clock=clock)
    for n, dt, explicit in ops:
        clock.t += dt
        if explicit:
            a, b = py.take(n, clock.t), c.take(n, now=clock.t)
        else:
            a, b = py.take(n), c.take(n)
        assert _same(a, b)
        assert py.tokens == c.tokens and py.last == c.last
        assert py.available(clock.t + 1.0) == c.available(clock.t + 1.0)


@SETTINGS
@given(
    max_keys=st.integers(1, 5),
    idle_ttl=st.sampled_from([0.5, 3.0, 1e9]),
    ops=st.lists(
        st.tuples(st.integers(0, 8), st.floats(0.0, 4.0), st.floats(-1.0, 3.0), st.booleans()), max_size=80
    ),
)
def test_bucket_registry_twins_agree(twins: Twins, max_keys: int, idle_ttl: float, ops: list[Any]) -> None:
    py_mod, c_mod = twins["tokenbucket"]
    clock = Clock()
    py = py_mod.BucketRegistry(2.0, 4.0, max_keys=max_keys, idle_ttl=idle_ttl, clock=clock)
    c = c_mod.BucketRegistry(2.0, 4.0, max_keys=max_keys, idle_ttl=idle_ttl, clock=clock)
    for key, n, dt, explicit in ops:
        clock.t += dt
        if explicit:
            a, b = py.take(key, n, clock.t), c.take(key, n, now=clock.t)
        else:
            a, b = py.take(key, n), c.take(key, n)
        assert _same(a, b)
        assert py.keys() == c.keys()
        for k in range(9):
            assert py.available(k) == c.available(k)


@SETTINGS
@given(
    data=st.one_of(
        st.text(st.characters(codec="utf-8") | st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)),
        st.binary(max_size=600),
    ),
    block_size=st.integers(1, 300),
    max_blocks=st.integers(0, 20),
)
def test_prefixhash_twins_agree(twins: Twins, data: Any, block_size: int, max_blocks: int) -> None:
    py, c = twins["prefixhash"]
    assert py.chained_block_hashes(data, block_size, max_blocks) == c.chained_block_hashes(
        data, block_size, max_blocks
    )


@SETTINGS
@given(length=st.integers(0, 64), seed=st.integers(0, 2**64 - 1), data=st.data())
def test_xxh3_every_short_length_matches_xxhash(twins: Twins, length: int, seed: int, data: Any) -> None:
    _, c = twins["prefixhash"]
    block = data.draw(st.binary(min_size=length, max_size=length))
    assert c.xxh3_64(block, seed) == xxhash.xxh3_64_intdigest(block, seed)


def test_xxh3_all_lengths_to_2100_match_xxhash(twins: Twins) -> None:
    _, c = twins["prefixhash"]
    rng = random.Random(20260401)
    for length in range(2100):
        block = rng.randbytes(length)
        for seed in (0, rng.getrandbits(64)):
            assert c.xxh3_64(block, seed) == xxhash.xxh3_64_intdigest(block, seed), (length, seed)
