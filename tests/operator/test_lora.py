"""The LoRAAdapter reconciler end to end against the emulator, the engines reached through an injected
HTTP function: pending on its parent Model, partially then fully loaded, unloaded on deletion."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flexinfer import labels
from tests.kube_emulator import KubeEnv
from tests.operator.harness import (
    DEPLOYMENTS,
    ENDPOINTS,
    LORAS,
    MODELS,
    NODES,
    gpu_node,
    model,
    phase,
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
