"""F20: the extender at scale and under generated inputs (reliability plan E2/E3).

- Invariants through ``ExtenderApp.dispatch`` for hypothesis-generated pods and nodes, in both
  request forms (NodeList and NodeNames) and with both NodeList decoders (msgspec fast path and the
  full orjson decode): filtered ⊆ input, passed and failed partition the input, every rejected node
  has a reason, unresolvable ⊆ failed, scores are integers in [0, 10] for exactly the input nodes,
  answers are deterministic (a repeat, served from the facts cache, is byte-identical) and the same
  in every form and decoder.
- The facts cache is keyed by the node's exact JSON: a changed node is parsed again, never stale.
- At 5,000 realistic nodes (bench/bench_extender.py): a repeated NodeList call parses no node again,
  and its CPU time is at most RATIO × the NodeNames call's (same process, same run; no wall clock).
- The facts cache: reordered and subset requests are hits, a planted hash twin with other bytes is
  never served (hits are checked byte for byte), and the malloc tuning takes on glibc.
- Marked ``reliability``: the bench with the extender in its own process, p99 < 100 ms in both forms
  (median server CPU always; CPU p99 and wall p99 when the box was not oversubscribed).
"""

from __future__ import annotations

import contextlib
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import msgspec
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from xxhash import xxh3_128_intdigest

from bench import bench_extender
from flexinfer.scheduler import logic, wire
from flexinfer.scheduler.server import make_app
from flexinfer.scheduler.settings import ExtenderSettings
from tests.scheduler.helpers import make_node, make_pod
from tests.scheduler.test_logic import scenarios

RATIO = 4.0  # NodeList CPU ≤ RATIO × NodeNames CPU at 5,000 nodes (w8-f20: 1.1-1.9 with the walk; 2.6-4.8 before it; ~15-40 before the facts cache)


def _app(nodes: list[dict[str, Any]]) -> Any:
    app = make_app(ExtenderSettings(), "flexinfer-system")
    app.inventory.nodes.replace(nodes)
    return app


@contextlib.contextmanager
def _decoder(fast: bool) -> Iterator[None]:
    old = wire.FAST
    wire.FAST = fast and old
    try:
        yield
    finally:
        wire.FAST = old


def _answers(app: Any, body: bytes) -> tuple[dict[str, Any], list[dict[str, Any]], bytes, bytes]:
    f, s = app.dispatch("POST", "/filter", body), app.dispatch("POST", "/score", body)
    assert f.status == 200 and s.status == 200, (f, s)
    return orjson.loads(f.body), orjson.loads(s.body), f.body, s.body


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(), st.lists(st.sampled_from(["1", "2", ""]), min_size=25, max_size=25))
def test_invariants_in_every_form_and_decoder(sc: tuple[dict, list[dict]], rvs: list[str]) -> None:
    pod, nodes = sc
    for node, rv in zip(nodes, rvs, strict=False):
        if rv:
            node["metadata"]["resourceVersion"] = rv
    names = [n["metadata"]["name"] for n in nodes]
    by_nodes = orjson.dumps({"Pod": pod, "Nodes": {"items": nodes}})
    by_names = orjson.dumps({"Pod": pod, "NodeNames": names})
    seen = []
    for fast in (True, False):
        with _decoder(fast):
            app = _app(nodes)
            for body in (by_nodes, by_names):
                first = _answers(app, body)
                again = _answers(app, body)
                assert first[2:] == again[2:]  # deterministic, also when served from the facts cache
                fres, sres = first[0], first[1]
                passed, failed = fres["NodeNames"], fres["FailedNodes"]
                assert set(passed) <= set(names) and not set(passed) & set(failed)
                assert set(passed) | set(failed) == set(names)
                assert all(isinstance(r, str) and r for r in failed.values())
                assert set(fres["FailedAndUnresolvableNodes"]) <= set(failed)
                if body is by_nodes:
                    assert [n["metadata"]["name"] for n in fres["Nodes"]["items"]] == passed
                    assert all(item in nodes for item in fres["Nodes"]["items"])
                assert [h["Host"] for h in sres] == names
                assert all(isinstance(h["Score"], int) and 0 <= h["Score"] <= 10 for h in sres)
                seen.append((passed, failed, fres["FailedAndUnresolvableNodes"], sres))
    assert all(s == seen[0] for s in seen), "forms or decoders disagree"


def test_facts_cache_is_keyed_by_the_whole_node() -> None:
    app = _app([])
    pod = make_pod(vram_mb=8000)
    node = make_node("n1", free=20000)
    node["metadata"]["resourceVersion"] = "7"
    body = orjson.dumps({"Pod": pod, "Nodes": {"items": [node]}})
    assert orjson.loads(app.dispatch("POST", "/filter", body).body)["NodeNames"] == ["n1"]
    assert app.dispatch("POST", "/filter", body).status == 200
    if wire.FAST:
        assert (app.node_cache.hits, app.node_cache.misses) == (1, 1)
    # the same name and resourceVersion with other content is another node: parsed again, never stale
    node["metadata"]["annotations"]["flexinfer.ai/gpu-free-memory"] = "100"
    res = orjson.loads(app.dispatch("POST", "/filter", orjson.dumps({"Pod": pod, "Nodes": {"items": [node]}})).body)
    assert res["NodeNames"] == [] and "insufficient free VRAM" in res["FailedNodes"]["n1"]


