"""Scale from zero through the kube runtime: held requests, one demand patch, release on the watch event."""

from __future__ import annotations

import asyncio

import openai
import pytest

from tests.kube_emulator import KubeEnv
from tests.runtime.kube.conftest import (
    DEPLOYMENTS,
    GROUPS,
    MODELS,
    MSG,
    NS,
    KubeStack,
    fast_settings,
    model_obj,
)

STATUS = "models.ai.flexinfer/status"


async def test_model_appears_then_a_cold_burst_is_held_patched_once_and_released(ks: KubeStack) -> None:
    kube: KubeEnv = ks.kube
    stub = await ks.stub()
    await ks.start()
    await ks.put(MODELS, model_obj("m1", config={"servedModelName": "served-m1"}))
    listed = await ks.until(lambda: ks.runtime and ks.runtime.resolve("m1"), what="m1 listed")
    assert not listed.ready
    data = (await ks.get_json("/v1/models"))["data"]
    (entry,) = [d for d in data if d["id"] == "m1"]
    assert entry["ready"] is False and entry["backend"] == "vllm" and entry["phase"] == "Idle"
    assert entry["served_model_name"] == "served-m1" and entry["kind"] == "Model" and entry["gpu_shared"] == ""

    client = ks.client()
    burst = [asyncio.create_task(client.chat.completions.create(model="m1", messages=MSG))  # type: ignore[arg-type]
             for _ in range(50)]
    await ks.until(lambda: kube.write_count(STATUS, "PATCH") >= 1, what="the demand patch")
    await asyncio.sleep(0.3)
    assert not any(t.done() for t in burst) and not stub.requests  # held
    assert ks.obj(MODELS, "m1")["status"]["lastActiveTime"]
    # endpoints alone do not release: the Model must say Ready too (and vice versa)
    await ks.serve("m1", [stub])
    await ks.until(lambda: ks.runtime.resolve("m1").endpoints, what="endpoints")  # type: ignore[union-attr]
    await asyncio.sleep(0.1)
    assert not any(t.done() for t in burst)
    await ks.set_ready("m1")
    results = await asyncio.wait_for(asyncio.gather(*burst), 10)
    assert [r.choices[0].message.content for r in results] == ["hello from stub"] * 50
    assert {r.model for r in results} == {"served-m1"}  # the body's model was rewritten
    assert len(stub.requests) == 50
    assert kube.write_count(STATUS, "PATCH") == 1  # exactly one demand patch for the burst
    assert kube.write_count("models.ai.flexinfer", "PATCH") == 1  # and nothing else written
    # warm now: served at once, still no new patch (at most one a minute)
    out = await client.chat.completions.create(model="m1", messages=MSG)  # type: ignore[arg-type]
    assert out.choices[0].message.content == "hello from stub"
    assert kube.write_count(STATUS, "PATCH") == 1


async def test_heartbeat_while_a_request_is_open(ks: KubeStack) -> None:
    from dataclasses import replace

    from tests.runtime.kube.conftest import FAST

    stub = await ks.stub()
    await ks.start(timings=replace(FAST, heartbeat_interval=0.3))
    await ks.put(MODELS, model_obj("m", ready=True))
    await ks.serve("m", [stub])
    await ks.until(lambda: ks.runtime.resolve("m") and ks.runtime.resolve("m").ready)  # type: ignore[union-attr]
    status, _, _ = await ks.chat("m", headers={"x-stub-delay": "1.1"})
    assert status == 200
    n = ks.kube.write_count(STATUS, "PATCH")
    assert 3 <= n <= 5  # the first request's patch, then one per 0.3 s while it was open
    await asyncio.sleep(0.5)
    assert ks.kube.write_count(STATUS, "PATCH") == n  # nothing while idle (within the minute)


async def test_unauthenticated_requests_never_wake(ks: KubeStack) -> None:
    await ks.start(settings=fast_settings(auth_enabled=True, auth_tokens=("secret",)))
    await ks.put(MODELS, model_obj("m"))
    await ks.until(lambda: ks.runtime.resolve("m"))  # type: ignore[union-attr]
    with pytest.raises(openai.AuthenticationError):
        await ks.client("wrong").chat.completions.create(model="m", messages=MSG)  # type: ignore[arg-type]
    status, _, _ = await ks.chat("m")
    assert status == 401
    await asyncio.sleep(0.2)
    assert ks.kube.write_count() == 0
    held = asyncio.create_task(ks.client("secret").chat.completions.create(model="m", messages=MSG))  # type: ignore[arg-type]
    await ks.until(lambda: ks.kube.write_count(STATUS, "PATCH") == 1, what="the authenticated wake")
    held.cancel()
    await asyncio.gather(held, return_exceptions=True)


