"""The Cluster and FederatedModel controllers with three Kubernetes API emulators: the hub (``kube``,
where the real operator runs) and two members (``tests/operator/federation_env.py``), each a real
HTTP server; a member is stopped and started again on its port to stand for a cluster going away."""

from __future__ import annotations

import base64
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from flexinfer import labels
from tests.kube_emulator import KubeEnv
from tests.operator.federation_env import (
    CLUSTERS,
    FEDERATED,
    SECRETS,
    Member,
    cluster,
    federated,
    kubeconfig_secret,
    members,
)
from tests.operator.harness import NODES, TEST_SETTINGS, OperatorEnv, gpu_node, run_operator

ROOT = Path(__file__).resolve().parents[2]
MEMBER_MODELS = "ai.flexinfer/v1alpha2/models"
SETTINGS = replace(TEST_SETTINGS, federation_resync_s=0.3, federation_cleanup_timeout_s=2.5)


def cstatus(env: OperatorEnv, name: str) -> dict[str, Any]:
    return env.status(name, resource=CLUSTERS)


def fstatus(env: OperatorEnv, name: str) -> dict[str, Any]:
    return env.status(name, resource=FEDERATED)


def entry(env: OperatorEnv, fm: str, c: str) -> dict[str, Any]:
    return next((e for e in fstatus(env, fm).get("clusters") or () if e.get("cluster") == c), {})


def cond(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or () if c.get("type") == type_), {})


async def add_cluster(env: OperatorEnv, m: Member, **labels_: str) -> None:
    await env.create(SECRETS, kubeconfig_secret(f"{m.name}-kubeconfig", m.kubeconfig()))
    await env.create(CLUSTERS, cluster(m.name, f"{m.name}-kubeconfig", **labels_))


async def set_member_phase(m: Member, name: str, phase: str) -> None:
    body = m.model(name)
    assert body is not None
    body["status"] = {"phase": phase}
    await m.kube.upsert(MEMBER_MODELS, body)