@pytest.mark.skipif(not wire.FAST, reason="the NodeList fast path needs msgspec")
def test_reordered_and_subset_items_are_hits_and_answers_follow_the_request() -> None:
    app = _app([])
    pod = make_pod(vram_mb=8000)
    nodes = [make_node(f"n{i}", free=1000 + 4000 * i) for i in range(6)]  # n0, n1 short of VRAM
    def names(items: list[dict[str, Any]], path: str) -> Any:
        reply = app.dispatch("POST", path, orjson.dumps({"Pod": pod, "Nodes": {"items": items}}))
        assert reply.status == 200
        res = orjson.loads(reply.body)
        return res["NodeNames"] if path == "/filter" else [h["Host"] for h in res]
    assert names(nodes, "/filter") == ["n2", "n3", "n4", "n5"]
    assert app.node_cache.misses == 6
    # another order, a subset, the other verb: every item is known (by position or by hash)
    assert names(nodes[::-1], "/filter") == ["n5", "n4", "n3", "n2"]
    assert names(nodes[2:5], "/score") == ["n2", "n3", "n4"]
    assert names(nodes[1:], "/filter") == ["n2", "n3", "n4", "n5"]
    assert app.node_cache.misses == 6 and app.node_cache.hits == 6 + 3 + 5


@pytest.mark.skipif(not wire.FAST, reason="the NodeList fast path needs msgspec")
def test_a_hash_hit_is_checked_against_the_bytes() -> None:
    """A planted entry under the item's own hash but with other bytes (what a hash collision would
    be) is never served: the entry's bytes are compared with the item's."""
    app = _app([])
    pod = make_pod(vram_mb=8000)
    good = make_node("n1", free=20000)
    body = orjson.dumps({"Pod": pod, "Nodes": {"items": [good]}})
    items = wire.parse_args(body).items
    assert items is not None
    cache = app.node_cache
    key = xxh3_128_intdigest(items[0], seed=cache.seed)
    wrong = logic.node_facts(make_node("n1", free=10))
    cache.current[key] = (msgspec.Raw(orjson.dumps(make_node("n1", free=10))), wrong)
    res = orjson.loads(app.dispatch("POST", "/filter", body).body)
    assert res["NodeNames"] == ["n1"] and cache.misses == 1
    # the same planted twin behind the positional check: a changed item at the same position
    changed = make_node("n1", free=10)
    res = orjson.loads(app.dispatch("POST", "/filter", orjson.dumps({"Pod": pod, "Nodes": {"items": [changed]}})).body)
    assert res["NodeNames"] == [] and cache.misses == 2


def test_malloc_tuning_takes_on_glibc() -> None:
    code = "from flexinfer.scheduler.memory import tune_malloc; print(tune_malloc(32 << 20))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    expect = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
    assert out.stdout.strip() == str(expect)


def test_cache_generations_stay_bounded() -> None:
    app = _app([])
    app.node_cache.max_entries = 8
    pod = make_pod()
    for i in range(40):
        app.dispatch("POST", "/score", orjson.dumps({"Pod": pod, "Nodes": {"items": [make_node(f"n{i}")]}}))
    assert len(app.node_cache.current) + len(app.node_cache.previous) <= 16


def _cpu(app: Any, path: str, body: bytes, rounds: int = 5) -> float:
    out = []
    for _ in range(rounds):
        c0 = time.process_time()
        assert app.dispatch("POST", path, body).status == 200
        out.append(time.process_time() - c0)
    return statistics.median(out)


@pytest.mark.skipif(not wire.FAST, reason="the NodeList fast path needs msgspec (the kube extra)")
def test_5000_nodes_nodelist_costs_at_most_ratio_of_nodenames() -> None:
    app, cases, sizes = bench_extender.setup(5000, churn=0.0)
    by_names, by_nodes = cases[0][2](), cases[2][2]()
    assert sizes["NodeList"] > 8 * 1024 * 1024  # realistic objects, not names with labels
    app.dispatch("POST", "/score", by_nodes)  # first sight: every node parsed once
    misses = app.node_cache.misses
    for path in ("/score", "/filter"):
        names_cpu, nodes_cpu = _cpu(app, path, by_names), _cpu(app, path, by_nodes)
        assert nodes_cpu <= RATIO * names_cpu, (path, nodes_cpu, names_cpu)
    assert app.node_cache.misses == misses  # no node parsed again


@pytest.mark.reliability
def test_5000_nodes_p99_under_100ms_through_the_socket(tmp_path: Any) -> None:
    """The bench with the extender in its own process and the client in this one, 200 calls per case,
    1 % churn. Always judged: the server process's median CPU < 100 ms in every case. Its CPU p99 and
    the wall p99 are judged only for cases run while the box was not oversubscribed (1-minute load
    average below the core count): on a shared box they measure the other jobs too (the bench prints
    every figure with the load)."""
    out = tmp_path / "extender.json"
    rc = bench_extender.main(["--nodes", "5000", "--rounds", "200", "--churn", "0.01", "--check",
                              "--json", str(out)])
    res = orjson.loads(out.read_bytes())
    print(orjson.dumps(res, option=orjson.OPT_INDENT_2).decode())
    assert rc == 0, res["meta"]["failed"]
    socket_cases = [r for r in res["results"] if r["name"].startswith("socket ")]
    assert len(socket_cases) == 4 and all(r["rounds"] == 200 for r in socket_cases)
    assert all(r["cpu_p50_ms"] < 100 for r in socket_cases)
    judged = [r for r in socket_cases if r["load_max"] < (os.cpu_count() or 1)]
    assert all(r["p99_ms"] < 100 and r["cpu_p99_ms"] < 100 for r in judged)
