"""Extender wire format and routes: both ExtenderArgs forms, bad bodies → 400, and the same through
a real socket on the ``flexinfer.http`` core."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from flexinfer import labels
from flexinfer.labels import bench_key
from flexinfer.scheduler import logic, wire
from flexinfer.scheduler.server import ExtenderApp, ExtenderHandler, make_app
from flexinfer.scheduler.settings import ExtenderSettings
from tests.kube_emulator import kube_fixture  # noqa: F401
from tests.scheduler.helpers import make_node, make_pod

S = ExtenderSettings()


def app_with(nodes: list[dict[str, Any]], configmaps: list[dict[str, Any]] = (),  # type: ignore[assignment]
             settings: ExtenderSettings = S, pods: list[dict[str, Any]] = ()) -> ExtenderApp:  # type: ignore[assignment]
    app = make_app(settings, "flexinfer-system")
    app.inventory.nodes.replace(nodes)
    app.inventory.configmaps.replace(configmaps)
    app.inventory.pods.replace(pods)
    return app


def args_body(pod: dict[str, Any], *, nodes: list[dict[str, Any]] | None = None,
              names: list[str] | None = None, keycase: str = "go") -> bytes:
    body: dict[str, Any] = {"Pod": pod}
    if nodes is not None:
        body["Nodes"] = {"metadata": {}, "items": nodes}
    if names is not None:
        body["NodeNames"] = names
    if keycase == "lower":
        body = {k.lower(): v for k, v in body.items()}
    return orjson.dumps(body)


NODES = [make_node("good", free=20000, util=10), make_node("busy", free=20000, util=90),
         make_node("novendor", vendor=None), make_node("small", free=1000)]


# ---- wire ----------------------------------------------------------------------------------------------


def test_parse_nodes_form_and_names_form() -> None:
    a = wire.parse_args(args_body(make_pod(), nodes=NODES))
    assert a.node_names is None and a.names == ["good", "busy", "novendor", "small"]
    b = wire.parse_args(args_body(make_pod(), names=["x", "y"]))
    assert b.nodes is None and b.names == ["x", "y"]
    c = wire.parse_args(args_body(make_pod(), names=["x"], keycase="lower"))  # Go matches keys case-insensitively
    assert c.names == ["x"]
    d = wire.parse_args(orjson.dumps({"Pod": {}, "Nodes": {"items": None}}))
    assert d.nodes == []


@pytest.mark.parametrize("body", [
    b"", b"{", b"[]", b"null", b'"x"', b"{}",
    b'{"Pod": null, "NodeNames": ["a"]}',
    b'{"Pod": [], "NodeNames": ["a"]}',
    b'{"Pod": {"metadata": 5}, "NodeNames": ["a"]}',
    b'{"Pod": {}}',
    b'{"Pod": {}, "NodeNames": "a"}',
    b'{"Pod": {}, "NodeNames": [1]}',
    b'{"Pod": {}, "NodeNames": [""]}',
    b'{"Pod": {}, "Nodes": []}',
    b'{"Pod": {}, "Nodes": {"items": {}}}',
    b'{"Pod": {}, "Nodes": {"items": [{}]}}',
    b'{"Pod": {}, "Nodes": {"items": [{"metadata": {"name": 3}}]}}',
    b'{"Pod": {}, "Nodes": {"items": [7]}}',
    "{\"Pod\": {}, \"NodeNames\": [\"\udc80\"]}".encode("utf-8", "surrogatepass"),
    b"\xff\xfe",
])
def test_bad_bodies_are_400_never_500(body: bytes) -> None:
    app = app_with(NODES)
    for path in ("/filter", "/score", "/prioritize"):
        reply = app.dispatch("POST", path, body)
        assert reply.status == 400, (path, body, reply)
        assert orjson.loads(reply.body)["Error"]


def test_filter_nodes_form_echoes_objects() -> None:
    app = app_with([])
    pod = make_pod(vram_mb=8000)
    reply = app.dispatch("POST", "/filter", args_body(pod, nodes=NODES))
    assert reply.status == 200
    res = orjson.loads(reply.body)
    assert set(res) == {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}
    assert res["NodeNames"] == ["good", "busy"]
    assert [n["metadata"]["name"] for n in res["Nodes"]["items"]] == ["good", "busy"]
    assert res["Nodes"]["items"][0] == NODES[0]
    assert set(res["FailedNodes"]) == {"novendor", "small"}
    assert set(res["FailedAndUnresolvableNodes"]) == {"novendor"}
    assert res["Error"] == ""


def test_filter_names_form_uses_inventory_and_unknown_nodes_fail() -> None:
    app = app_with(NODES)
    reply = app.dispatch("POST", "/filter", args_body(make_pod(vram_mb=8000), names=["good", "ghost", "small"]))
    res = orjson.loads(reply.body)
    assert res["Nodes"] is None and res["NodeNames"] == ["good"]
    assert res["FailedNodes"]["ghost"] == "node not found in the extender's node cache"
    assert "insufficient free VRAM" in res["FailedNodes"]["small"]


def test_names_form_before_sync_is_503() -> None:
    app = make_app(S)

    class NotSynced:
        kind = "nodes"
        synced = asyncio.Event()

    app.inventory.watchers = [NotSynced()]  # type: ignore[list-item]
    assert app.dispatch("POST", "/filter", args_body(make_pod(), names=["a"])).status == 503
    assert app.dispatch("POST", "/score", args_body(make_pod(), names=["a"])).status == 503
    assert app.dispatch("GET", "/readyz", b"").status == 503
    # the Nodes form needs no cache
    assert app.dispatch("POST", "/filter", args_body(make_pod(), nodes=NODES[:1])).status == 200


def test_score_both_forms_agree_and_use_bench() -> None:
    pod = make_pod(backend="vllm", model="m1")
    fast = make_node("fast", arch="sm_90", free=1000)
    slow = make_node("slow", arch="sm_80", free=1000)
    bench = {bench_key("vllm", "m1", logic.node_facts(fast).device_class): "100"}
    cms = [{"metadata": {"name": labels.BENCHMARK_CONFIGMAP, "namespace": "team-a"}, "data": bench}]
    app = app_with([fast, slow], cms)
    by_names = orjson.loads(app.dispatch("POST", "/score", args_body(pod, names=["slow", "fast", "ghost"])).body)
    assert by_names == [{"Host": "slow", "Score": 0}, {"Host": "fast", "Score": 10}, {"Host": "ghost", "Score": 0}]
    by_nodes = orjson.loads(app.dispatch("POST", "/prioritize", args_body(pod, nodes=[slow, fast])).body)
    assert by_nodes == by_names[:2]


def test_bench_configmap_falls_back_to_extender_namespace_and_deployment() -> None:
    pod = make_pod(backend="vllm", model="m1", namespace="elsewhere", pod_labels={labels.MODELDEPLOYMENT_CR: "md"})
    n1 = make_node("n1", arch="sm_90")
    n2 = make_node("n2", arch="sm_80", util=50)
    bench = {bench_key("vllm", "m1", logic.node_facts(n2).device_class): "1000"}
    cms = [{"metadata": {"name": labels.BENCHMARK_CONFIGMAP, "namespace": "flexinfer-system"}, "data": bench},
           {"metadata": {"name": "md-benchmark-results", "namespace": "elsewhere"},
            "data": {labels.TOKENS_PER_SECOND: "5"}},
           {"metadata": {"name": "unrelated", "namespace": "elsewhere"}, "data": {"x": "y"}}]
    app = app_with([n1, n2], cms)
    assert len(app.inventory.configmaps) == 2  # the unrelated ConfigMap is not kept
    assert app.inventory.deployment_tps("elsewhere", "md") == 5.0
    res = orjson.loads(app.dispatch("POST", "/score", args_body(pod, names=["n1", "n2"])).body)
    assert res == [{"Host": "n1", "Score": 0}, {"Host": "n2", "Score": 10}]


def test_tenant_fairshare_gauges() -> None:
    s = ExtenderSettings(tenant_fairshare_enabled=True, tenant_budget_gpus=4)
    running = [make_pod(f"r{i}", "team-a", gpus=1, node_name="n1", phase="Running") for i in range(3)]
    done = make_pod("d", "team-a", gpus=8, node_name="n1", phase="Succeeded")
    app = app_with(NODES, settings=s, pods=[*running, done])
    assert app.inventory.tenant_used("team-a") == 3.0
    assert app.dispatch("POST", "/score", args_body(make_pod(), names=["good", "busy"])).status == 200
    text = app.dispatch("GET", "/metrics", b"").body.decode()
    assert 'flexinfer_scheduler_tenant_usage_ratio{tenant="team-a"} 0.75' in text
    assert 'flexinfer_scheduler_tenant_score_adjustment{tenant="team-a"} 1.25' in text


def test_routes() -> None:
    app = app_with(NODES)
    assert app.dispatch("GET", "/healthz", b"") == (200, b"ok", b"text/plain; charset=utf-8")
    assert app.dispatch("GET", "/readyz", b"").status == 200
    assert app.dispatch("GET", "/filter", b"").status == 405
    assert app.dispatch("GET", "/nope", b"").status == 404
    assert app.dispatch("POST", "/prefix/filter", args_body(make_pod(), names=["good"])).status == 200
    app.dispatch("POST", "/filter", args_body(make_pod(), names=["novendor"]))
    metrics = app.dispatch("GET", "/metrics", b"")
    assert metrics.status == 200 and metrics.content_type.startswith(b"text/plain")
    text = metrics.body.decode()
    assert 'flexinfer_scheduler_requests_total{code="200",verb="filter"} 2.0' in text
    assert 'flexinfer_scheduler_filtered_nodes_total{reason="no_vendor"} 1.0' in text
    assert 'flexinfer_scheduler_inventory_objects{kind="nodes"} 4.0' in text


# ---- through a socket ----------------------------------------------------------------------------------


async def _http(port: int, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
    await writer.drain()
    raw = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    head, _, payload = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), payload


@pytest.fixture
async def served() -> Any:
    from flexinfer.http.server import HTTPServer
    from flexinfer.settings import HTTPSettings

    app = app_with(NODES)
    server = HTTPServer(ExtenderHandler(app), HTTPSettings(max_body_json=1024 * 1024), port=0)
    await server.start()
    yield app, server.port
    await server.drain_and_close(1.0)


async def test_socket_end_to_end(served: Any) -> None:
    _, port = served
    status, body = await _http(port, "POST", "/filter", args_body(make_pod(vram_mb=8000), names=["good", "small"]))
    assert status == 200 and orjson.loads(body)["NodeNames"] == ["good"]
    status, body = await _http(port, "POST", "/score", args_body(make_pod(), names=["good", "busy"]))
    assert status == 200 and orjson.loads(body) == [{"Host": "good", "Score": 10}, {"Host": "busy", "Score": 0}]
    status, body = await _http(port, "POST", "/filter", b"{not json")
    assert status == 400 and orjson.loads(body)["Error"].startswith("invalid JSON")
    assert (await _http(port, "GET", "/healthz"))[0] == 200
    status, _ = await _http(port, "POST", "/filter", b"x" * (2 * 1024 * 1024))
    assert status == 413


async def test_socket_concurrency_50(served: Any) -> None:
    """E5: 50 parallel calls, each answer matches the sequential answer."""
    app, port = served
    bodies = [args_body(make_pod(vram_mb=v), names=[n["metadata"]["name"] for n in NODES])
              for v in (1000, 8000, 16000, 30000, None)]
    expected = [app.dispatch("POST", "/filter", b).body for b in bodies]
    results = await asyncio.gather(*(_http(port, "POST", "/filter", bodies[i % 5]) for i in range(50)))
    for i, (status, body) in enumerate(results):
        assert status == 200 and orjson.loads(body) == orjson.loads(expected[i % 5])


# ---- the process ------------------------------------------------------------------------------------------


async def test_extender_process_end_to_end(kube: Any) -> None:
    """``flexinfer extender`` as a process: watches the emulator, answers, follows changes, drains on SIGTERM."""
    import signal
    import socket
    import sys

    kube.seed("v1/nodes", make_node("n1", free=20000))
    kube.seed("v1/nodes", make_node("n2", vendor=None))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "flexinfer.cli", "--log-level", "warning", "extender", "--host", "127.0.0.1",
        "--port", str(port), "--kubeconfig", str(kube.kubeconfig_path),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    try:
        loop = asyncio.get_running_loop()
        end = loop.time() + 30
        while True:
            try:
                if (await _http(port, "GET", "/readyz"))[0] == 200:
                    break
            except OSError:
                pass
            assert loop.time() < end, "extender never became ready"
            await asyncio.sleep(0.1)
        status, body = await _http(port, "POST", "/filter", args_body(make_pod(), names=["n1", "n2", "n3"]))
        assert status == 200 and orjson.loads(body)["NodeNames"] == ["n1"]
        await kube.upsert("v1/nodes", make_node("n3"))
        while orjson.loads((await _http(port, "POST", "/filter",
                                        args_body(make_pod(), names=["n3"])))[1])["NodeNames"] != ["n3"]:
            assert loop.time() < end, "the watch did not deliver the new node"
            await asyncio.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 20) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
