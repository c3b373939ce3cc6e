"""The other kinds end to end against the emulator: LoRAAdapter (through an injected HTTP function),
ModelDeployment (children, benchmark gate, idle scale-down, cleanup), GPUGroup (demand from the
proxy's annotations, anti-thrashing) and ModelCache (PVC + prefetch Job)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from flexinfer import labels
from flexinfer.api.common import format_time
from tests.kube_emulator import KubeEnv
from tests.operator.harness import (
    CACHES,
    CONFIGMAPS,
    DEPLOYMENTS,
    ENDPOINTS,
    GROUPS,
    JOBS,
    LORAS,
    MDS,
    MODELS,
    NODES,
    PVCS,
    SERVICES,
    FakeClock,
    OperatorEnv,
    gpu_node,
    model,
    run_operator,
)


class FakeBackend:
    """Records adapter calls; addresses in ``failing`` answer 500."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.failing: set[str] = set()

    async def __call__(self, url: str, body: Mapping[str, Any], timeout: float) -> tuple[int, str]:
        self.calls.append((url, dict(body)))
        host = url.split("//", 1)[1].split("/", 1)[0]
        if host in self.failing:
            return 500, "boom"
        if any(u == url and b == body for u, b in self.calls[:-1]) and "load" in url and "unload" not in url:
            return 400, "The lora adapter 'sql' has already been loaded."
        return 200, "ok"


def endpoints(name: str, ips: list[str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Endpoints",
            "metadata": {"name": name, "namespace": "default", "labels": {labels.MANAGED_BY: "flexinfer"}},
            "subsets": [{"addresses": [{"ip": ip} for ip in ips], "ports": [{"name": "http", "port": 8000}]}]}


def lora(name: str, ref: str) -> dict[str, Any]:
    return {"apiVersion": "ai.flexinfer/v1alpha2", "kind": "LoRAAdapter",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"modelRef": ref, "adapterName": "sql", "source": {"type": "HuggingFace", "uri": "org/sql-lora"},
                     "maxRank": 64}}


def phase(env: OperatorEnv, resource: str, name: str) -> Any:
    return env.status(name, resource=resource).get("phase")


async def test_lora_adapter(kube: KubeEnv) -> None:
    kube.seed(NODES, gpu_node("n1"))
    http = FakeBackend()
    async with run_operator(kube, http_post=http) as env:
        await env.create(LORAS, lora("sql", "llama"))
        await env.wait_for(lambda: env.condition("sql", "Ready", resource=LORAS).get("reason") == "ModelNotFound")
        await env.create(MODELS, model("llama", backend="vllm", source="HF://meta/llama", gpu={"vendor": "nvidia"},
                                       cache={"strategy": "None"}, serverless={"enabled": False}))
        await env.wait_for(lambda: phase(env, LORAS, "sql") == "Pending", what="Pending on the parent")
        dep = await env.wait_for(lambda: env.get(DEPLOYMENTS, "llama"))
        args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
        assert "--enable-lora" in args and args[args.index("--max-loras") + 1] == "4"
        await env.set_deployment_ready("llama", 2)
        await kube.upsert(ENDPOINTS, endpoints("llama", ["10.0.0.1", "10.0.0.2"]))
        http.failing = {"10.0.0.2:8000"}
        await env.wait_for(lambda: env.condition("sql", "Ready", resource=LORAS).get("reason") == "PartiallyLoaded",
                           what="partially loaded")
        st = env.status("sql", resource=LORAS)
        assert (st["loadedReplicas"], st["totalReplicas"], st["phase"]) == (1, 2, "Loaded")
        assert http.calls[0] == ("http://10.0.0.1:8000/v1/load_lora_adapter",
                                 {"lora_name": "sql", "lora_path": "org/sql-lora", "max_lora_rank": 64})
        http.failing = set()
        await env.wait_for(lambda: env.status("sql", resource=LORAS).get("loadedReplicas") == 2, what="all loaded")
        loads = [u for u, _ in http.calls if u.endswith("/load_lora_adapter")]
        assert loads.count("http://10.0.0.1:8000/v1/load_lora_adapter") == 1  # not re-sent once loaded
        assert labels.FINALIZER_LORA in env.get(LORAS, "sql")["metadata"]["finalizers"]
        await env.delete(LORAS, "default", "sql")
        await env.wait_for(lambda: env.get(LORAS, "sql") is None, what="adapter deleted")
        unloads = sorted(u for u, _ in http.calls if u.endswith("/unload_lora_adapter"))
        assert unloads == ["http://10.0.0.1:8000/v1/unload_lora_adapter", "http://10.0.0.2:8000/v1/unload_lora_adapter"]
        await env.wait_for(lambda: "--enable-lora" not in env.get(DEPLOYMENTS, "llama")["spec"]["template"]["spec"][
            "containers"][0]["args"], what="LoRA args removed")


