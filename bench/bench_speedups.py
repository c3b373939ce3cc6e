"""Benchmarks: each compiled speedup against its Python twin, in the same run (pytest-benchmark).

Run: ``.venv/bin/python -m pytest bench/bench_speedups.py --benchmark-only -p no:cacheprovider``
(add ``--benchmark-json=out.json`` to keep the numbers). Every case runs on ``py`` then ``c``;
the ``c`` run prints the per-operation times and the ratio, and stores them in
``extra_info`` (``per_op_ns``, ``speedup_vs_py``). Targets: ring lookup and bucket take
>= 10x faster compiled; chained hashes of a 220 KB prompt <= 50 µs compiled. The CI gate
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


CASES: dict[str, tuple[str, Callable[[ModuleType], tuple[Callable[[], Any], int]], str]] = {
    "ring.get": ("hashring", ring_get, ">= 10x"),
    "ring.get_bounded": ("hashring", ring_get_bounded, "-"),
    "bucket.take(now)": ("tokenbucket", bucket_take_now, ">= 10x"),
    "bucket.take()": ("tokenbucket", bucket_take_clock, ">= 10x"),
    "registry.take()": ("tokenbucket", registry_take, "-"),
    "prefix 220KB ascii": ("prefixhash", prefix_ascii, "<= 50 us (c)"),
    "prefix 220KB cjk": ("prefixhash", prefix_cjk, "<= 50 us (c)"),
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
