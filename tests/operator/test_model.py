"""The Model reconciler end to end: the real operator (kopf + our registry) against the emulator."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

from flexinfer import labels
from flexinfer.api.common import format_time
from tests.kube_emulator import KubeEnv
from tests.operator.harness import (
    DEPLOYMENTS,
    EVENTS,
    MODELS,
    NODES,
    SERVICES,
    gpu_node,
    model,
    run_operator,
)


def replicas(env: Any, name: str) -> int | None:
    d = env.get(DEPLOYMENTS, name)
    return None if d is None else d["spec"]["replicas"]


async def test_lifecycle_create_ready_delete(kube: KubeEnv) -> None:
    async with run_operator(kube) as env:
        await env.create(MODELS, model("chat", litellm={"aliases": ["assistant"]}, serviceLabels=["textgen"]))
        dep = await env.wait_for(lambda: env.get(DEPLOYMENTS, "chat"), what="Deployment")
        svc = await env.wait_for(lambda: env.get(SERVICES, "chat"), what="Service")
        m = env.get(MODELS, "chat")
        assert dep["spec"]["replicas"] == 0  # scale-to-zero by default
        c = dep["spec"]["template"]["spec"]["containers"][0]
        assert c["image"] == "ollama/ollama:latest" and c["args"] == ["serve"]
        assert c["ports"] == [{"name": "http", "containerPort": 11434, "protocol": "TCP"}]
        assert c["readinessProbe"]["httpGet"] == {"path": "/", "port": 11434}
        assert dep["metadata"]["ownerReferences"][0]["uid"] == m["metadata"]["uid"]
        assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
        assert svc["metadata"]["annotations"][labels.LITELLM_ALIASES] == "assistant,textgen"
        await env.wait_for(lambda: env.status("chat").get("phase") == "Idle", what="Idle")
        m = env.get(MODELS, "chat")
        assert labels.FINALIZER_MODEL in m["metadata"]["finalizers"]
        st = m["status"]
        assert st["endpoint"] == "http://chat.default.svc.cluster.local:11434" and st["observedGeneration"] == 1
        assert {c["type"] for c in st["conditions"]} == {"Ready", "Schedulable", "ConfigValid", "Cached", "Loaded"}
        assert env.condition("chat", "Ready")["reason"] == "WaitingForActivation"

        # the proxy signals demand; the Deployment scales up; the pods become ready
        await env.patch(MODELS, "default", "chat", {"status": {"lastActiveTime": format_time(datetime.now(UTC))}},
                        sub="status")
        await env.wait_for(lambda: replicas(env, "chat") == 1, what="scale up")
        await env.wait_for(lambda: env.status("chat").get("phase") == "Loading", what="Loading")
        await env.set_deployment_ready("chat")
        await env.wait_for(lambda: env.status("chat").get("phase") == "Ready", what="Ready")
        ready = env.condition("chat", "Ready")
        assert ready["status"] == "True" and ready["reason"] == "BackendReady" and ready["observedGeneration"] == 1
        assert ready["lastTransitionTime"] and env.condition("chat", "Loaded")["status"] == "True"
        await env.wait_for(lambda: any(e["reason"] == "BackendReady" for e in env.events("chat")), what="event")

        # a spec change rolls the Deployment and bumps observedGeneration
        await env.patch(MODELS, "default", "chat", {"spec": {"config": {"numParallel": 4}}})
        await env.wait_for(lambda: env.status("chat").get("observedGeneration") == 2, what="generation 2")
        env_vars = env.get(DEPLOYMENTS, "chat")["spec"]["template"]["spec"]["containers"][0]["env"]
        assert {"name": "OLLAMA_NUM_PARALLEL", "value": "4"} in env_vars

        await env.delete(MODELS, "default", "chat")
        await env.wait_for(lambda: env.get(MODELS, "chat") is None, what="Model gone")
        assert env.get(DEPLOYMENTS, "chat") is None and env.get(SERVICES, "chat") is None
        assert kube.write_count("deployments.apps", "POST") == 1 and kube.write_count("services", "POST") == 1


async def test_invalid_specs_fail_with_bounded_writes(kube: KubeEnv) -> None:
    kube.seed(NODES, gpu_node("n1"))
    kube.seed(NODES, gpu_node("a1", "amd"))
    async with run_operator(kube) as env:
        await env.create(MODELS, model("bad-backend", backend="tgi", source="HF://x/y"))
        await env.create(MODELS, model("too-big", backend="vllm", source="HF://x/y",
                                       gpu={"vendor": "nvidia", "vramEstimateMB": 30000}))
        await env.create(MODELS, model("ambiguous", backend="vllm", source="HF://x/y", gpu={}))
        await env.create(MODELS, model("x" * 70, backend="ollama", source="ollama://x"))
        want = {"bad-backend": "UnknownBackend", "too-big": "VRAMInsufficient", "ambiguous": "AmbiguousGPUVendor",
                "x" * 70: "InvalidSpec"}
        for name, reason in want.items():
            await env.wait_for(lambda n=name: env.status(n).get("phase") == "Failed", what=f"{name} Failed")
            assert env.condition(name, "Ready")["reason"] == reason
        await env.settle()
        before = kube.write_count()
        per_model = (kube.write_count("models.ai.flexinfer") - 4) / 4  # minus the four creates
        assert per_model <= 3, dict(kube.writes)  # status, kopf's diff base, nothing else
        assert kube.write_count("events") <= 4
        await asyncio.sleep(2.5)  # several resyncs and placement retries later: no crash loop
        assert kube.write_count() == before, dict(kube.writes)
        assert kube.write_count("deployments.apps") == 0 and kube.write_count("services") == 0
        assert not any(labels.FINALIZER_MODEL in (env.get(MODELS, n)["metadata"].get("finalizers") or ())
                       for n in want)
        # fixing the spec recovers
        await env.patch(MODELS, "default", "too-big", {"spec": {"gpu": {"vramEstimateMB": 8000}}})
        await env.wait_for(lambda: env.get(DEPLOYMENTS, "too-big"), what="recovered")
        await env.wait_for(lambda: env.status("too-big").get("phase") == "Pending", what="Pending (prefetch)")


async def test_noop_reconcile_makes_zero_writes(kube: KubeEnv) -> None:
    kube.seed(NODES, gpu_node("n1"))
    async with run_operator(kube) as env:
        for i in range(3):
            await env.create(MODELS, model(f"m{i}", backend="vllm", source="HF://org/m", gpu={"vendor": "nvidia"},
                                           cache={"strategy": "None"}, serverless={"minReplicas": 1},
                                           litellm={"aliases": [f"a{i}"]}))
        await env.wait_for(lambda: all(env.status(f"m{i}").get("phase") == "Loading" for i in range(3)))
        await env.settle()
        # the API server's defaults show up in the children: not a difference
        dep = env.get(DEPLOYMENTS, "m0")
        tmpl = dep["spec"]["template"]["spec"]
        tmpl["containers"][0].update({"terminationMessagePath": "/dev/termination-log", "resources": {
            **tmpl["containers"][0]["resources"], "requests": {"nvidia.com/gpu": "1"}}})
        tmpl.update({"restartPolicy": "Always", "dnsPolicy": "ClusterFirst", "schedulerName": "default-scheduler"})
        await env.patch(DEPLOYMENTS, "default", "m0", {"spec": {"revisionHistoryLimit": 10,
                                                                "progressDeadlineSeconds": 600, "template": {
                                                                    "spec": tmpl}}})
        await env.patch(SERVICES, "default", "m1", {"spec": {"clusterIP": "10.0.0.7", "sessionAffinity": "None"}})
        await env.settle()
        before = kube.write_count()
        # unrelated annotations and labels on the Model and its children, then many resync ticks
        await env.patch(MODELS, "default", "m2", {"metadata": {"annotations": {"example.com/note": "hi"},
                                                               "labels": {"team": "a"}}})
        await env.patch(DEPLOYMENTS, "default", "m2", {"metadata": {"annotations": {"deployment.kubernetes.io/"
                                                                                    "revision": "3"}}})
        await asyncio.sleep(2.0)
        assert kube.write_count() - before == 2, dict(kube.writes)  # only the test's own two patches
        reconciles = env.op.queues["model"].reconciles
        assert reconciles > 9  # the resync did run
    # a restarted operator resumes every Model without writing anything
    before = kube.write_count()
    async with run_operator(kube) as env2:
        await env2.wait_for(lambda: env2.op.queues["model"].reconciles >= 6, what="resumed reconciles")
        await asyncio.sleep(0.5)
    assert kube.write_count() == before, dict(kube.writes)
    assert kube.write_count(EVENTS.split("/")[-1], "POST") <= 3


async def test_cache_gating_and_alias_conflicts(kube: KubeEnv) -> None:
    kube.seed(NODES, gpu_node("n1"))
    async with run_operator(kube) as env:
        await env.create(MODELS, model("big", backend="vllm", source="HF://meta/llama", gpu={"vendor": "nvidia"},
                                       serverless={"minReplicas": 1}, litellm={"aliases": ["llama"]}))
        await env.create(MODELS, model("other", litellm={"aliases": ["llama", "x"]}))
        job = await env.wait_for(lambda: env.get("batch/v1/jobs", "big-cache-prefetch"), what="prefetch Job")
        assert env.get("v1/persistentvolumeclaims", "big-cache") is not None
        await env.wait_for(lambda: env.status("big").get("phase") == "Pending")
        assert replicas(env, "big") == 0  # files first
        assert env.condition("big", "Cached")["reason"] == "PrefetchPending"
        # both claim "llama": ConfigValid=False on both, nothing blocked
        for n in ("big", "other"):
            await env.wait_for(lambda n=n: env.condition(n, "ConfigValid").get("reason") == "AliasConflict",
                               what=f"{n} conflict")
        assert "'llama' is also claimed by other" in env.condition("big", "ConfigValid")["message"]
        await env.wait_for(lambda: any(e["reason"] == "AliasConflict" for e in env.events("other")))
        assert env.status("other")["phase"] == "Idle"
        await env.patch(MODELS, "default", "other", {"spec": {"litellm": {"aliases": ["x"]}}})
        for n in ("big", "other"):
            await env.wait_for(lambda n=n: env.condition(n, "ConfigValid").get("status") == "True",
                               what=f"{n} recovered")
        # the prefetch Job succeeds: the Deployment may start
        await env.patch("batch/v1/jobs", "default", job["metadata"]["name"], {"status": {"succeeded": 1}},
                        sub="status")
        await env.wait_for(lambda: replicas(env, "big") == 1, what="released")
        await env.wait_for(lambda: env.condition("big", "Cached").get("reason") == "PrefetchSucceeded")
        assert env.status("big")["cache"] == {"strategy": "SharedPVC", "ready": True, "pvcName": "big-cache",
                                              "jobName": "big-cache-prefetch", "jobPhase": "Succeeded",
                                              "message": "meta/llama is in PVC big-cache"}
        await env.delete(MODELS, "default", "big")
        await env.wait_for(lambda: env.get(MODELS, "big") is None)
        assert env.get("batch/v1/jobs", "big-cache-prefetch") is None
        assert env.get("v1/persistentvolumeclaims", "big-cache") is None