async def test_probe_placement_steady_state_outage_and_deletion(kube: KubeEnv, tmp_path: Path) -> None:
    async with members(tmp_path, "east", "west") as ms, run_operator(kube, SETTINGS) as env:
        east, west = ms["east"], ms["west"]
        east.kube.seed(NODES, gpu_node("gpu-1"))
        east.kube.seed(NODES, gpu_node("gpu-2"))
        east.kube.seed(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "cpu-1"},
                               "status": {"capacity": {"cpu": "8"}}})
        await add_cluster(env, east, region="eu-west", tier="edge")
        await add_cluster(env, west, region="us-west")

        # -- clusters probed Ready: version, latency, GPU capacity of the labelled nodes
        for m in (east, west):
            await env.wait_for(lambda m=m: cstatus(env, m.name).get("phase") == "Ready", 10, f"{m.name} Ready")
        st = cstatus(env, "east")
        assert st["serverVersion"] == "v1.26.4+k3s1" and st["probeLatencyMs"] >= 0
        assert st["capacity"] == {"nvidia.com/gpu": "2"} and cstatus(env, "west").get("capacity") == {}
        assert cond(st, "Ready") == {**cond(st, "Ready"), "status": "True", "reason": "Probed"}

        # -- a selector lands the Model on the matching member only
        await env.create(FEDERATED, federated("llama", selector={"matchLabels": {"region": "eu-west"}},
                                              replicasPerCluster=2))
        await env.wait_for(lambda: east.model("llama"), 10, "the copy on east")
        copy_ = east.model("llama")
        assert copy_ is not None and west.model("llama") is None
        assert copy_["metadata"]["labels"][labels.FEDERATED_MODEL] == "llama"
        assert copy_["metadata"]["annotations"][labels.FEDERATION_OWNER] == "default/llama"
        assert copy_["spec"]["serverless"]["minReplicas"] == 2 and copy_["spec"]["backend"] == "ollama"
        await env.wait_for(lambda: fstatus(env, "llama").get("totalClusters") == 1, 5, "totalClusters 1")
        assert entry(env, "llama", "east")["phase"] == "Pending" and fstatus(env, "llama")["readyClusters"] == 0
        assert labels.FINALIZER_FEDERATION in env.get(FEDERATED, "llama")["metadata"]["finalizers"]

        # -- the member Model becomes Ready: the FederatedModel says so
        await set_member_phase(east, "llama", "Ready")
        await env.wait_for(lambda: fstatus(env, "llama").get("readyClusters") == 1, 5, "readyClusters 1")
        e = entry(env, "llama", "east")
        assert e["readyReplicas"] == 2 and e["totalReplicas"] == 2
        assert cond(fstatus(env, "llama"), "Ready")["status"] == "True"

        # -- steady state: members are read on every resync, never written; the hub's statuses unchanged
        await env.settle(0.5)
        writes = (east.model_writes(), west.model_writes(), kube.write_count("federatedmodels.ai.flexinfer"),
                  kube.write_count("clusters.ai.flexinfer"))
        reads, probes = east.kube.request_count("models.ai.flexinfer", "GET"), west.kube.request_count(
            "/version", "GET")
        await env.wait_for(lambda: east.kube.request_count("models.ai.flexinfer", "GET") >= reads + 5
                           and west.kube.request_count("/version", "GET") >= probes + 5, 15, "resyncs and probes")
        assert (east.model_writes(), west.model_writes(), kube.write_count("federatedmodels.ai.flexinfer"),
                kube.write_count("clusters.ai.flexinfer")) == writes

        # -- the latency moves for real (each /version answered 0.3 s late): the median follows, one write
        before = cstatus(env, "east")["probeLatencyMs"]
        east.kube.inject("GET", r"^/version$", delay=0.3, times=1000)
        await env.wait_for(lambda: cstatus(env, "east")["probeLatencyMs"] >= 250, 10, "the latency written")
        assert before < 250 and cstatus(env, "east")["phase"] == "Ready"
        east.emulator.faults.clear()

        # -- a named cluster joins the placement
        await env.patch(FEDERATED, "default", "llama", {"spec": {"placement": {"clusters": ["west"]}}})
        await env.wait_for(lambda: west.model("llama"), 10, "the copy on west")
        await env.wait_for(lambda: fstatus(env, "llama").get("totalClusters") == 2, 5, "totalClusters 2")
        await env.create(FEDERATED, federated("phi", clusters=["east", "west"]))
        await env.wait_for(lambda: east.model("phi") and west.model("phi"), 10, "phi on both")

        # -- west stops: Unreachable, reported by the FederatedModel; east is untouched
        await west.stop()
        await env.wait_for(lambda: cstatus(env, "west").get("phase") == "Unreachable", 10, "west Unreachable")
        assert cond(cstatus(env, "west"), "Ready")["reason"] == "Unreachable"
        await env.wait_for(lambda: entry(env, "llama", "west").get("phase") == "Unreachable", 5, "entry Unreachable")
        synced = cond(fstatus(env, "llama"), "Synced")
        assert synced["status"] == "False" and synced["reason"] == "MemberUnreachable" and "west" in synced["message"]
        assert entry(env, "llama", "east")["phase"] == "Ready" and fstatus(env, "llama")["readyClusters"] == 1

        # -- deleting "phi" while west is down: east's copy goes, west is retried (said so), then given up
        await env.delete(FEDERATED, "default", "phi")
        await env.wait_for(lambda: east.model("phi") is None, 5, "east copy of phi removed")
        await env.wait_for(lambda: cond(fstatus(env, "phi"), "Synced").get("reason") == "CleanupPending", 5,
                           "CleanupPending")
        assert "west" in cond(fstatus(env, "phi"), "Synced")["message"]
        await env.wait_for(lambda: env.get(FEDERATED, "phi") is None, 10, "phi released after the window")
        ev = await env.wait_for(lambda: [e for e in env.events("phi") if e["reason"] == "CleanupIncomplete"], 5,
                                "the CleanupIncomplete Event")
        assert "west" in ev[0]["message"] and ev[0]["type"] == "Warning"

        # -- west comes back: Ready again, the FederatedModel sees its copy again
        await west.start()
        await env.wait_for(lambda: cstatus(env, "west").get("phase") == "Ready", 10, "west Ready again")
        await env.wait_for(lambda: entry(env, "llama", "west").get("phase") == "Pending", 5, "entry back")
        assert cond(fstatus(env, "llama"), "Synced")["status"] == "True"
        assert west.model("phi") is not None  # left behind, as the Event says

        # -- deletion removes the copies on both members, then the finalizer
        await env.delete(FEDERATED, "default", "llama")
        await env.wait_for(lambda: env.get(FEDERATED, "llama") is None, 10, "FederatedModel gone")
        assert east.model("llama") is None and west.model("llama") is None


