"""Endpoint roles in the kube runtime's views: the ``flexinfer.ai/role`` label of EndpointSlices and
Services (pure view builder, no API)."""

from __future__ import annotations

from typing import Any

from flexinfer.runtime.kubeviews import MODEL, SERVICE, SLICE, ClusterState
from tests.runtime.kube.conftest import NS, model_obj, service_obj, slice_obj


def _labelled(obj: dict[str, Any], role: str) -> dict[str, Any]:
    obj["metadata"]["labels"]["flexinfer.ai/role"] = role
    return obj


def _endpoints(st: ClusterState) -> list[tuple[str, str]]:
    built = st.build((MODEL, NS, "m"))
    assert built is not None
    return [(e.key, e.role) for e in built[0].endpoints]


def test_one_service_per_role_gives_a_disaggregated_view() -> None:
    st = ClusterState(NS)
    st.apply(MODEL, "ADDED", model_obj("m", ready=True))
    st.apply(SERVICE, "ADDED", _labelled(service_obj("m-prefill", model="m"), "prefill"))
    st.apply(SERVICE, "ADDED", _labelled(service_obj("m-decode", model="m"), "decode"))
    # the EndpointSlice controller copies the Service's labels: one slice says it, the other does not
    st.apply(SLICE, "ADDED", _labelled(slice_obj("m-prefill-1", "m-prefill", [("10.0.0.1", 8000)]), "prefill"))
    st.apply(SLICE, "ADDED", slice_obj("m-decode-1", "m-decode", [("10.0.0.2", 8000), ("10.0.0.3", 8000)]))
    assert _endpoints(st) == [("10.0.0.1:8000", "prefill"), ("10.0.0.2:8000", "decode"), ("10.0.0.3:8000", "decode")]
    built = st.build((MODEL, NS, "m"))
    assert built is not None and built[0].disaggregated and built[0].ready


def test_a_slice_label_wins_and_a_bad_label_is_ignored() -> None:
    st = ClusterState(NS)
    st.apply(MODEL, "ADDED", model_obj("m", ready=True))
    st.apply(SERVICE, "ADDED", service_obj("m"))
    st.apply(SLICE, "ADDED", _labelled(slice_obj("m-1", "m", [("10.0.0.1", 8000)]), "prefill"))
    st.apply(SLICE, "ADDED", _labelled(slice_obj("m-2", "m", [("10.0.0.2", 8000)]), "decoder"))
    assert _endpoints(st) == [("10.0.0.1:8000", "prefill"), ("10.0.0.2:8000", "both")]


def test_without_role_labels_nothing_changes() -> None:
    st = ClusterState(NS)
    st.apply(MODEL, "ADDED", model_obj("m", ready=True))
    st.apply(SERVICE, "ADDED", service_obj("m"))
    st.apply(SERVICE, "ADDED", service_obj("m-other", model="m"))  # no role: not added to the model's endpoints
    st.apply(SLICE, "ADDED", slice_obj("m-1", "m", [("10.0.0.1", 8000)]))
    st.apply(SLICE, "ADDED", slice_obj("o-1", "m-other", [("10.0.0.9", 8000)]))
    assert _endpoints(st) == [("10.0.0.1:8000", "both")]
    built = st.build((MODEL, NS, "m"))
    assert built is not None and not built[0].disaggregated