def md(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "ai.flexinfer/v1alpha1", "kind": "ModelDeployment",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"backend": "ollama", "model": "llama3:8b", **spec}}


async def test_modeldeployment(kube: KubeEnv) -> None:
    clock = FakeClock()
    async with run_operator(kube, clock=clock) as env:
        await env.create(MDS, md("legacy", benchmark={"iterations": 3}, litellm={"servedModelName": "l3"}))
        dep = await env.wait_for(lambda: env.get(DEPLOYMENTS, "legacy"))
        svc = env.get(SERVICES, "legacy")
        assert dep["spec"]["template"]["metadata"]["labels"]["app"] == "legacy" and dep["spec"]["replicas"] == 1
        assert svc["metadata"]["annotations"][labels.LITELLM_SERVED_MODEL] == "l3"
        assert env.get(PVCS, "legacy") is not None
        job = await env.wait_for(lambda: env.get(JOBS, "legacy-benchmark"), what="benchmark Job")
        assert "--configmap" in job["spec"]["template"]["spec"]["containers"][0]["args"]
        await env.set_deployment_ready("legacy")
        await env.wait_for(lambda: env.condition("legacy", "Ready", resource=MDS).get("reason") == "BenchmarkPending")
        await kube.upsert(CONFIGMAPS, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
            "name": "legacy-benchmark-results", "namespace": "default", "labels": {labels.MANAGED_BY: "flexinfer"}},
            "data": {"tokensPerSecond": "42.5"}})
        await env.wait_for(lambda: env.status("legacy", resource=MDS).get("tokensPerSecond") == 42.5)
        assert env.condition("legacy", "Ready", resource=MDS)["status"] == "True"
        st = env.status("legacy", resource=MDS)
        assert st["phase"] == "Running" and st["readyReplicas"] == 1 and "app.kubernetes.io/instance=legacy" in \
            st["selector"]
        await env.wait_for(lambda: any(e["reason"] == "BenchmarkComplete" for e in env.events("legacy")))
        # idle scale-down
        await env.patch(MDS, "default", "legacy", {"status": {"lastAccessTime": format_time(clock.now)}},
                        sub="status")
        clock.advance(301)
        await env.wait_for(lambda: env.get(MDS, "legacy")["spec"]["replicas"] == 0, what="scaled down")
        await env.wait_for(lambda: env.get(DEPLOYMENTS, "legacy")["spec"]["replicas"] == 0)
        await env.wait_for(lambda: any(e["reason"] == "ScaledDown" for e in env.events("legacy")))
        await env.delete(MDS, "default", "legacy")
        await env.wait_for(lambda: env.get(MDS, "legacy") is None, what="deleted")
        assert env.get(DEPLOYMENTS, "legacy") is None and env.get(PVCS, "legacy") is None


def group(name: str, members: list[tuple[str, int]], **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "ai.flexinfer/v1alpha1", "kind": "GPUGroup", "metadata": {"name": name, "namespace": "default"},
            "spec": {"models": [{"name": n, "priority": p} for n, p in members], **spec}}


async def queue(env: OperatorEnv, member: str, depth: int, since: datetime) -> None:
    await env.patch(GROUPS, "default", "gpu", {"metadata": {"annotations": {
        labels.queue_key(member): str(depth), labels.queue_since_key(member): format_time(since)}}})