async def test_foreign_model_invalid_kubeconfigs_unauthorized_and_the_examples(kube: KubeEnv,
                                                                               tmp_path: Path) -> None:
    async with members(tmp_path, "east", "west", "edge") as ms, run_operator(kube, SETTINGS) as env:
        east, west = ms["east"], ms["west"]
        await check_examples(env, ms["edge"])
        foreign = east.kube.seed(MEMBER_MODELS, {"apiVersion": "ai.flexinfer/v1alpha2", "kind": "Model",
                                                 "metadata": {"name": "llama", "namespace": "default"},
                                                 "spec": {"backend": "vllm", "source": "HF://someone/else"}})
        await add_cluster(env, east)
        await add_cluster(env, west)
        # broken credentials: no Secret, a Secret that is not a kubeconfig, one that would run a command
        await env.create(CLUSTERS, cluster("nosecret", "missing"))
        await env.create(SECRETS, kubeconfig_secret("garbage", "{not: [yaml"))
        await env.create(CLUSTERS, cluster("garbage", "garbage"))
        cfg = json.loads(west.kubeconfig())
        cfg["users"] = [{"name": "emulator", "user": {"exec": {"command": "/bin/sh", "apiVersion": "v1"}}}]
        await env.create(SECRETS, kubeconfig_secret("execs", json.dumps(cfg)))
        await env.create(CLUSTERS, cluster("execs", "execs"))

        await env.create(FEDERATED, federated("llama", clusters=["east", "west"]))
        await env.wait_for(lambda: entry(env, "llama", "east").get("phase") == "Conflict", 10, "east Conflict")
        await env.wait_for(lambda: entry(env, "llama", "west").get("phase") == "Pending", 10, "west copy")
        # the foreign Model is left alone: no write reached it, its spec is the user's
        assert east.model_writes() == 0 and east.model("llama")["spec"] == foreign["spec"]  # type: ignore[index]
        synced = cond(fstatus(env, "llama"), "Synced")
        assert synced["status"] == "False" and synced["reason"] == "ForeignModel"
        await env.wait_for(lambda: any(ev["reason"] == "ForeignModel" for ev in env.events("llama")), 5, "Event")

        for name, reason, text in (("nosecret", "SecretNotFound", "Secret default/missing not found"),
                                   ("garbage", "KubeconfigInvalid", "not YAML"),
                                   ("execs", "KubeconfigInvalid", "may not run commands")):
            await env.wait_for(lambda name=name: cstatus(env, name).get("phase") == "Invalid", 10, f"{name} Invalid")
            c = cond(cstatus(env, name), "Ready")
            assert c["status"] == "False" and c["reason"] == reason and text in c["message"], c

        # the missing Secret appears: noticed at the next probe, without an event on the Cluster
        await env.create(SECRETS, kubeconfig_secret("missing", west.kubeconfig()))
        await env.wait_for(lambda: cstatus(env, "nosecret").get("phase") == "Ready", 10, "nosecret Ready")

        # refused credentials: Unauthorized
        from tests.kube_rbac import Policy

        west.kube.authorize(Policy.from_objects(()))
        await env.create(SECRETS, kubeconfig_secret("badtoken", west.kubeconfig(token="wrong")))
        await env.create(CLUSTERS, cluster("badtoken", "badtoken"))
        await env.wait_for(lambda: cstatus(env, "badtoken").get("phase") == "Unauthorized", 10, "Unauthorized")
        assert "401" in cond(cstatus(env, "badtoken"), "Ready")["message"]


