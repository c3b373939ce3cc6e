"""The GPUGroup (v1alpha1) reconciler end to end against the emulator: demand from the proxy's
annotations, anti-thrashing."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from flexinfer import labels
from flexinfer.api.common import format_time
from tests.kube_emulator import KubeEnv
from tests.operator.harness import (
    GROUPS,
    MDS,
    SERVICES,
    FakeClock,
    OperatorEnv,
    md,
    phase,
    run_operator,
)


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