async def test_failed_model_fails_fast_with_its_reason(ks: KubeStack) -> None:
    await ks.start()
    obj = model_obj("bad", phase="Failed")
    obj["status"]["conditions"] = [{"type": "Ready", "status": "False", "reason": "NoMatchingNodes",
                                    "message": "no GPU node matches", "lastTransitionTime": "2025-01-01T00:00:00Z"}]
    await ks.put(MODELS, obj)
    await ks.until(lambda: ks.runtime.resolve("bad"))  # type: ignore[union-attr]
    status, body, _ = await ks.chat("bad")
    assert status == 503 and body["error"]["code"] == "activation_failed"
    assert "NoMatchingNodes" in body["error"]["message"]
    assert ks.kube.write_count() == 0


async def test_patch_conflicts_are_retried_and_rbac_errors_are_readable(ks: KubeStack) -> None:
    rt = await ks.start()
    await ks.put(MODELS, model_obj("m"))
    await ks.put(MODELS, model_obj("n"))
    view = await ks.until(lambda: rt.resolve("m"))
    ks.kube.inject("PATCH", r"/models/m/status$", status=409, times=2)
    await rt.wake(view)
    assert ks.kube.write_count(STATUS, "PATCH") == 3
    assert ks.obj(MODELS, "m")["status"]["lastActiveTime"]
    ks.kube.inject("PATCH", r"/models/n/status$", status=403, times=10)
    with pytest.raises(RuntimeError, match="may not patch models/status default/n"):
        await rt.wake(rt.resolve("n"))  # type: ignore[arg-type]
    assert ks.kube.write_count(STATUS, "PATCH") == 4  # a 403 is not retried


async def test_model_deployment_wake_sets_replicas_and_access_time(ks: KubeStack) -> None:
    stub = await ks.stub()
    await ks.start()
    await ks.put(DEPLOYMENTS, {"apiVersion": "ai.flexinfer/v1alpha1", "kind": "ModelDeployment",
                               "metadata": {"name": "md", "namespace": NS},
                               "spec": {"backend": "ollama", "model": "llama3:8b", "replicas": 0},
                               "status": {"phase": "Pending"}})
    await ks.until(lambda: ks.runtime.resolve("md"))  # type: ignore[union-attr]
    held = asyncio.create_task(ks.chat("md"))
    await ks.until(lambda: ks.obj(DEPLOYMENTS, "md")["spec"]["replicas"] == 1, what="replicas=1")
    assert ks.obj(DEPLOYMENTS, "md")["status"]["lastAccessTime"]
    assert not held.done()
    await ks.serve("md", [stub])
    await ks.set_ready("md", resource=DEPLOYMENTS)
    status, body, _ = await asyncio.wait_for(held, 5)
    assert status == 200 and body["model"] == "llama3:8b"
    assert ks.kube.write_count("modeldeployments.ai.flexinfer/status", "PATCH") == 1
    assert ks.kube.write_count("modeldeployments.ai.flexinfer", "PATCH") == 2  # status + replicas


async def test_gpugroup_member_wake_writes_then_clears_the_queue(ks: KubeStack) -> None:
    stub = await ks.stub()
    await ks.start()
    for name in ("md-a", "md-b"):
        await ks.put(DEPLOYMENTS, {"apiVersion": "ai.flexinfer/v1alpha1", "kind": "ModelDeployment",
                                   "metadata": {"name": name, "namespace": NS},
                                   "spec": {"backend": "ollama", "model": f"{name}:1b", "replicas": 0,
                                            "gpuGroupRef": "g"}})
    await ks.put(GROUPS, {"apiVersion": "ai.flexinfer/v1alpha1", "kind": "GPUGroup",
                          "metadata": {"name": "g", "namespace": NS},
                          "spec": {"models": [{"name": "md-a"}, {"name": "md-b"}]},
                          "status": {"phase": "Active", "activeModel": "md-b"}})
    view = await ks.until(lambda: ks.runtime.resolve("md-a"))  # type: ignore[union-attr]
    assert view.metadata["gpu_group"] == "g" and view.cold_start_timeout == 120.0

    def ann() -> dict[str, str]:
        return ks.obj(GROUPS, "g")["metadata"].get("annotations") or {}

    first = asyncio.create_task(ks.chat("md-a"))
    await ks.until(lambda: ann().get("flexinfer.ai/queue.md-a") == "1", what="queue annotation")
    assert ann()["flexinfer.ai/queue-since.md-a"].endswith("Z")
    more = [asyncio.create_task(ks.chat("md-a")) for _ in range(2)]
    await ks.until(lambda: ann().get("flexinfer.ai/queue.md-a") == "3", what="queue depth 3")
    assert ks.obj(DEPLOYMENTS, "md-a")["spec"]["replicas"] == 0  # the group decides replicas
    assert ks.obj(DEPLOYMENTS, "md-a")["status"]["lastAccessTime"]
    # the group controller swaps: md-a becomes active, its pod ready
    await ks.edit(GROUPS, "g", lambda o: o["status"].update(activeModel="md-a"))
    await ks.serve("md-a", [stub])
    await ks.set_ready("md-a", resource=DEPLOYMENTS)
    results = await asyncio.wait_for(asyncio.gather(first, *more), 5)
    assert [r[0] for r in results] == [200, 200, 200]
    await ks.until(lambda: not any(k.startswith("flexinfer.ai/queue") for k in ann()), what="cleared")
