"""Time-dependent Model rules end to end, on a fake clock: serverless idle timeout and a shared-GPU
group of three Models (demand moves the lead, priority and the swap cooldown are respected), and the
late refinements (warmPolicy primary, the cold-start hold, forcePromotion)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from flexinfer import labels
from flexinfer.api.common import format_time
from tests.kube_emulator import KubeEnv
from tests.operator.harness import (
    DEPLOYMENTS,
    MODELS,
    NODES,
    SERVICES,
    FakeClock,
    OperatorEnv,
    gpu_node,
    model,
    run_operator,
)


def replicas(env: OperatorEnv, name: str) -> Any:
    d = env.get(DEPLOYMENTS, name)
    return None if d is None else d["spec"]["replicas"]


async def demand(env: OperatorEnv, name: str, at: datetime) -> None:
    await env.patch(MODELS, "default", name, {"status": {"lastActiveTime": format_time(at)}}, sub="status")


def shared(env: OperatorEnv, name: str) -> dict[str, Any]:
    return env.status(name).get("sharedGroup") or {}


def leader(env: OperatorEnv, names: str = "abc") -> list[str]:
    return [n for n in names if shared(env, n).get("state") == "Active"]


async def test_serverless_idle_timeout(kube: KubeEnv) -> None:
    clock = FakeClock()
    async with run_operator(kube, clock=clock) as env:
        await env.create(MODELS, model("s"))
        await env.wait_for(lambda: env.status("s").get("phase") == "Idle")
        await demand(env, "s", clock.now)
        await env.wait_for(lambda: replicas(env, "s") == 1, what="woken")
        await env.set_deployment_ready("s")
        await env.wait_for(lambda: env.status("s").get("phase") == "Ready")
        clock.advance(299)
        await env.settle()
        assert replicas(env, "s") == 1
        clock.advance(2)  # past the 5 minute idle timeout of ollama
        await env.wait_for(lambda: replicas(env, "s") == 0, what="scaled to zero")
        await env.set_deployment_ready("s", 0)
        await env.wait_for(lambda: env.status("s").get("phase") == "Idle")
        await env.wait_for(lambda: any(e["reason"] == "ScaledToZero" for e in env.events("s")))


async def test_shared_group_of_three(kube: KubeEnv) -> None:
    kube.seed(NODES, gpu_node("n1"))
    clock = FakeClock()
    async with run_operator(kube, clock=clock) as env:
        for name, prio, svc in (("a", 100, ["textgen"]), ("b", 100, ["code"]), ("c", 50, ["vision"])):
            await env.create(MODELS, model(name, gpu={"shared": "g", "priority": prio}, serviceLabels=svc))
        await env.wait_for(lambda: leader(env) == ["a"], what="initial leader a")
        await env.wait_for(lambda: shared(env, "c").get("queuePosition") == 2)
        assert shared(env, "b") == {"groupName": "g", "state": "Queued", "queuePosition": 1, "preemptedBy": "a"}
        await env.wait_for(lambda: env.get(SERVICES, "a")["metadata"]["annotations"].get(labels.ACTIVE_SERVICES)
                           == "textgen")
        assert env.get(SERVICES, "b")["metadata"]["annotations"][labels.ACTIVE_SERVICES] == ""
        await env.wait_for(lambda: [replicas(env, n) for n in "abc"] == [0, 0, 0])  # nobody asked yet

        # demand on b: b leads and starts; a was not Ready, so it is only Queued
        await demand(env, "b", clock.now)
        await env.wait_for(lambda: leader(env) == ["b"], what="b leads")
        await env.wait_for(lambda: replicas(env, "b") == 1 and replicas(env, "a") == 0, what="b scaled up")
        assert shared(env, "a")["state"] == "Queued"
        await env.set_deployment_ready("b")
        await env.wait_for(lambda: env.status("b").get("phase") == "Ready")

        # lower-priority demand does not preempt a busy higher-priority model
        clock.advance(10)
        await demand(env, "c", clock.now)
        await env.settle(quiet=1.0)
        assert leader(env) == ["b"]

        # b idle past the demand window: a (same priority) takes the GPU; b is Preempted
        clock.advance(130)
        await demand(env, "a", clock.now)
        await env.wait_for(lambda: leader(env) == ["a"], what="a leads")
        sb = shared(env, "b")
        assert sb["state"] == "Preempted" and sb["preemptedBy"] == "a"
        assert sb["preemptedAt"] == format_time(clock.now)
        await env.wait_for(lambda: replicas(env, "b") == 0 and replicas(env, "a") == 1, what="swap")
        await env.wait_for(lambda: any(e["reason"] == "Preempted" and "by a with priority 100" in e["message"]
                                       for e in env.events("b")), what="Preempted event")
        await env.set_deployment_ready("b", 0)
        await env.wait_for(lambda: env.status("b").get("phase") == "Preempted")

        # within the swap cooldown, demand on b does not swap back
        clock.advance(10)
        await demand(env, "b", clock.now)
        await env.settle(quiet=1.0)
        assert leader(env) == ["a"] and replicas(env, "b") == 0

        # after the cooldown (5 m), b's demand wins over the idle a
        clock.advance(300)
        await demand(env, "b", clock.now)
        await env.wait_for(lambda: leader(env) == ["b"], what="b leads after the cooldown")
        assert shared(env, "a")["state"] == "Queued"  # a never became Ready: not preempted


async def test_shared_group_late_refinements(kube: KubeEnv) -> None:
    kube.seed(NODES, gpu_node("n1"))
    clock = FakeClock()
    names = "abcp"
    async with run_operator(kube, clock=clock) as env:
        await env.create(MODELS, model("a", gpu={"shared": "g", "priority": 100}))
        await env.create(MODELS, model("b", gpu={"shared": "g", "priority": 100, "forcePromotion": True}))
        await env.create(MODELS, model("c", gpu={"shared": "g", "priority": 900}))
        await env.create(MODELS, model("p", gpu={"shared": "g", "priority": 50}, config={"warmPolicy": "primary"}))
        # nobody asked: the primary holds the GPU (by priority alone, c would)
        await env.wait_for(lambda: leader(env, names) == ["p"], what="primary p leads")
        await env.wait_for(lambda: all(env.condition(n, "Cached").get("status") == "True" for n in names))

        # demand on a: a leads and starts loading; the load start is recorded
        t0 = clock.now
        await demand(env, "a", t0)
        await env.wait_for(lambda: leader(env, names) == ["a"], what="a leads")
        await env.wait_for(lambda: env.status("a").get("phase") == "Loading"
                           and env.status("a").get("loadingProgressAt") == format_time(t0), what="a loading")

        # a higher-priority demand does not cut a's load within its coldStartTimeout (60 s)
        clock.advance(10)
        await demand(env, "c", clock.now)
        await env.settle(quiet=1.0)
        assert leader(env, names) == ["a"] and replicas(env, "c") == 0

        # once the cold start is over, c (nobody is Ready, c has the higher priority) takes the GPU
        clock.advance(55)
        await env.wait_for(lambda: leader(env, names) == ["c"], what="c leads after a's cold start")
        await env.wait_for(lambda: replicas(env, "a") == 0 and replicas(env, "c") == 1, what="swap to c")
        assert shared(env, "a")["state"] == "Queued"  # a never became Ready: not preempted
        await env.wait_for(lambda: "loadingProgressAt" not in env.status("a"), what="a's load start cleared")
        await env.set_deployment_ready("c")
        await env.wait_for(lambda: env.status("c").get("phase") == "Ready")
        assert "loadingProgressAt" not in env.status("c")

        # b's forced demand takes the GPU from the busy, higher-priority c at once
        clock.advance(10)
        await demand(env, "c", clock.now)
        await demand(env, "b", clock.now)
        await env.wait_for(lambda: leader(env, names) == ["b"], what="forced b leads")
        sc = shared(env, "c")
        assert sc["state"] == "Preempted" and sc["preemptedBy"] == "b"
        await env.wait_for(lambda: replicas(env, "c") == 0 and replicas(env, "b") == 1, what="swap to b")

        # within the cooldown, c's demand does not swap back while b is forced and demanded
        clock.advance(10)
        await demand(env, "c", clock.now)
        await env.settle(quiet=1.0)
        assert leader(env, names) == ["b"]
