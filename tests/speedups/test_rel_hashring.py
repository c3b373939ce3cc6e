"""F15 (reliability plan U13/RT1): the hash ring moves at most 1.2/N of 100k keys when N changes by one.

The ring as the router builds it for session affinity (``routing.RING_VNODES`` points per node;
the ring's default of 150 missed once: 8 -> 9 nodes moved 1.204/N), 100,000 session keys. Adding a node
(N -> N+1) may move only keys onto the new node, at most 1.2/(N+1) of them; removing one (N -> N-1)
only the removed node's keys, at most 1.2/N. Figures: the fraction moved against the ideal 1/N.
"""

from __future__ import annotations

from types import ModuleType

import pytest

from flexinfer.proxy.routing import RING_VNODES
from tests.proxy._rel import figure
from tests.speedups.test_hashring import fleet

KEYS = [f"session-{i}" for i in range(100_000)]


def remap(hashring: ModuleType, n: int) -> tuple[float, float]:
    nodes = fleet(n + 1)
    ring = hashring.HashRing(nodes[:n], vnodes=RING_VNODES)
    before = [ring.get(k) for k in KEYS]
    ring.add(nodes[n])  # N -> N+1
    grown = [ring.get(k) for k in KEYS]
    moved_add = sum(1 for a, b in zip(before, grown, strict=True) if a != b)
    assert all(b == nodes[n] for a, b in zip(before, grown, strict=True) if a != b)  # only onto the new node
    ring.remove(nodes[n])
    assert [ring.get(k) for k in KEYS] == before  # and back
    victim = nodes[n // 2]
    ring.remove(victim)  # N -> N-1
    moved_rm = 0
    for a, k in zip(before, KEYS, strict=True):
        if ring.get(k) != a:
            assert a == victim  # only the removed node's keys
            moved_rm += 1
    add_frac, rm_frac = moved_add / len(KEYS), moved_rm / len(KEYS)
    figure("F15", impl=hashring.__name__.rsplit(".", 1)[-1], n=n, keys=len(KEYS), moved_add_pct=add_frac * 100,
           bound_add_pct=120 / (n + 1), moved_remove_pct=rm_frac * 100, bound_remove_pct=120 / n)
    return add_frac * (n + 1), rm_frac * n  # in units of the ideal 1/N


@pytest.mark.parametrize("n", [3, 10])
def test_remap_ci(hashring: ModuleType, n: int) -> None:
    add, rm = remap(hashring, n)
    assert add <= 1.2 and rm <= 1.2, (add, rm)


@pytest.mark.reliability
@pytest.mark.parametrize("n", [2, 4, 5, 8, 16, 32, 40])
def test_remap_full(hashring: ModuleType, n: int) -> None:
    add, rm = remap(hashring, n)
    assert add <= 1.2 and rm <= 1.2, (add, rm)
