"""Names and replicas from the cluster: aliases, service labels, LoRA adapters, shared groups, the
max_tokens clamp, session affinity across replica changes, and which addresses count as ready."""

from __future__ import annotations

import asyncio

from flexinfer._speedups import HashRing
from flexinfer.proxy.routing import RING_VNODES
from tests.runtime.kube.conftest import (
    ADAPTERS,
    DEPLOYMENTS,
    MODELS,
    NODES,
    NS,
    SERVICES,
    SLICES,
    KubeStack,
    model_obj,
    service_obj,
    slice_obj,
)


async def test_aliases_labels_adapters_and_clamp_route_to_the_right_model(ks: KubeStack) -> None:
    stub = await ks.stub()
    rt = await ks.start()
    await ks.put(MODELS, model_obj("m2", ready=True, config={"servedModelName": "org/served", "maxModelLen": 2048},
                                   litellm={"servedModelName": "big", "aliases": ["a2"]}, serviceLabels=["textgen"]))
    await ks.put(MODELS, model_obj("other", ready=True))
    await ks.serve("m2", [stub])
    await ks.serve("other", [stub])
    await ks.put(ADAPTERS, {"apiVersion": "ai.flexinfer/v1alpha2", "kind": "LoRAAdapter",
                            "metadata": {"name": "sql", "namespace": NS},
                            "spec": {"modelRef": "m2", "adapterName": "sql-lora",
                                     "source": {"type": "HuggingFace", "uri": "org/sql-lora"}}})
    await ks.until(lambda: rt.resolve("sql-lora") and rt.resolve("m2").ready, what="m2 ready")  # type: ignore[union-attr]
    for name in ("m2", "big", "a2", "textgen"):
        status, body, _ = await ks.chat(name)
        assert status == 200 and body["model"] == "org/served", name  # rewritten to the served name
    status, body, _ = await ks.chat("sql-lora")
    assert status == 200 and body["model"] == "sql-lora"  # the adapter: body untouched, sent to the parent
    assert rt.resolve("sql-lora").name == "m2"  # type: ignore[union-attr]
    status, body, headers = await ks.chat("m2", max_tokens=5000)
    assert status == 200 and headers["X-FlexInfer-MaxTokens-Clamped"] == "5000->1536"
    assert b'"max_tokens":1536' in stub.requests[-1].body
    status, body, _ = await ks.chat("nope")
    assert status == 404
    data = {d["id"]: d for d in (await ks.get_json("/v1/models"))["data"]}
    assert set(data) == {"m2", "other"}  # adapters and labels are names, not models
    m2 = data["m2"]
    assert m2["aliases"] == ["big", "a2"] and m2["service_labels"] == ["textgen"]
    assert m2["served_name"] == "org/served" and m2["lora_adapters"] == ["sql-lora"] and m2["ready"] is True
    assert m2["replicas"] == 1 and m2["gpu_priority"] == 100


async def test_shared_group_label_goes_to_the_active_member(ks: KubeStack) -> None:
    stub = await ks.stub()
    rt = await ks.start()
    for name, active in (("g1", "chat"), ("g2", "")):
        await ks.put(MODELS, model_obj(name, ready=True, gpu={"shared": "grp"}, serviceLabels=["chat"],
                                       config={"servedModelName": f"served-{name}"}))
        await ks.serve(name, [stub], annotations={"ai.flexinfer/active-services": active,
                                                  "flexinfer.ai/service-labels": "chat"})
    await ks.until(lambda: rt.resolve("chat"), what="label")
    assert (await ks.chat("chat"))[1]["model"] == "served-g1"
    # the operator swaps the group: g2 becomes active and claims the label
    await ks.put(SERVICES, service_obj("g1", annotations={"ai.flexinfer/active-services": ""}))
    await ks.put(SERVICES, service_obj("g2", annotations={"ai.flexinfer/active-services": "chat"}))
    await ks.until(lambda: rt.resolve("chat") and rt.resolve("chat").name == "g2", what="label moved")  # type: ignore[union-attr]
    assert (await ks.chat("chat"))[1]["model"] == "served-g2"
    data = {d["id"]: d for d in (await ks.get_json("/v1/models"))["data"]}
    assert data["g1"]["gpu_shared"] == "grp"