async def test_gpugroup_anti_thrashing(kube: KubeEnv) -> None:
    clock = FakeClock()
    async with run_operator(kube, clock=clock) as env:
        for n in ("a", "b"):
            await env.create(MDS, md(n, gpuGroupRef="gpu", replicas=0))
        await env.create(GROUPS, group("gpu", [("a", 100), ("b", 50)]))
        await env.wait_for(lambda: phase(env, GROUPS, "gpu") == "Idle")
        await queue(env, "b", 1, clock.now)
        await env.wait_for(lambda: env.status("gpu", resource=GROUPS).get("activeModel") == "b", what="b active")
        await env.wait_for(lambda: env.get(MDS, "b")["spec"]["replicas"] == 1)
        assert env.status("gpu", resource=GROUPS)["swapCount"] == 1
        await env.wait_for(lambda: env.get(SERVICES, "b") is not None)
        # a wants the GPU: the queue must reach the threshold and persist, and b must have run 30 s
        clock.advance(5)
        await queue(env, "a", 5, clock.now)
        await queue(env, "b", 0, clock.now)
        await env.settle(quiet=0.8)
        st = env.status("gpu", resource=GROUPS)
        assert st["activeModel"] == "b" and "hysteresis" in env.condition("gpu", "Ready", resource=GROUPS)["message"]
        clock.advance(11)  # demand persisted, but b has run only 16 s
        await env.settle(quiet=0.8)
        assert env.status("gpu", resource=GROUPS)["activeModel"] == "b"
        assert "minimum" in env.condition("gpu", "Ready", resource=GROUPS)["message"]
        clock.advance(20)
        await env.wait_for(lambda: env.status("gpu", resource=GROUPS).get("activeModel") == "a", what="swap to a")
        st = env.status("gpu", resource=GROUPS)
        assert st["swapCount"] == 2 and st["lastSwapReason"] == "demand: queue=5, priority=100"
        b = next(m for m in st["modelStatuses"] if m["name"] == "b")
        assert b["state"] == "Preempted" and b["preemptedBy"] == "a"
        await env.wait_for(lambda: env.get(MDS, "b")["spec"]["replicas"] == 0 and
                           env.get(MDS, "a")["spec"]["replicas"] == 1, what="replicas swapped")
        await env.wait_for(lambda: any(e["reason"] == "ModelScaledDown" for e in env.events("gpu")))


async def test_modelcache(kube: KubeEnv) -> None:
    async with run_operator(kube) as env:
        await env.create(CACHES, {"apiVersion": "ai.flexinfer/v1alpha1", "kind": "ModelCache",
                                  "metadata": {"name": "qwen", "namespace": "default"},
                                  "spec": {"source": "huggingface://Qwen/Qwen3-8B", "storageSize": "40Gi"}})
        job = await env.wait_for(lambda: env.get(JOBS, "qwen-prefetch"), what="prefetch Job")
        pvc = env.get(PVCS, "qwen")
        assert pvc["spec"]["accessModes"] == ["ReadWriteMany"] and pvc["spec"]["resources"]["requests"]["storage"] \
            == "40Gi"
        env_vars = {e["name"]: e.get("value") for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert env_vars["HF_REPO"] == "Qwen/Qwen3-8B" and env_vars["DEST"] == "/models/qwen"
        await env.wait_for(lambda: phase(env, CACHES, "qwen") == "Provisioning")
        await env.patch(JOBS, "default", "qwen-prefetch", {"status": {"succeeded": 1}}, sub="status")
        await env.wait_for(lambda: phase(env, CACHES, "qwen") == "Ready")
        assert env.status("qwen", resource=CACHES)["path"] == "/models/qwen"
        await env.create(CACHES, {"apiVersion": "ai.flexinfer/v1alpha1", "kind": "ModelCache",
                                  "metadata": {"name": "nl", "namespace": "default"},
                                  "spec": {"source": "HF://x/y", "storageStrategy": "NodeLocal"}})
        await env.wait_for(lambda: env.condition("nl", "Ready", resource=CACHES).get("reason") == "NotImplemented")
