"""Benchmarks: the ``scored`` scheduler's cost per request (pytest-benchmark; reported, not asserted).

Run: ``.venv/bin/python -m pytest bench/bench_scheduler.py --benchmark-only -p no:cacheprovider``
(or ``python bench/bench_scheduler.py``; add ``--benchmark-json=out.json`` to keep the numbers).
The issue's budget: <= 15 us per ``choose()`` with 16 endpoints and 4 plugins. Cases (16 endpoints,
the least-request filter, scores least-request + least-latency + kv-cache + prefix-cache unless said):

- ``4-plugins/prefix-store``: ``choose`` (plugin by plugin, with a :class:`Decision`: the path of
  custom chains, and of ``/debug`` rebuilding a decision) with the router's :class:`PrefixStore`.
- ``4-plugins/batched-hints``: hints that answer ``match_lens`` in one call from a table: the
  scheduler's own cost, apart from the store's.
- ``4-plugins/weighted-random``: as above, top 3, weighted-random pick.
- ``kthena-default``: the default chain (least-request, least-latency, prefix-cache; PrefixStore).
- ``fused/4-plugins``: the same chain as the router runs it (``Scheduler.choose_index``: the
  built-in plugins in one compiled call, no :class:`Decision`; the prefix store is real).
- ``router-pick/...``: the whole ``Router.pick`` of a ``scored`` model as a request pays it (engine
  columns, in-flight counts, the prompt's block hashes, session key, the chain, recording the
  prefix blocks).
- ``header``: the opt-in explain header of one decision.

Each case prints its per-call time (the minimum round) and stores it in ``extra_info["per_op_us"]``.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

import pytest

from flexinfer._speedups import chained_block_hashes
from flexinfer.proxy.enginemetrics import EngineState
from flexinfer.proxy.routing import PrefixStore, Router
from flexinfer.proxy.scheduler import Candidate, Columns, Request, parse_config
from flexinfer.runtime.base import Endpoint, ModelView

N = 16
KEYS = [f"10.0.{i // 200}.{i % 200 + 1}:8000" for i in range(N)]
SYSTEM = "You are a helpful assistant. Answer briefly and cite sources. " * 200
HASHES = chained_block_hashes(SYSTEM, 64, 128, packed=True)  # as the router makes them
FOUR = "least-request,least-latency,kv-cache,prefix-cache;filters=least-request"


def _cands() -> list[Candidate]:
    # varied state: 2 of 16 over the waiting limit, one with stale (unknown) engine metrics
    out = []
    for i, k in enumerate(KEYS):
        stale = i == 5
        out.append(Candidate(k, i % 5, waiting=None if stale else float(i % 12),
                             running=None if stale else float(i % 4), kv_usage=None if stale else (i * 37 % 100) / 100,
                             ttft_s=None if stale else 0.1 + i * 0.013, tpot_s=None if stale else 0.02 + (i % 3) * 0.005,
                             adapters=None))
    return out


def _store() -> PrefixStore:
    store = PrefixStore()
    for i, k in enumerate(KEYS):
        store.record(k, HASHES[: (i * 9) % len(HASHES)])
    return store


class _Table:
    """Prefix hints answering every candidate in one call from a precomputed table."""

    def __init__(self, store: PrefixStore) -> None:
        self.lens = {k: store.match_len(k, HASHES) for k in KEYS}

    def match_len(self, ep: str, hashes: list[int]) -> int:
        return self.lens.get(ep, 0)

    def match_lens(self, keys: list[str], hashes: list[int]) -> list[int]:
        get = self.lens.get
        return [get(k, 0) for k in keys]


def _choose(spec: str, hints: Any) -> Callable[[], Any]:
    sched = parse_config(spec, prefix_hints=hints, rng=random.Random(1))
    req, cols = Request("m", prefix_hashes=HASHES), Columns.of(_cands())
    return lambda: sched.choose(req, cols)


def _fused(spec: str) -> Callable[[], Any]:
    """The router's path for a chain of built-in plugins: one compiled call (``choose_index``)."""
    store = _store()
    sched = parse_config(spec, prefix_hints=store)
    cols = Columns.of(_cands())
    engine = (cols.waiting, cols.running, cols.kv, cols.ttft, cols.tpot, cols.adapters)
    keys, in_flight = cols.keys, cols.in_flight
    return lambda: sched.choose_index(HASHES, keys, in_flight, engine)


class _Headers(dict[bytes, bytes]):
    pass


def _router_pick(spec: str | None) -> Callable[[], Any]:
    """The whole ``scored`` pick as a request pays it: columns from the scraper's states (cached),
    the machine's in-flight counts, the prompt's block hashes, the session key, the chain, and
    recording the pick's blocks in the prefix store."""
    cands = _cands()
    states = {c.key: EngineState(c.waiting, c.running, c.kv_usage, c.ttft_s, c.tpot_s, "vllm", time.monotonic())
              for c in cands if c.waiting is not None}
    router = Router()
    router.engine_state = states.get
    view = ModelView("m", tuple(Endpoint.parse(k) for k in KEYS), routing="scored", scheduler=spec)
    for i, k in enumerate(KEYS):
        router.prefixes.record(k, HASHES[: (i * 9) % len(HASHES)])
        for _ in range(i % 5):
            router.load.acquire(k)
    data = {"model": "m", "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hi"}]}
    headers = _Headers()
    pick = router.pick
    return lambda: pick(view, data, headers)


def _header() -> Callable[[], Any]:
    d = _choose(FOUR, _store())()
    return d.header


CASES: dict[str, Callable[[], Callable[[], Any]]] = {
    "4-plugins/prefix-store": lambda: _choose(FOUR, _store()),
    "4-plugins/batched-hints": lambda: _choose(FOUR, _Table(_store())),
    "4-plugins/weighted-random": lambda: _choose(FOUR + ";top=3;pick=weighted-random", _Table(_store())),
    "kthena-default": lambda: _choose("least-request,least-latency,prefix-cache;filters=least-request", _store()),
    "fused/4-plugins": lambda: _fused(FOUR),
    "router-pick/4-plugins": lambda: _router_pick(FOUR),
    "router-pick/kthena-default": lambda: _router_pick(None),
    "header": _header,
}


@pytest.mark.parametrize("case", list(CASES))
def test_scheduler(benchmark: Any, capsys: pytest.CaptureFixture[str], case: str) -> None:
    fn = CASES[case]()
    benchmark.group = "scheduler"
    benchmark(fn)
    if benchmark.stats is None:  # --benchmark-disable
        return
    per_op = benchmark.stats.stats.min
    benchmark.extra_info["per_op_us"] = per_op * 1e6
    with capsys.disabled():
        print(f"\n{case:28s} {per_op * 1e6:8.2f} us per call (min; budget 15 us for choose, 16 endpoints, 4 plugins)")


if __name__ == "__main__":  # `python bench/bench_scheduler.py` (pytest does not collect bench_*.py)
    import sys

    raise SystemExit(pytest.main([__file__, "--benchmark-only", "-p", "no:cacheprovider", *sys.argv[1:]]))
