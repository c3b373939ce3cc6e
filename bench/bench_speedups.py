"""Benchmarks: each compiled speedup against its Python twin, in the same run (pytest-benchmark).

Run: ``.venv/bin/python -m pytest bench/bench_speedups.py --benchmark-only -p no:cacheprovider``
(add ``--benchmark-json=out.json`` to keep the numbers). Every case runs on ``py`` then ``c``;
the ``c`` run prints the per-operation times and the ratio, and stores them in
``extra_info`` (``per_op_ns``, ``speedup_vs_py``). Targets: ring lookup and bucket take
>= 10x faster compiled; chained hashes of a 220 KB prompt <= 50 µs compiled; the shmstate
cases (shared-memory buckets, counts, prefix hints) only report. The CI gate
(>= 3x, ratio only) is ``tests/speedups/test_speedup_gate.py``; this file only reports.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest

from flexinfer import _speedups

KEYS = [f"session-{i:05d}-{i * 7919 % 10007}" for i in range(1000)]
NODES = [f"10.0.{i // 200}.{i % 200 + 1}:8000" for i in range(16)]
PROMPT = ("You are a helpful assistant. Answer briefly and cite sources. " * 4000)[:220_000]
PROMPT_CJK = ("你是一个乐于助人的助手。请简短回答并注明出处。" * 10000)[:220_000]


def ring_get(mod: ModuleType) -> tuple[Callable[[], Any], int]:
    get = mod.HashRing(NODES).get
    return (lambda: [get(k) for k in KEYS]), len(KEYS)


def ring_get_bounded(mod: ModuleType) -> tuple[Callable[[], Any], int]:
    ring = mod.HashRing(NODES)
    loads = {node: i % 7 for i, node in enumerate(NODES)}
    get_bounded = ring.get_bounded
    return (lambda: [get_bounded(k, loads) for k in KEYS[:200]]), 200


def bucket_take_now(mod: ModuleType) -> tuple[Callable[[], Any], int]:
    take = mod.TokenBucket(1e12, 1e12, now=0.0).take
    times = [i * 1e-4 for i in range(1000)]
    return (lambda: [take(1.0, t) for t in times]), len(times)


def bucket_take_clock(mod: ModuleType) -> tuple[Callable[[], Any], int]:
    take = mod.TokenBucket(1e12, 1e12).take  # default clock: time.monotonic
    return (lambda: [take() for _ in range(1000)]), 1000


def registry_take(mod: ModuleType) -> tuple[Callable[[], Any], int]:
    take = mod.BucketRegistry(1e12, 1e12).take
    keys = KEYS[:100] * 10
    return (lambda: [take(k) for k in keys]), len(keys)


def prefix_ascii(mod: ModuleType) -> tuple[Callable[[], Any], int]:
    fn = mod.chained_block_hashes
    return (lambda: fn(PROMPT)), 1


def prefix_cjk(mod: ModuleType) -> tuple[Callable[[], Any], int]:
    fn = mod.chained_block_hashes
    return (lambda: fn(PROMPT_CJK)), 1


# shmstate: one process over a bytearray, lock=None (a multiprocessing.Lock adds its own
# acquire/release to every pure-twin take; the compiled twin never takes it)
EPS = [f"10.0.0.{i}:8000" for i in range(1, 17)]


def shm_take_now(mod: ModuleType) -> tuple[Callable[[], Any], int]:
    take = mod.SharedBuckets(bytearray(mod.SharedBuckets.size(1024)), 1024).take
    pairs = [(KEYS[i % 100], i) for i in range(1000)]
    return (lambda: [take(k, 1e9, 1e9, 1.0, t) for k, t in pairs]), len(pairs)


def shm_take_clock(mod: ModuleType) -> tuple[Callable[[], Any], int]:
    take = mod.SharedBuckets(bytearray(mod.SharedBuckets.size(1024)), 1024).take
    keys = KEYS[:100] * 10
    return (lambda: [take(k, 1e9, 1e9) for k in keys]), len(keys)


def shm_available(mod: ModuleType) -> tuple[Callable[[], Any], int]:
    b = mod.SharedBuckets(bytearray(mod.SharedBuckets.size(1024)), 1024)
    for k in KEYS[:100]:
        b.take(k, 10.0, 5.0, 1.0, 0)
    available = b.available
    keys = KEYS[:100] * 10
    return (lambda: [available(k, 10.0, 5.0, 1) for k in keys]), len(keys)


def _counts(mod: ModuleType) -> Any:
    c = mod.SharedCounts(bytearray(mod.SharedCounts.size(256, 8)), 256, 8, 3)
    for ep in EPS:
        c.acquire(ep)
    return c


def shm_acquire(mod: ModuleType) -> tuple[Callable[[], Any], int]:
    acquire = _counts(mod).acquire
    keys = EPS * 64
    return (lambda: [acquire(k) for k in keys]), len(keys)


def shm_release(mod: ModuleType) -> tuple[Callable[[], Any], int]:
    release = _counts(mod).release
    keys = EPS * 64
    return (lambda: [release(k) for k in keys]), len(keys)


def shm_get(mod: ModuleType) -> tuple[Callable[[], Any], int]:
    get = _counts(mod).get
    keys = EPS * 64
    return (lambda: [get(k) for k in keys]), len(keys)


def shm_loads(mod: ModuleType) -> tuple[Callable[[], Any], int]:
    loads = _counts(mod).loads
    return (lambda: [loads(EPS) for _ in range(64)]), 64


def _prefixes(mod: ModuleType) -> tuple[Any, list[int]]:
    p = mod.SharedPrefixes(bytearray(mod.SharedPrefixes.size(4096)), 4096)
    hashes = _speedups.chained_block_hashes(PROMPT)  # 128 blocks
    for ep in range(1, 9):
        p.record(ep, hashes)
    return p, hashes


def shm_match_len(mod: ModuleType) -> tuple[Callable[[], Any], int]:
    p, hashes = _prefixes(mod)
    match_len = p.match_len
    return (lambda: [match_len(ep, hashes) for ep in range(1, 17)]), 16


def shm_record(mod: ModuleType) -> tuple[Callable[[], Any], int]:
    p, hashes = _prefixes(mod)  # all present already: the steady state of a repeated prompt
    record = p.record
    return (lambda: [record(ep, hashes) for ep in range(1, 9)]), 8


CASES: dict[str, tuple[str, Callable[[ModuleType], tuple[Callable[[], Any], int]], str]] = {
    "ring.get": ("hashring", ring_get, ">= 10x"),
    "ring.get_bounded": ("hashring", ring_get_bounded, "-"),
    "bucket.take(now)": ("tokenbucket", bucket_take_now, ">= 10x"),
    "bucket.take()": ("tokenbucket", bucket_take_clock, ">= 10x"),
    "registry.take()": ("tokenbucket", registry_take, "-"),
    "prefix 220KB ascii": ("prefixhash", prefix_ascii, "<= 50 us (c)"),
    "prefix 220KB cjk": ("prefixhash", prefix_cjk, "<= 50 us (c)"),
    "shm buckets.take(now)": ("shmstate", shm_take_now, "-"),
    "shm buckets.take()": ("shmstate", shm_take_clock, "-"),
    "shm buckets.available": ("shmstate", shm_available, "-"),
    "shm counts.acquire": ("shmstate", shm_acquire, "-"),
    "shm counts.release": ("shmstate", shm_release, "-"),
    "shm counts.get": ("shmstate", shm_get, "-"),
    "shm counts.loads(16)": ("shmstate", shm_loads, "-"),
    "shm prefixes.match_len(128)": ("shmstate", shm_match_len, "-"),
    "shm prefixes.record(128)": ("shmstate", shm_record, "-"),
}
_PER_OP: dict[tuple[str, str], float] = {}


def _load(name: str, impl: str) -> ModuleType:
    try:
        return _speedups.load(name, impl)
    except ImportError as exc:
        pytest.skip(f"{name}_{impl} not available ({exc}); run `make ext`")


@pytest.mark.parametrize(("case", "impl"), [(case, impl) for case in CASES for impl in ("py", "c")])
def test_speedup(benchmark: Any, capsys: pytest.CaptureFixture[str], case: str, impl: str) -> None:
    name, build, target = CASES[case]
    fn, ops = build(_load(name, impl))
    benchmark.group = case
    benchmark.extra_info["impl"] = impl
    benchmark(fn)
    if benchmark.stats is None:  # --benchmark-disable
        return
    per_op = benchmark.stats.stats.min / ops
    _PER_OP[(case, impl)] = per_op
    benchmark.extra_info["per_op_ns"] = per_op * 1e9
    py = _PER_OP.get((case, "py"))
    if impl == "c" and py:
        ratio = py / per_op
        benchmark.extra_info["speedup_vs_py"] = ratio
        with capsys.disabled():
            print(
                f"\n{case:20s} py {py * 1e9:10.0f} ns   c {per_op * 1e9:9.0f} ns   "
                f"speedup {ratio:5.1f}x   target {target}"
            )


if __name__ == "__main__":  # `python bench/bench_speedups.py` (pytest does not collect bench_*.py)
    import sys

    raise SystemExit(pytest.main([__file__, "--benchmark-only", "-p", "no:cacheprovider", *sys.argv[1:]]))
