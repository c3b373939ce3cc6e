"""Every feature of the Kubernetes emulator shim (tests/kube_emulator.py), checked through the real
``kubernetes_asyncio`` client (and raw HTTP where the client hides the detail)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.watch import Watch

from tests.kube_emulator import (
    KubeEnv,
    field_selector_matches,
    kube_fixture,  # noqa: F401  (the `kube` fixture)
    label_selector_matches,
)

MODELS = "ai.flexinfer/v1alpha2/models"


def _cm(name: str, ns: str = "default", **data: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": ns}, "data": dict(data)}


async def _raw(kube: KubeEnv, method: str, path: str, body: Any = None,
               content_type: str = "application/json") -> tuple[int, Any, dict[str, str]]:
    async with aiohttp.ClientSession() as s:
        kw: dict[str, Any] = {}
        if body is not None:
            kw["json"] = body
            kw["headers"] = {"Content-Type": content_type}
        async with s.request(method, kube.url + path, **kw) as r:
            try:
                data = await r.json(content_type=None)
            except ValueError:
                data = await r.text()
            return r.status, data, dict(r.headers)


async def test_create_answers_201_and_stamps(kube: KubeEnv) -> None:
    async with kube.api_client() as api:
        core = k8s.CoreV1Api(api)
        created = await core.create_namespaced_config_map("team-a", _cm("c1", "team-a", a="1"))
        assert created is not None  # kmock alone answers 200 and the client returns None
        meta = created.metadata
        assert meta.uid and meta.creation_timestamp and meta.generation == 1
        assert meta.namespace == "team-a" and int(meta.resource_version) > 0
    status, _, _ = await _raw(kube, "POST", "/api/v1/namespaces/team-a/configmaps", _cm("c2", "team-a"))
    assert status == 201
    status, body, _ = await _raw(kube, "POST", "/api/v1/namespaces/team-a/configmaps", _cm("c2", "team-a"))
    assert status == 409 and body["reason"] == "AlreadyExists"


async def test_generate_name_and_missing_name(kube: KubeEnv) -> None:
    async with kube.api_client() as api:
        core = k8s.CoreV1Api(api)
        ev1 = await core.create_namespaced_event("default", {"metadata": {"generateName": "x-"},
                                                             "involvedObject": {}, "reason": "R"})
        ev2 = await core.create_namespaced_event("default", {"metadata": {"generateName": "x-"},
                                                             "involvedObject": {}, "reason": "R"})
        assert ev1.metadata.name.startswith("x-") and len(ev1.metadata.name) == 7
        assert ev1.metadata.name != ev2.metadata.name
    status, _, _ = await _raw(kube, "POST", "/api/v1/namespaces/default/configmaps", {"metadata": {}})
    assert status == 422


async def test_resource_version_and_generation(kube: KubeEnv) -> None:
    kube.register(MODELS, kind="Model")
    async with kube.api_client() as api:
        co = k8s.CustomObjectsApi(api)
        obj = await co.create_namespaced_custom_object("ai.flexinfer", "v1alpha2", "default", "models", {
            "apiVersion": "ai.flexinfer/v1alpha2", "kind": "Model",
            "metadata": {"name": "m"}, "spec": {"backend": "vllm"}, "status": {"phase": "Ignored"}})
        rv0 = int(obj["metadata"]["resourceVersion"])
        assert "status" not in obj  # status subresource: create drops status
        obj = await co.patch_namespaced_custom_object("ai.flexinfer", "v1alpha2", "default", "models", "m",
                                                      {"spec": {"backend": "llamacpp"}})
        assert obj["metadata"]["generation"] == 2 and int(obj["metadata"]["resourceVersion"]) > rv0
        rv1 = int(obj["metadata"]["resourceVersion"])
        obj = await co.patch_namespaced_custom_object("ai.flexinfer", "v1alpha2", "default", "models", "m",
                                                      {"metadata": {"labels": {"a": "b"}}})
        assert obj["metadata"]["generation"] == 2 and int(obj["metadata"]["resourceVersion"]) > rv1
        rv2 = int(obj["metadata"]["resourceVersion"])
        # a no-op patch writes nothing: same rv
        obj = await co.patch_namespaced_custom_object("ai.flexinfer", "v1alpha2", "default", "models", "m",
                                                      {"metadata": {"labels": {"a": "b"}}})
        assert int(obj["metadata"]["resourceVersion"]) == rv2
        # immutable fields are kept
        obj = await co.patch_namespaced_custom_object("ai.flexinfer", "v1alpha2", "default", "models", "m",
                                                      {"metadata": {"uid": "forged"}})
        assert obj["metadata"]["uid"] != "forged"


async def test_status_subresource_semantics(kube: KubeEnv) -> None:
    kube.register(MODELS, kind="Model")
    async with kube.api_client() as api:
        co = k8s.CustomObjectsApi(api)
        await co.create_namespaced_custom_object("ai.flexinfer", "v1alpha2", "default", "models", {
            "metadata": {"name": "m"}, "spec": {"backend": "vllm"}})
        obj = await co.patch_namespaced_custom_object_status(
            "ai.flexinfer", "v1alpha2", "default", "models", "m",
            {"status": {"phase": "Ready"}, "spec": {"backend": "forged"}})
        assert obj["status"] == {"phase": "Ready"} and obj["spec"]["backend"] == "vllm"
        assert obj["metadata"]["generation"] == 1
        obj = await co.patch_namespaced_custom_object("ai.flexinfer", "v1alpha2", "default", "models", "m",
                                                      {"status": {"phase": "Forged"}})
        assert obj["status"]["phase"] == "Ready"
        # JSON patch on /status through the status endpoint
        obj = await co.patch_namespaced_custom_object_status(
            "ai.flexinfer", "v1alpha2", "default", "models", "m",
            [{"op": "replace", "path": "/status/phase", "value": "Idle"}])
        assert obj["status"]["phase"] == "Idle"


async def test_register_crd_and_discovery(kube: KubeEnv) -> None:
    keys = kube.register_crd({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "loraadapters.ai.flexinfer"},
        "spec": {"group": "ai.flexinfer", "scope": "Namespaced",
                 "names": {"plural": "loraadapters", "kind": "LoRAAdapter", "shortNames": ["lora"]},
                 "versions": [{"name": "v1alpha2", "served": True, "storage": True,
                               "subresources": {"status": {}}}]}})
    assert keys == ["ai.flexinfer/v1alpha2/loraadapters"]
    status, body, _ = await _raw(kube, "GET", "/apis/ai.flexinfer/v1alpha2")
    assert status == 200
    names = {r["name"] for r in body["resources"]}
    assert {"loraadapters", "loraadapters/status"} <= names
    kinds = {r["kind"] for r in body["resources"]}
    assert kinds == {"LoRAAdapter"}
    async with kube.api_client() as api:
        co = k8s.CustomObjectsApi(api)
        await co.create_namespaced_custom_object("ai.flexinfer", "v1alpha2", "ns1", "loraadapters",
                                                 {"metadata": {"name": "l"}, "spec": {}})
        got = await co.list_namespaced_custom_object("ai.flexinfer", "v1alpha2", "ns1", "loraadapters")
        assert [i["metadata"]["name"] for i in got["items"]] == ["l"]
        assert got["items"][0]["kind"] == "LoRAAdapter"


async def test_kubeconfig_and_token(kube: KubeEnv) -> None:
    text = kube.kubeconfig_path.read_text()
    assert kube.url in text and "dummy" in text
    async with kube.api_client() as api:
        await k8s.CoreV1Api(api).list_node()
    req = list(kube.emulator)[-1]
    assert req.headers.get("Authorization") == "Bearer dummy"


async def test_write_counters(kube: KubeEnv) -> None:
    kube.seed("v1/nodes", {"metadata": {"name": "n1"}})
    async with kube.api_client() as api:
        core = k8s.CoreV1Api(api)
        await core.read_node("n1")
        await core.patch_node("n1", {"metadata": {"labels": {"a": "1"}}})
        await core.patch_node("n1", {"metadata": {"labels": {"a": "2"}}})
        await core.patch_node_status("n1", {"status": {"phase": "x"}})
        await core.create_namespaced_config_map("default", _cm("c"))
    assert kube.write_count("nodes") == 3
    assert kube.write_count("nodes/status") == 1
    assert kube.write_count("nodes", "PATCH") == 3
    assert kube.write_count("configmaps", "POST") == 1
    assert kube.write_count() == 4
    assert kube.request_count("nodes", "GET") == 1


async def test_fault_injection_status_retry_after_and_times(kube: KubeEnv) -> None:
    kube.seed("v1/nodes", {"metadata": {"name": "n1"}})
    fault = kube.inject("PATCH", r"/api/v1/nodes/n1$", status=429, retry_after=3, times=2)
    async with kube.api_client() as api:
        core = k8s.CoreV1Api(api)
        for _ in range(2):
            with pytest.raises(ApiException) as ei:
                await core.patch_node("n1", {"metadata": {"labels": {"a": "1"}}})
            assert ei.value.status == 429 and ei.value.headers["Retry-After"] == "3"
        assert kube.get("v1/nodes", None, "n1")["metadata"].get("labels") is None  # faults change nothing
        await core.patch_node("n1", {"metadata": {"labels": {"a": "1"}}})
    assert fault.hits == 2 and fault.remaining == 0
    assert kube.get("v1/nodes", None, "n1")["metadata"]["labels"] == {"a": "1"}
    assert kube.write_count("nodes", "PATCH") == 3  # faulted attempts are counted


async def test_fault_injection_delay_and_method_filter(kube: KubeEnv) -> None:
    kube.seed("v1/nodes", {"metadata": {"name": "n1"}})
    kube.inject("GET", r"/nodes/n1$", delay=0.3)
    kube.inject("DELETE", r"/nodes/", status=500)
    async with kube.api_client() as api:
        core = k8s.CoreV1Api(api)
        t0 = time.monotonic()
        node = await core.read_node("n1")
        assert node.metadata.name == "n1" and time.monotonic() - t0 >= 0.28
        t0 = time.monotonic()
        await core.read_node("n1")
        assert time.monotonic() - t0 < 0.25  # times=1 by default
        with pytest.raises(ApiException) as ei:
            await core.delete_node("n1")
        assert ei.value.status == 500


async def test_optimistic_concurrency(kube: KubeEnv) -> None:
    async with kube.api_client() as api:
        core = k8s.CoreV1Api(api)
        cm = await core.create_namespaced_config_map("default", _cm("c", a="1"))
        stale = cm.metadata.resource_version
        await core.patch_namespaced_config_map("c", "default", {"data": {"a": "2"}})
        with pytest.raises(ApiException) as ei:
            await core.patch_namespaced_config_map("c", "default", {
                "metadata": {"resourceVersion": stale}, "data": {"a": "3"}})
        assert ei.value.status == 409
        cm.data = {"a": "4"}
        with pytest.raises(ApiException) as ei:
            await core.replace_namespaced_config_map("c", "default", cm)
        assert ei.value.status == 409
        fresh = await core.read_namespaced_config_map("c", "default")
        fresh.data = {"a": "5"}
        out = await core.replace_namespaced_config_map("c", "default", fresh)  # PUT works
        assert out.data == {"a": "5"} and int(out.metadata.resource_version) > int(fresh.metadata.resource_version)
        # kopf-style JSON patch guarded by a test op on the resourceVersion
        with pytest.raises(ApiException) as ei:
            await core.patch_namespaced_config_map("c", "default", [
                {"op": "test", "path": "/metadata/resourceVersion", "value": stale},
                {"op": "replace", "path": "/data/a", "value": "6"}])
        assert ei.value.status == 422
        ok = await core.patch_namespaced_config_map("c", "default", [
            {"op": "test", "path": "/metadata/resourceVersion", "value": out.metadata.resource_version},
            {"op": "replace", "path": "/data/a", "value": "6"}])
        assert ok.data == {"a": "6"}


async def test_delete_with_finalizers_and_collection(kube: KubeEnv) -> None:
    async with kube.api_client() as api:
        core = k8s.CoreV1Api(api)
        await core.create_namespaced_config_map("default", {
            "metadata": {"name": "f", "finalizers": ["x/y"]}, "data": {}})
        await core.delete_namespaced_config_map("f", "default")
        held = await core.read_namespaced_config_map("f", "default")
        assert held.metadata.deletion_timestamp is not None
        await core.patch_namespaced_config_map("f", "default", {"metadata": {"finalizers": None}})
        with pytest.raises(ApiException) as ei:
            await core.read_namespaced_config_map("f", "default")
        assert ei.value.status == 404
        for i in range(3):
            await core.create_namespaced_config_map("default", {
                "metadata": {"name": f"c{i}", "labels": {"grp": "a" if i < 2 else "b"}}, "data": {}})
        await core.delete_collection_namespaced_config_map("default", label_selector="grp=a")
        left = await core.list_namespaced_config_map("default")
        assert [c.metadata.name for c in left.items] == ["c2"]


async def test_selectors_on_list(kube: KubeEnv) -> None:
    kube.seed("v1/pods", {"metadata": {"name": "p1", "namespace": "a", "labels": {"app": "x", "tier": "1"}},
                          "spec": {"nodeName": "n1", "containers": []}, "status": {"phase": "Running"}})
    kube.seed("v1/pods", {"metadata": {"name": "p2", "namespace": "a", "labels": {"app": "y"}},
                          "spec": {"nodeName": "n2", "containers": []}, "status": {"phase": "Running"}})
    kube.seed("v1/pods", {"metadata": {"name": "p3", "namespace": "b", "labels": {"app": "x"}},
                          "spec": {"nodeName": "n1", "containers": []}, "status": {"phase": "Succeeded"}})
    async with kube.api_client() as api:
        core = k8s.CoreV1Api(api)

        async def names(**kw: Any) -> list[str]:
            return sorted(p.metadata.name for p in (await core.list_pod_for_all_namespaces(**kw)).items)

        assert await names(field_selector="spec.nodeName=n1") == ["p1", "p3"]
        assert await names(field_selector="spec.nodeName=n1,status.phase!=Succeeded") == ["p1"]
        assert await names(label_selector="app=x") == ["p1", "p3"]
        assert await names(label_selector="app in (x, y),tier") == ["p1"]
        assert await names(label_selector="!tier") == ["p2", "p3"]
        lst = await core.list_namespaced_pod("a")
        assert sorted(p.metadata.name for p in lst.items) == ["p1", "p2"]
        assert int(lst.metadata.resource_version) >= 3


def test_selector_functions() -> None:
    labels = {"a": "1", "b": "2"}
    assert label_selector_matches("", labels)
    assert label_selector_matches("a=1,b==2", labels)
    assert not label_selector_matches("a!=1", labels)
    assert label_selector_matches("a notin (2,3)", labels)
    assert not label_selector_matches("c", labels)
    assert field_selector_matches("metadata.name=x", {"metadata": {"name": "x"}})
    assert field_selector_matches("spec.missing=", {"spec": {}})
    assert field_selector_matches("spec.unschedulable!=true", {"spec": {"unschedulable": False}})


async def test_watch_true_and_resume_and_expire(kube: KubeEnv) -> None:
    async with kube.api_client() as api:
        core = k8s.CoreV1Api(api)
        await core.create_namespaced_config_map("default", _cm("a"))
        lst = await core.list_namespaced_config_map("default")
        rv = lst.metadata.resource_version
        await core.create_namespaced_config_map("default", _cm("b"))
        await core.patch_namespaced_config_map("a", "default", {"data": {"k": "v"}})
        # kubernetes_asyncio sends watch=True; only changes after `rv` are replayed
        seen: list[tuple[str, str]] = []
        w = Watch()
        async for ev in w.stream(core.list_namespaced_config_map, "default", resource_version=rv,
                                 timeout_seconds=1):
            seen.append((ev["type"], ev["object"].metadata.name))
        assert seen == [("ADDED", "b"), ("MODIFIED", "a")]
        kube.expire_resource_versions()
        w = Watch()
        with pytest.raises(ApiException) as ei:
            async for _ in w.stream(core.list_namespaced_config_map, "default", resource_version=rv,
                                    timeout_seconds=1):
                pass
        assert ei.value.status == 410


async def test_watch_live_events_selectors_bookmark_and_timeout(kube: KubeEnv) -> None:
    async with kube.api_client() as api:
        core = k8s.CoreV1Api(api)
        await core.create_namespaced_config_map("default", {"metadata": {"name": "old", "labels": {"k": "1"}}})
        got: list[tuple[str, str]] = []

        async def consume() -> None:
            resp = await core.list_namespaced_config_map(
                "default", watch=True, label_selector="k=1", timeout_seconds=2,
                allow_watch_bookmarks=True, _preload_content=False)
            async for line in resp.content:
                import json
                ev = json.loads(line)
                got.append((ev["type"], ev["object"]["metadata"].get("name", "")))

        t0 = time.monotonic()
        task = asyncio.create_task(consume())
        await asyncio.sleep(0.2)
        await core.create_namespaced_config_map("default", {"metadata": {"name": "new", "labels": {"k": "1"}}})
        await core.create_namespaced_config_map("default", {"metadata": {"name": "other", "labels": {"k": "2"}}})
        await core.delete_namespaced_config_map("new", "default")
        await asyncio.wait_for(task, 5)
        assert 1.8 < time.monotonic() - t0 < 4  # timeoutSeconds ends the stream
        assert got == [("ADDED", "old"), ("BOOKMARK", ""), ("ADDED", "new"), ("DELETED", "new")]


async def test_close_watches(kube: KubeEnv) -> None:
    async with kube.api_client() as api:
        core = k8s.CoreV1Api(api)
        resp = await core.list_node(watch=True, _preload_content=False)
        reader = asyncio.create_task(resp.content.read())
        await asyncio.sleep(0.1)
        await kube.close_watches()
        assert await asyncio.wait_for(reader, 3) == b""


async def test_namespaces(kube: KubeEnv) -> None:
    kube.seed("v1/configmaps", {"metadata": {"name": "c", "namespace": "team-x"}})
    async with kube.api_client() as api:
        core = k8s.CoreV1Api(api)
        names = {n.metadata.name for n in (await core.list_namespace()).items}
        assert {"default", "kube-system", "team-x"} <= names
        await core.create_namespace({"metadata": {"name": "made", "labels": {"t": "1"}}})
        assert (await core.read_namespace("made")).metadata.labels == {"t": "1"}
        assert [n.metadata.name for n in (await core.list_namespace(label_selector="t=1")).items] == ["made"]
        with pytest.raises(ApiException) as ei:
            await core.read_namespace("nope")
        assert ei.value.status == 404


async def test_scale_subresource(kube: KubeEnv) -> None:
    async with kube.api_client() as api:
        apps = k8s.AppsV1Api(api)
        await apps.create_namespaced_deployment("default", {
            "metadata": {"name": "d"}, "spec": {"replicas": 0, "selector": {}, "template": {}}})
        sc = await apps.patch_namespaced_deployment_scale("d", "default", {"spec": {"replicas": 2}})
        assert sc.spec.replicas == 2 and sc.kind == "Scale"
        d = await apps.read_namespaced_deployment("d", "default")
        assert d.spec.replicas == 2 and d.metadata.generation == 2
        assert (await apps.read_namespaced_deployment_scale("d", "default")).spec.replicas == 2


async def test_upsert_emits_events_and_seed_keeps_status(kube: KubeEnv) -> None:
    pod = kube.seed("v1/pods", {"metadata": {"name": "p", "namespace": "a"}, "status": {"podIP": "10.0.0.1"}})
    assert pod["status"]["podIP"] == "10.0.0.1" and pod["metadata"]["uid"]
    async with kube.api_client() as api:
        core = k8s.CoreV1Api(api)
        resp = await core.list_namespaced_pod("a", watch=True, timeout_seconds=1, _preload_content=False)
        await asyncio.sleep(0.05)
        await kube.upsert("v1/pods", {"metadata": {"name": "p", "namespace": "a"},
                                      "status": {"podIP": "10.0.0.2"}})
        body = (await resp.content.read()).decode()
    assert '"MODIFIED"' in body and "10.0.0.2" in body
    assert kube.get("v1/pods", "a", "p")["status"]["podIP"] == "10.0.0.2"


async def test_kopf_operator_runs_against_the_emulator(kube: KubeEnv) -> None:
    """The shim is enough for kopf 1.45: create handler, status patch, finalizer, delete handler."""
    import logging

    import kopf

    kube.register(MODELS, kind="Model")
    registry = kopf.OperatorRegistry()
    seen: list[str] = []

    @kopf.on.login(registry=registry)
    def login(**kw: Any) -> Any:
        return kopf.login_with_kubeconfig(**kw)

    @kopf.on.startup(registry=registry)
    def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.posting.level = logging.WARNING
        settings.watching.server_timeout = 5
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="flexinfer.ai")
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix="flexinfer.ai")

    @kopf.on.create("ai.flexinfer", "v1alpha2", "models", registry=registry, id="created")
    def created(name: str, patch: kopf.Patch, **_: Any) -> dict[str, str]:
        seen.append(f"create {name}")
        patch.status["phase"] = "Pending"
        return {"ok": "yes"}

    @kopf.on.delete("ai.flexinfer", "v1alpha2", "models", registry=registry, id="deleted")
    def deleted(name: str, **_: Any) -> None:
        seen.append(f"delete {name}")

    stop = asyncio.Event()
    task = asyncio.create_task(kopf.operator(registry=registry, standalone=True, clusterwide=True,
                                             stop_flag=stop))
    try:
        async with kube.api_client() as api:
            co = k8s.CustomObjectsApi(api)
            await co.create_namespaced_custom_object("ai.flexinfer", "v1alpha2", "default", "models", {
                "apiVersion": "ai.flexinfer/v1alpha2", "kind": "Model", "metadata": {"name": "m1"},
                "spec": {"backend": "vllm"}})
            for _ in range(200):
                obj = kube.get(MODELS, "default", "m1")
                if obj and obj.get("status", {}).get("phase") == "Pending" and obj["metadata"].get("finalizers"):
                    break
                await asyncio.sleep(0.05)
            assert obj is not None and obj["status"].get("created") == {"ok": "yes"}, obj
            await co.delete_namespaced_custom_object("ai.flexinfer", "v1alpha2", "default", "models", "m1")
            for _ in range(200):
                if kube.get(MODELS, "default", "m1") is None:
                    break
                await asyncio.sleep(0.05)
            assert kube.get(MODELS, "default", "m1") is None
        assert seen == ["create m1", "delete m1"]
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)
