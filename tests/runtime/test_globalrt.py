"""The global runtime without processes: its file, the probe thresholds, and the Latency order
(the request path through real processes is tests/proxy/test_globalproxy.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from flexinfer.runtime.globalrt import (
    FAIL_THRESHOLD,
    GlobalConfigError,
    GlobalRuntime,
    load_global,
    parse_global,
)
from tests.stub_engine import StubEngine

ROOT = Path(__file__).resolve().parents[2]


def _gp(strategy: str, urls: list[str], **spec: object) -> dict[str, object]:
    return {"apiVersion": "ai.flexinfer/v1alpha2", "kind": "GlobalProxy", "metadata": {"name": "g"},
            "spec": {"strategy": strategy, "clusters": [{"name": f"c{i}", "endpoint": u} for i, u in enumerate(urls)],
                     "probe": {"path": "/health", "timeout": "1s", "interval": "1s"}, **spec}}


def test_the_example_file_loads() -> None:
    cfg = load_global(str(ROOT / "examples" / "global.yaml"))
    assert (cfg.name, cfg.spec.strategy, [c.name for c in cfg.spec.clusters]) == ("global-mesh", "Failover",
                                                                                 ["core", "edge-1"])
    assert dict(cfg.routing["qwen3-1.7b"].weights) == {"core": 3, "edge-1": 1}


@pytest.mark.parametrize(("docs", "message"), [
    ([], "exactly one GlobalProxy, found 0"),
    ([_gp("RoundRobin", ["http://a:1"])] * 2, "exactly one GlobalProxy, found 2"),
    ([{"kind": "Model"}], "kind 'Model'"),
    ([_gp("Failover", ["http://a:1"])], "failoverOrder"),
    ([_gp("RoundRobin", ["http://a:1/x/y"])], "must not contain a path"),
])
def test_bad_configurations_say_why(docs: list[object], message: str) -> None:
    with pytest.raises(GlobalConfigError, match=message):
        parse_global(docs)


async def test_error_answers_take_a_member_out_after_the_threshold_and_one_pass_brings_it_back() -> None:
    stubs = [await StubEngine().start() for _ in range(2)]
    try:
        rt = GlobalRuntime(parse_global([_gp("Failover", [s.url for s in stubs], failoverOrder=["c0", "c1"])]))
        await rt.probe_all()
        view = rt.resolve("stub")
        assert view is not None and [e.port for e in view.endpoints] == [s.port for s in stubs]
        stubs[0].health_status = 503
        for _ in range(FAIL_THRESHOLD - 1):
            await rt.probe_all()
            assert rt.members["c0"].ready  # one bad answer is not enough
        await rt.probe_all()
        assert not rt.members["c0"].ready and "503" in rt.members["c0"].error
        view = rt.resolve("stub")
        assert view is not None and [e.port for e in view.endpoints] == [stubs[1].port]
        assert rt.active_cluster() == "c1"
        stubs[0].health_status = 200
        await rt.probe_all()
        assert rt.members["c0"].ready and rt.active_cluster() == "c0"
        await stubs[1].stop()  # a refusal: out at once
        await rt.probe_all()
        assert not rt.members["c1"].ready and "refused" in rt.members["c1"].error
    finally:
        for s in stubs:
            await s.stop()


def test_latency_order_keeps_its_leader_within_the_margin() -> None:
    rt = GlobalRuntime(parse_global([_gp("Latency", ["http://127.0.0.1:1", "http://127.0.0.1:2"])]))
    a, b = rt.members["c0"], rt.members["c1"]
    for m in (a, b):
        m.ready, m.models = True, frozenset({"m"})
    a.latency_s, b.latency_s = 0.010, 0.020
    rt._rebuild()
    assert rt.active_cluster() == "c0"
    b.latency_s = 0.009  # faster, but not by 20 %: no flap
    rt._rebuild()
    assert rt.active_cluster() == "c0"
    b.latency_s = 0.005
    rt._rebuild()
    view = rt.resolve("m")
    assert rt.active_cluster() == "c1" and view is not None and [e.port for e in view.endpoints] == [2, 1]
