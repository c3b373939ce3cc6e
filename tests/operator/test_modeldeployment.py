"""The ModelDeployment (v1alpha1) reconciler end to end against the emulator: children, the benchmark
gate, idle scale-down, cleanup."""

from __future__ import annotations

from flexinfer import labels
from flexinfer.api.common import format_time
from tests.kube_emulator import KubeEnv
from tests.operator.harness import (
    CONFIGMAPS,
    DEPLOYMENTS,
    JOBS,
    MDS,
    PVCS,
    SERVICES,
    FakeClock,
    md,
    run_operator,
)


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