async def check_examples(env: OperatorEnv, edge: Member) -> None:
    """examples/v1alpha2/cluster.yaml and federatedmodel.yaml as written (the Secret points at a member)."""
    cl = yaml.safe_load((ROOT / "examples/v1alpha2/cluster.yaml").read_text())
    fm = yaml.safe_load((ROOT / "examples/v1alpha2/federatedmodel.yaml").read_text())
    cl["metadata"]["namespace"] = fm["metadata"]["namespace"] = "default"
    ref = cl["spec"]["secretRef"]
    await env.create(SECRETS, kubeconfig_secret(ref["name"], edge.kubeconfig(), key=ref["key"]))
    await env.create(CLUSTERS, cl)
    await env.create(FEDERATED, fm)
    await env.wait_for(lambda: cstatus(env, "edge-1").get("phase") == "Ready", 10, "edge-1 Ready")
    await env.wait_for(lambda: edge.model("qwen3-4b"), 10, "the copy on edge-1")

    copy_ = edge.model("qwen3-4b")
    assert copy_ is not None and copy_["spec"]["config"]["ggufFile"] == "Qwen3-4B-Q4_K_M.gguf"
    # placement.clusters names "core", which does not exist: reported, edge-1 still served
    await env.wait_for(lambda: entry(env, "qwen3-4b", "edge-1").get("phase") == "Pending", 5, "edge-1 entry")
    st = fstatus(env, "qwen3-4b")
    assert st["totalClusters"] == 2 and entry(env, "qwen3-4b", "core")["phase"] == "Unknown"
    assert cond(st, "Synced")["reason"] == "ClusterNotFound"
    # the printer columns (kubectl get fmodel) show the aggregate: a server-side Table
    await env._call("/version", "GET")  # opens env.api
    table = await env.api.call_api(
        "/apis/ai.flexinfer/v1alpha2/namespaces/default/federatedmodels/qwen3-4b", "GET",
        header_params={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"},
        response_types_map={200: "object"}, auth_settings=["BearerToken"], _return_http_data_only=True)
    names = [c["name"] for c in table["columnDefinitions"]]
    cells = dict(zip(names, table["rows"][0]["cells"], strict=True))
    assert (cells["ReadyClusters"], cells["TotalClusters"]) == (0, 2)


async def examples_scenario(kube: KubeEnv, directory: Path) -> None:
    """The examples on a hub with one member, then their deletion (also run by
    tests/k8s/test_rbac_components.py with the operator as its ServiceAccount under the chart's RBAC)."""
    async with members(directory, "edge") as ms, run_operator(kube, SETTINGS) as env:
        await check_examples(env, ms["edge"])
        await env.delete(FEDERATED, "default", "qwen3-4b")
        await env.wait_for(lambda: ms["edge"].model("qwen3-4b") is None, 10, "the copy removed")
        await env.wait_for(lambda: env.get(FEDERATED, "qwen3-4b") is None, 10, "the FederatedModel gone")


def test_kubeconfig_secret_helpers_say_what_is_wrong() -> None:
    from flexinfer.k8s.kubeconfig import KubeconfigError, parse_kubeconfig, secret_value

    good = {"apiVersion": "v1", "kind": "Config", "current-context": "c",
            "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
            "clusters": [{"name": "k", "cluster": {"server": "https://k:6443"}}],
            "users": [{"name": "u", "user": {"token": "t"}}]}
    enc = base64.b64encode(json.dumps(good).encode()).decode()
    assert parse_kubeconfig(secret_value({"data": {"value": enc}}, None))["current-context"] == "c"
    assert secret_value({"data": {"only": enc}}, None) == json.dumps(good)
    cases = [
        (lambda: secret_value({"data": {"a": enc, "b": enc}}, None), "name one in secretRef.key"),
        (lambda: secret_value({"data": {"a": enc}}, "kubeconfig"), "no key 'kubeconfig'"),
        (lambda: secret_value({"data": {"kubeconfig": "%%%"}}, None), "not base64"),
        (lambda: parse_kubeconfig("- a list"), "not a mapping"),
        (lambda: parse_kubeconfig(json.dumps({**good, "current-context": "x"})), "no context named 'x'"),
        (lambda: parse_kubeconfig(json.dumps({**good, "clusters": [{"name": "k", "cluster": {}}]})), "server URL"),
        (lambda: parse_kubeconfig(json.dumps(
            {**good, "users": [{"name": "u", "user": {"tokenFile": "/var/run/token"}}]})), "embed 'token'"),
        (lambda: parse_kubeconfig(json.dumps(
            {**good, "clusters": [{"name": "k", "cluster": {"server": "https://k", "certificate-authority": "/ca"}}]})),
         "certificate-authority-data"),
    ]
    for fn, text in cases:
        with pytest.raises(KubeconfigError, match=text.replace("(", r"\(")):
            fn()


def test_probe_rules() -> None:
    from datetime import UTC, datetime, timedelta

    from flexinfer.operator.cluster import gpu_capacity, needs_write, next_probe

    # backoff while unreachable: doubling from the interval, capped at min(10 x interval, 300 s)
    assert [next_probe(1.0, n) for n in range(6)] == [1.0, 1.0, 2.0, 4.0, 8.0, 10.0]
    assert next_probe(60.0, 9) == 300.0 and next_probe(600.0, 3) == 600.0
    now = datetime(2025, 7, 1, tzinfo=UTC)
    seen = {"phase": "Ready", "probeLatencyMs": 40.0, "lastProbeTime": "2025-07-01T00:00:00Z"}
    later = lambda s: now + timedelta(seconds=s)  # noqa: E731
    desired = {"phase": "Ready", "probeLatencyMs": 120.0, "lastProbeTime": "x"}
    assert not needs_write(desired, seen, 30.0, later(60))  # +80 ms: under the 100 ms floor
    assert needs_write({**desired, "probeLatencyMs": 141.0}, seen, 30.0, later(60))
    assert needs_write({**desired, "phase": "Unreachable"}, seen, 30.0, later(60))
    assert needs_write(desired, seen, 30.0, later(300))  # the heartbeat
    nodes = [gpu_node("a"), gpu_node("b", "amd"),
             {"metadata": {"name": "c", "labels": {"flexinfer.ai/gpu.vendor": "NVIDIA", "flexinfer.ai/gpu.count": "4"}}},
             {"metadata": {"name": "d", "labels": {}}, "status": {"capacity": {"nvidia.com/gpu": "8"}}}]
    assert gpu_capacity(nodes) == {"amd.com/gpu": "1", "nvidia.com/gpu": "5"}


def test_placement_and_copy_rules() -> None:
    from flexinfer.api.federation import FederatedModelSpec
    from flexinfer.operator.federation import member_model, owned, targets

    body = federated("m", clusters=["core"], selector={"matchExpressions": [
        {"key": "tier", "operator": "In", "values": ["edge"]}]}, replicasPerCluster=3)
    body["metadata"]["uid"] = "u1"
    spec = FederatedModelSpec.from_dict(body["spec"])
    cls = {"a": cluster("a", "s", tier="edge"), "b": cluster("b", "s", tier="core"), "z": cluster("z", "s", tier="edge")}
    assert targets(spec, cls) == ["a", "core", "z"]
    m = member_model(body, spec)
    assert m["spec"]["serverless"] == {"minReplicas": 3} and owned(m, "default/m") and not owned(m, "other/m")
    body["spec"]["template"]["serverless"] = {"minReplicas": 0}  # the template's own value wins
    assert member_model(body, FederatedModelSpec.from_dict(body["spec"]))["spec"]["serverless"]["minReplicas"] == 0
