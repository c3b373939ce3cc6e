"""SharedPrefixStore.match_lens over a real MachineState: endpoint keys map to their in-flight
slot ids, unknown endpoints read 0, and the batch equals match_len per key."""

from __future__ import annotations

import random

from flexinfer.proxy.machine import MachineState, SharedPrefixStore


def test_shared_store_match_lens() -> None:
    ms = MachineState(2, bucket_slots=8, count_slots=64, prefix_sets=1024)
    w0, w1 = ms.bind(0), ms.bind(1)
    s0 = SharedPrefixStore(w0.prefixes, w0.counts)
    s1 = SharedPrefixStore(w1.prefixes, w1.counts)  # another worker's view of the same table
    r = random.Random(3)
    head = [r.getrandbits(64) for _ in range(6)]
    a = head + [r.getrandbits(64) for _ in range(5)]
    s0.record("a:1", a)
    s0.record("b:1", head[:4])
    keys = ["a:1", "b:1", "unknown:1", "a:1"]
    assert s1.match_lens(keys, a) == [11, 4, 0, 11]
    assert s1.match_lens(keys, a) == [s1.match_len(k, a) for k in keys]
    assert s1.match_lens(keys, []) == [0, 0, 0, 0] and s1.match_lens([], a) == []
    assert s1.match_lens(["unknown:1"], a) == [0]
    s1.forget("a:1")
    assert s0.match_lens(keys, a) == [0, 4, 0, 0]
    for w in (w0, w1):
        w.buckets.close()
        w.counts.close()
        w.prefixes.close()