async def test_session_affinity_moves_keys_only_as_the_ring_allows(ks: KubeStack) -> None:
    stubs = [await ks.stub() for _ in range(4)]
    rt = await ks.start()
    await ks.put(MODELS, model_obj("ms", ready=True, annotations={"flexinfer.ai/routing": "session-affinity"}))
    await ks.serve("ms", stubs[:3])
    await ks.until(lambda: rt.resolve("ms") and len(rt.resolve("ms").endpoints) == 3)  # type: ignore[union-attr]
    sessions = [f"session-{i}" for i in range(60)]

    async def placement() -> dict[str, str]:
        out = {}
        for s in sessions:
            status, _, headers = await ks.chat("ms", headers={"X-Session-ID": s})
            assert status == 200
            strategy, source, ep = headers["X-Flexinfer-Route"].split(";")
            assert (strategy, source) == ("session-affinity", "session-header")
            out[s] = ep
        return out

    def ring_of(eps: list[str]) -> dict[str, str]:
        ring = HashRing(eps, vnodes=RING_VNODES)  # the router's ring
        return {s: ring.get(s) for s in sessions}  # type: ignore[misc]

    keys = [f"127.0.0.1:{s.port}" for s in stubs]
    before = await placement()
    assert before == ring_of(keys[:3]) and len(set(before.values())) == 3
    # a replica is added: keys move only to it
    await ks.put(SLICES, slice_obj("ms-3", "ms", [("127.0.0.1", stubs[3])]))
    await ks.until(lambda: len(rt.resolve("ms").endpoints) == 4)  # type: ignore[union-attr]
    grown = await placement()
    assert grown == ring_of(keys)
    moved = {s for s in sessions if grown[s] != before[s]}
    assert moved and all(grown[s] == keys[3] for s in moved)
    # a replica goes away (its pod is no longer ready): only its keys move
    await ks.put(SLICES, slice_obj("ms-0", "ms", [("127.0.0.1", stubs[0])], ready=False))
    await ks.until(lambda: len(rt.resolve("ms").endpoints) == 3)  # type: ignore[union-attr]
    shrunk = await placement()
    assert shrunk == ring_of(keys[1:])
    assert all(shrunk[s] == grown[s] for s in sessions if grown[s] != keys[0])
    assert keys[0] not in shrunk.values()


async def test_only_ready_addresses_off_spot_nodes_count(ks: KubeStack) -> None:
    stub = await ks.stub()
    rt = await ks.start()
    await ks.put(MODELS, model_obj("m", ready=True))
    await ks.put(SERVICES, service_obj("m"))
    await ks.put(SLICES, {**slice_obj("m-a", "m", [("127.0.0.1", stub)], node="n1"),
                          "endpoints": [
                              {"addresses": ["127.0.0.1"], "conditions": {"ready": True}, "nodeName": "n1"},
                              {"addresses": ["10.9.9.1"], "conditions": {"ready": False}, "nodeName": "n1"},
                              {"addresses": ["10.9.9.2"], "conditions": {"ready": True, "terminating": True}},
                              {"addresses": ["10.9.9.3"], "conditions": {"ready": True}, "nodeName": "spot"},
                          ]})
    await ks.put(NODES, {"apiVersion": "v1", "kind": "Node",
                         "metadata": {"name": "spot", "labels": {"flexinfer.ai/spot-terminating": "true"}}})
    await ks.until(lambda: rt.resolve("m") and [e.key for e in rt.resolve("m").endpoints]  # type: ignore[union-attr]
                   == [f"127.0.0.1:{stub.port}"], what="only the ready address off the spot node")
    status, _, _ = await ks.chat("m")
    assert status == 200
    # the spot node is no longer going away: its label goes. A real apiserver then sends DELETED to a
    # watch with a label selector; the emulator does not, so force a re-list (410) to see it
    await ks.put(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "spot", "labels": {}}})
    ks.kube.expire_resource_versions()
    await ks.kube.close_watches()
    await ks.until(lambda: len(rt.resolve("m").endpoints) == 2, timeout=5, what="spot address back")  # type: ignore[union-attr]


