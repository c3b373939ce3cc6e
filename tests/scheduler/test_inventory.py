"""The extender's inventory: stores and ``apply_event`` fed directly, then the real list+watch loop
against the Kubernetes emulator (resume by resourceVersion, re-list on 410, back-off on errors)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from flexinfer import labels
from flexinfer.k8s.errors import KubeAPIError
from flexinfer.k8s.reflector import Expired
from flexinfer.scheduler.inventory import (
    ConfigMapStore,
    Inventory,
    NodeStore,
    PodUsageStore,
    Watcher,
)
from flexinfer.scheduler.settings import ExtenderSettings
from tests.harness import reach
from tests.kube_emulator import KubeEnv, kube_fixture  # noqa: F401
from tests.scheduler.helpers import make_node, make_pod


def _rv(obj: dict[str, Any], rv: str) -> dict[str, Any]:
    obj["metadata"]["resourceVersion"] = rv
    return obj


def test_apply_event_nodes() -> None:
    w = Watcher("nodes", NodeStore())
    w.apply_event("ADDED", _rv(make_node("a", util=10), "5"))
    w.apply_event("ADDED", _rv(make_node("b"), "6"))
    w.apply_event("MODIFIED", _rv(make_node("a", util=70), "7"))
    store = w.store
    assert isinstance(store, NodeStore)
    assert store.facts["a"].util == 70.0 and w.resource_version == "7"
    w.apply_event("DELETED", _rv(make_node("b"), "8"))
    assert set(store.facts) == {"a"}
    w.apply_event("BOOKMARK", {"metadata": {"resourceVersion": "20"}})
    assert w.resource_version == "20" and len(store) == 1
    with pytest.raises(Expired):
        w.apply_event("ERROR", {"kind": "Status", "code": 410, "message": "too old"})
    with pytest.raises(KubeAPIError):
        w.apply_event("ERROR", {"kind": "Status", "code": 500})
    w.apply_list({"metadata": {"resourceVersion": "30"}, "items": [make_node("z")]})
    assert set(store.facts) == {"z"} and w.resource_version == "30" and w.synced.is_set()


def test_configmap_store_keeps_only_benchmarks() -> None:
    s = ConfigMapStore()
    s.upsert({"metadata": {"name": labels.BENCHMARK_CONFIGMAP, "namespace": "a"}, "data": {"bench_x": "1"}})
    s.upsert({"metadata": {"name": "md-benchmark-results", "namespace": "a"}, "data": None})
    s.upsert({"metadata": {"name": "kube-root-ca.crt", "namespace": "a"}, "data": {"ca": "..."}})
    assert set(s.data) == {("a", labels.BENCHMARK_CONFIGMAP), ("a", "md-benchmark-results")}
    s.delete({"metadata": {"name": labels.BENCHMARK_CONFIGMAP, "namespace": "a"}})
    assert len(s) == 1


def test_pod_usage_store_tracks_transitions() -> None:
    s = PodUsageStore("team")
    p = make_pod("p", "ns", gpus=2, node_name="n1", phase="Running", pod_labels={"team": "red"})
    p["metadata"]["uid"] = "u1"
    s.upsert(p)
    s.upsert(make_pod("q", "ns", gpus=1, node_name="n1", phase="Running"))  # tenant = namespace
    s.upsert(make_pod("pending", "ns", gpus=4))  # not bound: not counted
    s.upsert(make_pod("cpu", "ns", node_name="n1", phase="Running"))  # no GPU resource: not counted
    assert s.totals == {"red": 2, "ns": 1}
    p["status"]["phase"] = "Succeeded"
    s.upsert(p)
    assert s.totals == {"ns": 1}
    s.delete(make_pod("q", "ns"))
    assert s.totals == {} and len(s) == 0


# ---- the real loop against the emulator -----------------------------------------------------------------



async def test_watch_loop_list_watch_resume_and_relist(kube: KubeEnv) -> None:
    kube.seed("v1/nodes", make_node("n1", util=5))
    inv = Inventory(ExtenderSettings(), namespace="")
    restarts: list[tuple[str, str]] = []
    async with kube.api_client() as api:
        from kubernetes_asyncio import client as k8s
        core = k8s.CoreV1Api(api)
        watchers = inv.make_watchers(api, on_restart=lambda k, r: restarts.append((k, r)))
        for w in watchers:
            w.backoff.base = 0.01
        tasks = [asyncio.create_task(w.run()) for w in watchers]
        try:
            await reach(lambda: inv.synced)
            assert set(inv.nodes.facts) == {"n1"}
            node_w = watchers[0]
            assert node_w.lists == 1

            await core.create_node(make_node("n2"))
            await core.patch_node("n1", {"metadata": {"annotations": {labels.GPU_UTIL: "77"}}})
            await reach(lambda: "n2" in inv.nodes.facts and inv.nodes.facts["n1"].util == 77.0)
            await core.create_namespaced_config_map("team-a", {
                "metadata": {"name": labels.BENCHMARK_CONFIGMAP}, "data": {"bench_1": "9"}})
            await reach(lambda: inv.bench("team-a") == {"bench_1": "9"})

            # the apiserver drops every watch: resume from the last resourceVersion, no re-list
            await kube.close_watches()
            await asyncio.sleep(0.1)
            await core.delete_node("n2")
            await reach(lambda: "n2" not in inv.nodes.facts)
            assert node_w.lists == 1

            # versions expire while no watch is open: 410 → re-list, which still sees everything
            await core.create_namespaced_config_map("team-a", {"metadata": {"name": "other"}})
            kube.expire_resource_versions()
            await kube.close_watches()
            await reach(lambda: node_w.lists == 2)
            assert ("nodes", "gone") in restarts
            await core.create_node(make_node("n3"))
            await reach(lambda: set(inv.nodes.facts) == {"n1", "n3"})

            # API errors: back off and recover
            fault = kube.inject("GET", r"/api/v1/nodes$", status=500, times=3)
            await core.create_namespaced_config_map("team-a", {"metadata": {"name": "other2"}})
            kube.expire_resource_versions()
            await kube.close_watches()
            await reach(lambda: node_w.lists == 3)
            assert fault.hits == 3 and restarts.count(("nodes", "error")) == 3, (fault, restarts)
            # requests never hit the API per scheduling decision: the lookup is local
            before = kube.request_count()
            found, missing = inv.lookup(["n1", "n3", "ghost"])
            assert [f.name for f in found] == ["n1", "n3"] and missing == ["ghost"]
            assert kube.request_count() == before
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def test_pod_watch_only_with_fairshare(kube: KubeEnv) -> None:
    kube.seed("v1/pods", make_pod("r", "team-a", gpus=2, node_name="n1", phase="Running"))
    kube.seed("v1/pods", make_pod("s", "team-a", gpus=1, node_name="n1", phase="Succeeded"))
    async with kube.api_client() as api:
        assert [w.kind for w in Inventory(ExtenderSettings()).make_watchers(api)] == ["nodes", "configmaps"]
        inv = Inventory(ExtenderSettings(tenant_fairshare_enabled=True), namespace="flexinfer-system")
        ws = inv.make_watchers(api)
        assert [w.kind for w in ws] == ["nodes", "configmaps", "pods"]
        tasks = [asyncio.create_task(w.run()) for w in ws]
        try:
            await reach(lambda: inv.synced)
            assert inv.tenant_used("team-a") == 2.0  # the field selector left the finished pod out
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def _run_node_watcher(kube: KubeEnv, api: Any) -> tuple[Inventory, Any, asyncio.Task[None]]:
    inv = Inventory(ExtenderSettings())
    node_w = inv.make_watchers(api)[0]
    assert node_w.kind == "nodes"
    return inv, node_w, asyncio.create_task(node_w.run())


async def test_watch_loop_honours_retry_after(kube: KubeEnv) -> None:
    """A list refused with 503 and ``Retry-After: 1`` is tried again after that second, not after the
    (shorter: at most 0.5 s here) backoff."""
    kube.seed("v1/nodes", make_node("n1"))
    refused = kube.inject("GET", r"^/api/v1/nodes$", status=503, retry_after=1, times=1, query="^(?!.*watch)")
    async with kube.api_client() as api:
        t0 = time.monotonic()
        inv, node_w, task = await _run_node_watcher(kube, api)
        try:
            await reach(node_w.synced.is_set, timeout=5.0)
            waited = time.monotonic() - t0
            assert refused.hits == 1 and set(inv.nodes.facts) == {"n1"}
            assert waited >= 0.95, f"listed again after {waited:.2f}s, before the Retry-After second"
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def test_watch_loop_slows_down_when_streams_end_at_once(kube: KubeEnv) -> None:
    """An apiserver that ends every watch at once (a bookmark, no change) meets a growing delay, not a
    request storm; once it streams again, changes arrive."""
    kube.seed("v1/nodes", make_node("n1"))
    async with kube.api_client() as api:
        from kubernetes_asyncio import client as k8s

        inv, node_w, task = await _run_node_watcher(kube, api)
        try:
            await reach(node_w.synced.is_set)
            bookmark = {"type": "BOOKMARK", "object": {"kind": "Node", "apiVersion": "v1", "metadata": {
                "resourceVersion": str(kube.emulator.current_rv)}}}
            empty = kube.inject("GET", r"^/api/v1/nodes$", status=200, body=bookmark, times=10_000, query="watch")
            await kube.close_watches()
            await asyncio.sleep(0.6)
            assert 1 <= empty.hits <= 4, f"{empty.hits} watch requests in 0.6 s"
            empty.times = empty.hits  # the apiserver streams again
            await k8s.CoreV1Api(api).create_node(make_node("n2"))
            await reach(lambda: "n2" in inv.nodes.facts, timeout=8.0)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
