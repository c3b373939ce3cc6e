"""The ModelCache reconciler end to end against the emulator: the PVC and the prefetch Job."""

from __future__ import annotations

from flexinfer.operator.config import DEFAULT_FLEXINFER_IMAGE
from tests.kube_emulator import KubeEnv
from tests.operator.harness import (
    CACHES,
    JOBS,
    PVCS,
    phase,
    run_operator,
)


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
        prefetch = job["spec"]["template"]["spec"]["containers"][0]  # the FlexInfer image: no pip at run time
        assert prefetch["image"] == DEFAULT_FLEXINFER_IMAGE and "pip" not in prefetch["command"][2]
        assert job["spec"]["template"]["spec"]["securityContext"]["fsGroup"] == 65532
        await env.wait_for(lambda: phase(env, CACHES, "qwen") == "Provisioning")
        await env.patch(JOBS, "default", "qwen-prefetch", {"status": {"succeeded": 1}}, sub="status")
        await env.wait_for(lambda: phase(env, CACHES, "qwen") == "Ready")
        assert env.status("qwen", resource=CACHES)["path"] == "/models/qwen"
        await env.create(CACHES, {"apiVersion": "ai.flexinfer/v1alpha1", "kind": "ModelCache",
                                  "metadata": {"name": "nl", "namespace": "default"},
                                  "spec": {"source": "HF://x/y", "storageStrategy": "NodeLocal"}})
        await env.wait_for(lambda: env.condition("nl", "Ready", resource=CACHES).get("reason") == "NotImplemented")