async def test_all_namespaces_names_and_shadowing(ks: KubeStack) -> None:
    rt = await ks.start(all_namespaces=True)
    await ks.put(MODELS, model_obj("hidden", litellm={"enabled": False}))
    await ks.put(DEPLOYMENTS, {"apiVersion": "ai.flexinfer/v1alpha1", "kind": "ModelDeployment",
                               "metadata": {"name": "m", "namespace": NS}, "spec": {"model": "legacy"}})
    await ks.put(DEPLOYMENTS, {"apiVersion": "ai.flexinfer/v1alpha1", "kind": "ModelDeployment",
                               "metadata": {"name": "old", "namespace": NS}, "spec": {"model": "legacy"}})
    await ks.put(MODELS, model_obj("m", ns=NS))
    await ks.put(MODELS, model_obj("x", ns="team"))
    await ks.put(MODELS, model_obj("m", ns="team"))
    await ks.until(lambda: rt.resolve("team/m") and rt.resolve("team/x") and rt.resolve("old"))
    assert rt.resolve("m").name == "m"  # type: ignore[union-attr]  # the home namespace keeps the plain name
    assert rt.resolve("m").metadata["kind"] == "Model"  # type: ignore[union-attr]  # a Model shadows an MD
    assert rt.resolve("x").name == "team/x"  # type: ignore[union-attr]  # a unique name elsewhere is an alias
    assert rt.resolve("hidden") is None  # litellm.enabled: false
    ids = [d["id"] for d in (await ks.get_json("/v1/models"))["data"]]
    assert ids == ["m", "old", "team/m", "team/x"]


async def test_a_held_lora_request_keeps_its_body(ks: KubeStack) -> None:
    stub = await ks.stub()
    rt = await ks.start()
    await ks.put(MODELS, model_obj("base", config={"servedModelName": "org/base"}))
    await ks.put(ADAPTERS, {"apiVersion": "ai.flexinfer/v1alpha2", "kind": "LoRAAdapter",
                            "metadata": {"name": "sql", "namespace": NS},
                            "spec": {"modelRef": "base", "adapterName": "sql-lora",
                                     "source": {"type": "HuggingFace", "uri": "org/sql-lora"}}})
    await ks.until(lambda: rt.resolve("sql-lora"), what="adapter")
    held = asyncio.create_task(ks.chat("sql-lora"))
    await ks.until(lambda: ks.kube.write_count("models.ai.flexinfer/status", "PATCH") == 1, what="wake")
    await ks.serve("base", [stub])
    await ks.set_ready("base")
    status, body, _ = await asyncio.wait_for(held, 5)
    assert status == 200 and body["model"] == "sql-lora"


async def test_scheduler_annotation_binds_the_ring_and_a_bad_one_falls_back(ks: KubeStack) -> None:
    stubs = [await ks.stub() for _ in range(3)]
    rt = await ks.start()
    ann = {"flexinfer.ai/routing": "scored", "flexinfer.ai/scheduler": "session-affinity:5,least-request:1"}
    await ks.put(MODELS, model_obj("sc", ready=True, annotations=ann))
    await ks.serve("sc", stubs)
    await ks.until(lambda: rt.resolve("sc") and len(rt.resolve("sc").endpoints) == 3)  # type: ignore[union-attr]
    view = rt.resolve("sc")
    assert view is not None and view.routing == "scored" and view.scheduler == ann["flexinfer.ai/scheduler"]
    ring = HashRing([f"127.0.0.1:{s.port}" for s in stubs], vnodes=RING_VNODES)  # the router's ring
    sessions = [f"user-{i}" for i in range(24)]
    for s in sessions:  # the scorer reads the model's ring: the session-affinity strategy's placement
        status, _, headers = await ks.chat("sc", headers={"X-Session-ID": s})
        assert status == 200
        strategy, _, ep = headers["X-Flexinfer-Route"].split(";")
        assert strategy == "scored" and ep == ring.get(s), s
    doc = await ks.get_json("/debug/endpoints")
    sc = next(m for m in doc["models"] if m["name"] == "sc")
    assert sc["scheduler_error"] is None and sc["last_pick"]["key"] == ring.get(sessions[-1])
    assert set(sc["endpoints"][0]["last_scores"]) == {"session-affinity", "least-request"}
    # an annotation the scheduler cannot read: the default chain serves, the reason is shown
    await ks.put(MODELS, model_obj("sc", ready=True, annotations={**ann, "flexinfer.ai/scheduler": "fastest:1"}))
    await ks.until(lambda: rt.resolve("sc").scheduler == "fastest:1")  # type: ignore[union-attr]
    for s in sessions[:5]:
        status, _, headers = await ks.chat("sc", headers={"X-Session-ID": s})
        assert status == 200 and headers["X-Flexinfer-Route"].startswith("scored;")
    sc = next(m for m in (await ks.get_json("/debug/endpoints"))["models"] if m["name"] == "sc")
    assert "unknown scorer 'fastest'" in sc["scheduler_error"]
    assert set(sc["endpoints"][0]["last_scores"]) == {"least-request", "least-latency", "prefix-cache"}
