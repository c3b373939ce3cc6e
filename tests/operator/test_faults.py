"""API faults against the real operator: 409 (existing children, stale versions), 500s, 429 with
Retry-After, slow answers past the request timeout, dropped watches. Every case ends consistent with
exactly one child of each kind (reliability plan §3.9 O1-O5, O9)."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from tests.kube_emulator import KubeEnv
from tests.operator.harness import DEPLOYMENTS, MODELS, SERVICES, TEST_SETTINGS, model, run_operator


def count(kube: KubeEnv, resource: str) -> int:
    import kmock

    group_version, plural = resource.rsplit("/", 1)
    group, _, version = group_version.rpartition("/")
    res = kmock.resource(group, version, plural)
    return sum(1 for (r, _, _), o in kube.emulator.objects.items() if r == res and not o.deleted)


async def test_adopts_existing_children(kube: KubeEnv) -> None:
    kube.seed(DEPLOYMENTS, {"apiVersion": "apps/v1", "kind": "Deployment",
                            "metadata": {"name": "m", "namespace": "default", "labels": {"old": "yes"}},
                            "spec": {"replicas": 3, "selector": {"matchLabels": {
                                "app.kubernetes.io/name": "model", "app.kubernetes.io/instance": "m",
                                "app.kubernetes.io/managed-by": "flexinfer", "flexinfer.ai/model": "m",
                                "flexinfer.ai/backend": "ollama"}},
                                "template": {"metadata": {"labels": {}}, "spec": {"containers": [
                                    {"name": "model", "image": "old:1"}]}}}})
    async with run_operator(kube) as env:
        await env.create(MODELS, model("m"))
        await env.wait_for(lambda: env.status("m").get("phase") == "Idle")
        dep = env.get(DEPLOYMENTS, "m")
        assert dep["spec"]["replicas"] == 0 and dep["metadata"]["ownerReferences"][0]["name"] == "m"
        assert dep["spec"]["template"]["spec"]["containers"][0]["image"] == "ollama/ollama:latest"
        assert dep["metadata"]["labels"]["old"] == "yes"  # not ours: left alone
        assert count(kube, DEPLOYMENTS) == 1


async def test_faults_are_retried_without_duplicates(kube: KubeEnv) -> None:
    settings = replace(TEST_SETTINGS, request_timeout_s=1.5)
    slow = kube.inject("POST", r"/deployments$", delay=2.5, times=1)
    err = kube.inject("POST", r"/services$", status=500, times=3)
    limited = kube.inject("PATCH", r"/models/[^/]+/status$", status=429, retry_after=1, times=2)
    conflict = kube.inject("PATCH", r"/models/[^/]+$", status=409, times=1, body={
        "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Conflict", "code": 409,
        "message": "the object has been modified"})
    unavailable = kube.inject("GET", r"/namespaces/default/deployments/", status=503, times=1)
    async with run_operator(kube, settings) as env:
        for i in range(3):
            await env.create(MODELS, model(f"f{i}"))
        for i in range(3):
            await env.wait_for(lambda i=i: env.status(f"f{i}").get("phase") == "Idle", timeout=20,
                               what=f"f{i} Idle")
        await env.settle()
        assert (slow.hits, err.hits, limited.hits, conflict.hits) == (1, 3, 2, 1)
        assert unavailable.hits <= 1
        assert count(kube, DEPLOYMENTS) == 3 and count(kube, SERVICES) == 3
        assert kube.write_count("deployments.apps", "POST") >= 4  # the slow one was sent again
        for i in range(3):
            assert "flexinfer.ai/model-cleanup" in env.get(MODELS, f"f{i}")["metadata"]["finalizers"]
        # deletion through failing deletes
        kube.inject("DELETE", r"/deployments/f0$", status=500, times=3)
        await env.delete(MODELS, "default", "f0")
        await env.wait_for(lambda: env.get(MODELS, "f0") is None, timeout=15, what="f0 deleted")
        assert env.get(DEPLOYMENTS, "f0") is None and env.get(SERVICES, "f0") is None


async def test_dropped_watches_lose_nothing(kube: KubeEnv) -> None:
    async with run_operator(kube) as env:
        for i in range(20):
            await env.create(MODELS, model(f"w{i}"))
            if i in (5, 12):
                await kube.close_watches()
            if i == 9:
                kube.expire_resource_versions()
                await kube.close_watches()
        await env.wait_for(lambda: all(env.status(f"w{i}").get("phase") == "Idle" for i in range(20)),
                           timeout=20, what="all Idle")
        await env.settle()
        assert count(kube, DEPLOYMENTS) == 20 and count(kube, SERVICES) == 20
        await asyncio.sleep(0)
