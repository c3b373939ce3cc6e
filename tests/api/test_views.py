"""Typed views of the other eight kinds, the shared helpers (durations, quantities, times,
conditions) and the runtime validator."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from flexinfer.api import (
    Cluster,
    Condition,
    FederatedModel,
    GlobalProxy,
    GPUGroup,
    LoRAAdapter,
    ModelCache,
    ModelCatalog,
    ModelDeployment,
    SpecError,
    format_duration,
    format_time,
    parse_duration,
    parse_quantity,
    parse_time,
    set_condition,
)
from flexinfer.api.conditions import conditions_to_list, find_condition, parse_conditions
from flexinfer.api.federation import LabelSelector
from flexinfer.api.schema import obj, string
from flexinfer.api.validate import defaults_of, validate, validate_lenient


def o(kind: str, spec: Any, **extra: Any) -> dict[str, Any]:
    return {"kind": kind, "metadata": {"name": "x", "namespace": "ns"}, "spec": spec, **extra}


def err(fn, *a) -> SpecError:
    with pytest.raises(SpecError) as e:
        fn(*a)
    return e.value


# ---- durations, quantities, times ------------------------------------------------------------------

@pytest.mark.parametrize(("text", "seconds"), [
    ("0", 0.0), ("30s", 30.0), ("5m", 300.0), ("1h", 3600.0), ("1h30m", 5400.0), ("1.5h", 5400.0),
    ("250ms", 0.25), ("2m30s", 150.0), ("100us", 1e-4), ("10ns", 1e-8), (" 5m ", 300.0), (90, 90.0), (1.5, 1.5),
])
def test_parse_duration(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("bad", ["", "5", "5 m", "-5m", "5min", "1d", "m", "1h-5m", True, -1, None, [1]])
def test_parse_duration_rejects(bad):
    e = err(parse_duration, bad)
    assert e.reason == "InvalidSpec" and "duration" in e.message


@pytest.mark.parametrize(("seconds", "text"), [(0, "0"), (30, "30s"), (300, "5m"), (5400, "1h30m"), (3661, "1h1m1s"),
                                               (0.25, "250ms")])
def test_format_duration_roundtrips(seconds, text):
    assert format_duration(seconds) == text
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(("q", "value"), [("50Gi", 50 * 2**30), ("100m", Decimal("0.1")), ("1e3", 1000), ("5k", 5000),
                                          ("2", 2), (3, 3), ("1.5Gi", int(1.5 * 2**30)), ("512Mi", 2**29)])
def test_parse_quantity(q, value):
    assert parse_quantity(q) == value


@pytest.mark.parametrize("bad", ["", "50GB", "Gi", "1.2.3", True, "-"])
def test_parse_quantity_rejects(bad):
    assert err(parse_quantity, bad).reason == "InvalidSpec"


def test_times():
    dt = parse_time("2025-07-01T12:00:00Z")
    assert dt == datetime(2025, 7, 1, 12, tzinfo=UTC)
    assert parse_time("2025-07-01T14:00:00+02:00") == dt
    assert format_time(dt) == "2025-07-01T12:00:00Z"
    assert format_time(datetime(2025, 7, 1, 12, 0, 0, 999)) == "2025-07-01T12:00:00Z"
    assert err(parse_time, "yesterday").reason == "InvalidSpec"


# ---- conditions ------------------------------------------------------------------------------------

def test_set_condition_keeps_transition_time_unless_status_changes():
    t0, t1, t2 = (datetime(2025, 1, 1, tzinfo=UTC) + timedelta(minutes=i) for i in range(3))
    conds = set_condition((), Condition("Ready", "False", "StartingBackend", "", observed_generation=1), t0)
    assert conds[0].last_transition_time == t0
    conds = set_condition(conds, Condition("Ready", "False", "CacheNotReady", "waiting", observed_generation=2), t1)
    assert conds[0].last_transition_time == t0 and conds[0].reason == "CacheNotReady"
    conds = set_condition(conds, Condition("Schedulable", "True", "Schedulable"), t1)
    conds = set_condition(conds, Condition("Ready", "True", "BackendReady", observed_generation=2), t2)
    assert [c.type for c in conds] == ["Ready", "Schedulable"]
    ready = find_condition(conds, "Ready")
    assert ready is not None and ready.is_true and ready.last_transition_time == t2
    out = conditions_to_list(conds)
    assert out[0] == {"type": "Ready", "status": "True", "reason": "BackendReady", "message": "",
                      "lastTransitionTime": "2025-01-01T00:02:00Z", "observedGeneration": 2}
    assert parse_conditions(out) == conds


# ---- validator ---------------------------------------------------------------------------------------

SCHEMA = obj("t", {"a": string("a", default="x", enum=["x", "y"]), "b": obj("b", {"c": string("c", default="d")})},
             required=["a"])


def test_validator_defaults_prunes_and_reports_paths():
    assert validate(SCHEMA, {}) == {"a": "x"}
    assert validate(SCHEMA, {"b": {}, "zzz": 1}) == {"a": "x", "b": {"c": "d"}}
    assert validate(SCHEMA, {"a": None}) == {"a": "x"}
    e = err(validate, SCHEMA, {"a": "z"})
    assert e.message == "spec.a: 'z' is not one of x, y"
    assert err(validate, SCHEMA, {"b": 3}).message == "spec.b: expected an object, got integer"
    assert validate_lenient(SCHEMA, {"a": "z", "b": {"c": 1}}) == {"a": "x", "b": {"c": "d"}}
    assert validate_lenient(SCHEMA, "nope") is None
    assert defaults_of(SCHEMA) == {"a": "x"}


# ---- LoRAAdapter, ModelCatalog -------------------------------------------------------------------------

def test_lora():
    lo = LoRAAdapter.from_obj(o("LoRAAdapter", {"modelRef": "llama", "adapterName": "sql",
                                                "source": {"type": "HuggingFace", "uri": "org/sql"}},
                                status={"phase": "Loaded", "loadedReplicas": 2, "totalReplicas": 2}))
    assert (lo.spec.model_ref, lo.spec.adapter_name, lo.spec.source_type, lo.spec.preload) == ("llama", "sql",
                                                                                               "HuggingFace", False)
    assert lo.status.phase == "Loaded" and lo.status.loaded_replicas == 2
    assert err(LoRAAdapter.from_obj, o("LoRAAdapter", {"modelRef": "m", "adapterName": "a"})).reason == "InvalidSpec"
    bad = {"modelRef": "m", "adapterName": "a", "source": {"type": "S3", "uri": "x"}}
    assert "spec.source.type" in err(LoRAAdapter.from_obj, o("LoRAAdapter", bad)).message


def test_catalog():
    c = ModelCatalog.from_obj(o("ModelCatalog", {"registries": [{"type": "Ollama"}, {"type": "OCI", "url": "ghcr.io/x",
                                                                                     "secretRef": {"name": "s"}}]}))
    assert c.spec.sync_interval_s == 3600.0 and c.spec.registries[1].secret_name == "s"
    assert "OCI registries need url" in err(ModelCatalog.from_obj, o("ModelCatalog", {"registries": [{"type": "OCI"}]})).message
    assert "at least 1" in err(ModelCatalog.from_obj, o("ModelCatalog", {"registries": []})).message


# ---- federation ----------------------------------------------------------------------------------------

def test_cluster():
    c = Cluster.from_obj(o("Cluster", {"apiEndpoint": "https://k.example:6443", "secretRef": {"name": "kc"}}))
    assert (c.spec.probe_interval_s, c.spec.secret_name, c.spec.secret_key) == (30.0, "kc", None)
    e = err(Cluster.from_obj, o("Cluster", {"apiEndpoint": "http://k.example", "secretRef": {"name": "kc"}}))
    assert "spec.apiEndpoint" in e.message
    assert "secretRef" in err(Cluster.from_obj, o("Cluster", {"apiEndpoint": "https://k"})).message


FED_TEMPLATE = {"backend": "ollama", "source": "ollama://llama3", "gpu": {}}


def test_federated_model():
    f = FederatedModel.from_obj(o("FederatedModel", {"template": FED_TEMPLATE, "placement": {"clusters": ["a"]}}))
    assert f.spec.template.backend == "ollama" and f.spec.template.gpu.count == 1
    assert f.spec.template_raw["gpu"]["priority"] == 100  # defaulted copy for remote clusters
    assert f.spec.placement.replicas_per_cluster == 1 and f.spec.routing.strategy == "RoundRobin"
    assert f.spec.placement.cluster_selector is None
    for placement, routing, needle in [
        ({}, None, "clusters or clusterSelector"),
        ({"clusters": ["a"]}, {"strategy": "Weighted"}, "needs weights"),
        ({"clusters": ["a"]}, {"strategy": "Failover"}, "needs failoverOrder"),
    ]:
        spec = {"template": FED_TEMPLATE, "placement": placement, **({"routing": routing} if routing else {})}
        assert needle in err(FederatedModel.from_obj, o("FederatedModel", spec)).message
    bad = {"template": {**FED_TEMPLATE, "backend": "nope"}, "placement": {"clusters": ["a"]}}
    e = err(FederatedModel.from_obj, o("FederatedModel", bad))
    assert e.reason == "UnknownBackend" and "spec.template.backend" in e.message


@pytest.mark.parametrize(("selector", "labels", "want"), [
    ({}, {"a": "1"}, True),
    ({"matchLabels": {"region": "eu"}}, {"region": "eu", "x": "y"}, True),
    ({"matchLabels": {"region": "eu"}}, {"region": "us"}, False),
    ({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["edge", "core"]}]}, {"tier": "edge"}, True),
    ({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["edge"]}]}, {}, False),
    ({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["edge"]}]}, {}, True),
    ({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["edge"]}]}, {"tier": "edge"}, False),
    ({"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}, {"gpu": ""}, True),
    ({"matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]}, {"gpu": ""}, False),
])
def test_label_selector(selector, labels, want):
    assert LabelSelector.from_dict(selector).matches(labels) is want


def test_global_proxy():
    clusters = [{"name": "a", "endpoint": "https://a"}, {"name": "b", "endpoint": "http://b:8080"}]
    g = GlobalProxy.from_obj(o("GlobalProxy", {"clusters": clusters}))
    assert (g.spec.strategy, g.spec.probe_path, g.spec.probe_timeout_s, g.spec.probe_interval_s) == (
        "RoundRobin", "/healthz", 2.0, 15.0)
    for spec, needle in [
        ({"clusters": [*clusters, {"name": "a", "endpoint": "https://c"}]}, "duplicate"),
        ({"clusters": clusters, "strategy": "Failover"}, "needs failoverOrder"),
        ({"clusters": clusters, "strategy": "Failover", "failoverOrder": ["a", "z"]}, "only name clusters"),
        ({"clusters": clusters, "strategy": "Failover", "failoverOrder": ["a", "a"]}, "duplicate"),
        ({"clusters": clusters, "strategy": "Latency", "failoverOrder": ["a"]}, "Latency"),
        ({"clusters": []}, "at least 1"),
        ({"clusters": clusters, "externalEndpoint": "https://x.example"}, "externalEndpoint"),
        ({"clusters": [{"name": "a", "endpoint": "ftp://a"}]}, "endpoint"),
    ]:
        assert needle in err(GlobalProxy.from_obj, o("GlobalProxy", spec)).message, spec


# ---- v1alpha1 ------------------------------------------------------------------------------------------

def test_modeldeployment_defaults():
    md = ModelDeployment.from_obj(o("ModelDeployment", {"model": "llama3:8b"}))
    s = md.spec
    assert (s.backend, s.replicas, s.min_replicas, s.idle_timeout_s, s.cold_start_timeout_s, s.priority) == (
        "ollama", 1, 0, 300.0, 60.0, 100)
    assert (s.benchmark.warmup_iterations, s.benchmark.min_duration_s, s.benchmark.batch_size,
            s.benchmark.iterations) == (2, 30.0, 128, 5)
    assert (s.gpu_vendor, s.gpu_count) == ("cpu", 0)
    assert ModelDeployment.from_obj(o("ModelDeployment", {"model": "m", "backend": ""})).spec.backend == "ollama"


def test_modeldeployment_backend_blocks_map_to_config():
    s = ModelDeployment.from_obj(o("ModelDeployment", {
        "model": "Qwen/Qwen3-8B", "backend": "vllm", "resources": {"limits": {"nvidia.com/gpu": 2}},
        "vllm": {"tensorParallelSize": 2, "maxModelLen": 8192, "trustRemoteCode": True},
        "mlcllm": {"mode": "server"}})).spec
    assert s.backend_config() == {"tensorParallelSize": 2, "maxModelLen": 8192, "trustRemoteCode": True}
    assert (s.gpu_vendor, s.gpu_count) == ("nvidia", 2)
    s = ModelDeployment.from_obj(o("ModelDeployment", {
        "model": "/models/phi", "backend": "mlc", "mlcllm": {"jitPolicy": "READONLY", "compileOptions": "x",
                                                             "overrides": {"prefillChunkSize": 1024, "raw": "a=1"}}})).spec
    assert s.backend == "mlc-llm"
    assert s.backend_config() == {"jitPolicy": "READONLY", "prefillChunkSize": 1024, "overridesRaw": "a=1"}


@pytest.mark.parametrize(("spec", "reason", "needle"), [
    ({}, "InvalidSpec", "spec.model: required"),
    ({"model": "m", "backend": "tgi"}, "UnknownBackend", "tgi"),
    ({"model": "m", "coldStartTimeoutSeconds": 5}, "InvalidSpec", "coldStartTimeoutSeconds"),
    ({"model": "m", "benchmark": {"minDuration": "soon"}}, "InvalidSpec", "minDuration"),
    ({"model": "m", "serviceLabels": [f"s{i}" for i in range(11)]}, "InvalidSpec", "serviceLabels"),
])
def test_modeldeployment_errors(spec, reason, needle):
    e = err(ModelDeployment.from_obj, o("ModelDeployment", spec))
    assert e.reason == reason and needle in e.message


def test_modelcache():
    c = ModelCache.from_obj(o("ModelCache", {"source": "huggingface://Qwen/Qwen3-8B"},
                              status={"phase": "Ready", "readyNodes": 1}))
    s = c.spec
    assert (s.storage_strategy, s.storage_strategy_raw, s.storage_size, s.eviction_policy,
            s.eviction_threshold_percent, s.retention_priority) == ("SharedPVC", "Auto", "50Gi", "LRU", 85, 50)
    assert s.flash_loader is None and s.quantization is None and c.status.ready
    c = ModelCache.from_obj(o("ModelCache", {"source": "oci://r/m", "flashLoader": {}, "quantization": {"format": "GGUF"}}))
    assert c.spec.flash_loader is not None and c.spec.flash_loader.concurrency == 4
    assert c.spec.flash_loader.enabled is False and c.spec.quantization is not None
    assert "storageStrategy" in err(ModelCache.from_obj, o("ModelCache", {"source": "HF://a/b",
                                                                          "storageStrategy": "Ephemeral"})).message
    assert "spec.source" in err(ModelCache.from_obj, o("ModelCache", {"source": "s3://x"})).message


def test_gpugroup():
    g = GPUGroup.from_obj(o("GPUGroup", {"models": [{"name": "a"}, {"name": "b", "namespace": "other", "priority": 7}]},
                            status={"activeModel": "a", "swapCount": 3,
                                    "modelStatuses": [{"name": "a", "state": "Active"}]}))
    s = g.spec
    assert [(m.name, m.namespace, m.priority, m.min_replicas, m.max_replicas) for m in s.models] == [
        ("a", "ns", 100, 0, 1), ("b", "other", 7, 0, 1)]
    assert (s.strategy, s.preemption_policy, s.drain_timeout_s, s.auto_cache_models) == ("Exclusive", "Graceful", 60.0,
                                                                                        False)
    at = s.anti_thrashing
    assert (at.enabled, at.minimum_run_duration_s, at.cooldown_after_preemption_s, at.request_queue_threshold,
            at.hysteresis_window_s) == (True, 30.0, 60.0, 3, 10.0)
    assert g.status.active_model == "a" and g.status.swap_count == 3 and g.status.model_statuses[0].state == "Active"
    for spec, needle in [
        ({"models": [{"name": "a"}, {"name": "a"}]}, "duplicate"),
        ({"models": [{"name": "a", "minReplicas": 2, "maxReplicas": 1}]}, "minReplicas must not exceed"),
        ({"models": []}, "at least 1"),
        ({"models": [{"name": "a"}], "scalingPolicy": {"strategy": "TimeSliced"}}, "strategy"),
        ({"models": [{"name": "a"}], "scalingPolicy": {"drainTimeoutSeconds": 1}}, "drainTimeoutSeconds"),
    ]:
        assert needle in err(GPUGroup.from_obj, o("GPUGroup", spec)).message, spec
