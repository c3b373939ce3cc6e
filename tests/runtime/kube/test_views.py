"""The pure half of the kube runtime: cluster state -> views -> name index (no API, no proxy)."""

from __future__ import annotations

from typing import Any

from flexinfer.cli import main as cli_main
from flexinfer.runtime.kube import KubeRuntime
from flexinfer.runtime.kubeviews import MODEL, SERVICE, SLICE, ClusterState, Index, ServiceInfo, SliceInfo
from tests.runtime.kube.conftest import NS, model_obj, service_obj, slice_obj


def _runtime() -> KubeRuntime:
    return KubeRuntime(NS)


def _apply(rt: KubeRuntime, kind: str, obj: dict[str, Any], event: str = "ADDED") -> None:
    rt._on_event(kind, event, obj)


def test_incremental_update_keeps_aliases_and_adapters_on_the_new_view() -> None:
    rt = _runtime()
    seen: list[str] = []
    rt.subscribe(lambda v: seen.append(f"{v.name}:{v.ready}"))
    _apply(rt, MODEL, model_obj("m", ready=True, litellm={"aliases": ["a"]}))
    _apply(rt, "LoRAAdapter", {"kind": "LoRAAdapter", "metadata": {"name": "l", "namespace": NS},
                               "spec": {"modelRef": "m", "adapterName": "lora-1",
                                        "source": {"type": "LocalPath", "uri": "/a"}}})
    assert rt.resolve("lora-1").rewrite_model is False  # type: ignore[union-attr]
    index_before = rt._index
    _apply(rt, SERVICE, service_obj("m"))
    _apply(rt, SLICE, slice_obj("m-1", "m", [("10.0.0.1", 8000)]))
    assert rt._index is not index_before and rt._index.names_of is index_before.names_of  # no full re-index
    for name in ("m", "a", "lora-1"):
        v = rt.resolve(name)
        assert v is not None and v.ready and [e.key for e in v.endpoints] == ["10.0.0.1:8000"], name
    assert rt.resolve("lora-1").rewrite_model is False and rt.resolve("a").rewrite_model is True  # type: ignore[union-attr]
    assert seen == ["m:False", "m:False", "m:True"]  # added, its adapter list grew, the slice made it ready
    _apply(rt, MODEL, model_obj("m", ready=True), "DELETED")
    assert rt.resolve("m") is None and rt.resolve("a") is None and rt.resolve("lora-1") is None
    assert list(rt.models()) == []


def test_name_ranks_and_label_claims() -> None:
    st = ClusterState(NS)
    st.apply(MODEL, "ADDED", model_obj("zeta", serviceLabels=["textgen"], litellm={"aliases": ["alpha"]}))
    st.apply(MODEL, "ADDED", model_obj("alpha", serviceLabels=["textgen"]))
    st.apply(MODEL, "ADDED", model_obj("beta", serviceLabels=["textgen"], gpu={"shared": "g"}))
    entries = [e for k in st.model_keys() if (e := st.build(k)) is not None]
    idx = Index.build(entries)
    assert idx.by_name["alpha"].name == "alpha"  # a canonical name beats an alias
    assert idx.by_name["textgen"].name == "alpha"  # no active member: first by name
    beta = model_obj("beta", serviceLabels=["textgen"], gpu={"shared": "g"})
    beta["status"]["sharedGroup"] = {"groupName": "g", "state": "Active"}
    st.apply(MODEL, "MODIFIED", beta)
    idx = Index.build([e for k in st.model_keys() if (e := st.build(k)) is not None])
    assert idx.by_name["textgen"].name == "beta"  # the active member of the shared group claims first
    assert [v.name for v in idx.ordered] == ["alpha", "beta", "zeta"]


def test_records_of_services_and_slices() -> None:
    svc = ServiceInfo.from_obj({"metadata": {"name": "s", "namespace": NS, "labels": {"flexinfer.ai/model": "m"},
                                             "annotations": {"flexinfer.ai/service-labels": "a, b"}},
                                "spec": {"ports": [{"name": "metrics", "port": 9}, {"name": "http", "port": 80}]}})
    assert (svc.model, svc.port_name, svc.service_labels, svc.active_services) == ("m", "http", ("a", "b"), None)
    sl = SliceInfo.from_obj({"metadata": {"name": "x", "namespace": NS,
                                          "labels": {"kubernetes.io/service-name": "s"}},
                             "endpoints": [{"addresses": ["10.0.0.1"]},  # ready unknown: counts as ready
                                           {"addresses": ["10.0.0.2"], "conditions": {"ready": False}},
                                           {"addresses": []}],
                             "ports": [{"name": "metrics", "port": 9090}, {"name": "http", "port": 8000}]})
    assert sl.addresses == (("10.0.0.1", None),) and sl.port("http") == 8000 and sl.port("nope") == 9090


def test_invalid_model_is_ignored_not_fatal() -> None:
    rt = _runtime()
    _apply(rt, MODEL, {"kind": "Model", "metadata": {"name": "bad", "namespace": NS, "resourceVersion": "1"},
                       "spec": {"backend": "no-such-backend", "source": "HF://x/y"}})
    _apply(rt, MODEL, model_obj("good"))
    assert rt.resolve("bad") is None and rt.resolve("good") is not None


def test_cli_rejects_config_with_kube(capsys: Any) -> None:
    assert cli_main(["proxy", "--kube", "-c", "x.yaml"]) == 2
    assert "not both" in capsys.readouterr().err
