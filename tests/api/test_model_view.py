"""The typed Model view: defaults as the original applied them, and SpecError reasons."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from flexinfer.api import Model, ModelSpec, SpecError, parse


def spec(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"backend": "vllm", "source": "HF://org/model", "gpu": {}}
    base.update(over)
    return {k: v for k, v in base.items() if v is not None}


def model(**over: Any) -> Model:
    return Model.from_obj({"apiVersion": "ai.flexinfer/v1alpha2", "kind": "Model",
                           "metadata": {"name": "m", "namespace": "ns", "generation": 3}, "spec": spec(**over)})


# ---- defaults ------------------------------------------------------------------------------------

@pytest.mark.parametrize(("backend", "gpu", "vendor", "count", "declared"), [
    ("llamacpp", None, "cpu", 0, False),  # nil gpu means CPU
    ("vllm", {}, "auto", 1, True),  # empty vendor means auto
    ("vllm", {"vendor": ""}, "auto", 1, True),
    ("llamacpp", {"vendor": "cpu"}, "cpu", 0, True),
    ("vllm", {"vendor": "amd", "count": 2}, "amd", 2, True),
    ("ollama", {"vendor": "nvidia"}, "nvidia", 1, True),
])
def test_gpu_defaults(backend, gpu, vendor, count, declared):
    cfg = {"ggufFile": "m.gguf"} if backend == "llamacpp" else None
    g = model(backend=backend, gpu=gpu, config=cfg).spec.gpu
    assert (g.vendor, g.count, g.declared, g.priority, g.swap_cooldown_s) == (vendor, count, declared, 100, 300.0)
    assert g.is_cpu is (vendor == "cpu")


@pytest.mark.parametrize(("backend", "serverless", "enabled", "min_replicas", "idle_s", "cold_s"), [
    ("vllm", None, True, 0, 300.0, 60.0),
    ("diffusers", None, True, 0, 600.0, 60.0),  # image backends idle 10m
    ("comfyui", {}, True, 0, 600.0, 60.0),
    ("vllm-omni", None, True, 0, 600.0, 60.0),
    ("vllm", {"enabled": False}, False, 1, 300.0, 60.0),  # minReplicas 1 when serverless is off
    ("vllm", {"enabled": False, "minReplicas": 3}, False, 3, 300.0, 60.0),
    ("vllm", {"minReplicas": 2, "idleTimeout": "1h30m", "coldStartTimeout": "2m"}, True, 2, 5400.0, 120.0),
    ("vllm", {"idleTimeout": "0"}, True, 0, 0.0, 60.0),
])
def test_serverless_defaults(backend, serverless, enabled, min_replicas, idle_s, cold_s):
    s = model(backend=backend, serverless=serverless).spec.serverless
    assert (s.enabled, s.min_replicas, s.idle_timeout_s, s.cold_start_timeout_s) == (enabled, min_replicas, idle_s,
                                                                                    cold_s)


@pytest.mark.parametrize(("gpu", "cache", "strategy", "explicit", "compile_cache"), [
    ({}, None, "SharedPVC", False, False),
    ({"shared": "g"}, None, "Memory", False, True),  # shared + auto -> compile cache on
    ({"shared": "g", "vendor": "amd"}, None, "Memory", False, True),
    ({"shared": "g", "vendor": "nvidia"}, None, "Memory", False, False),
    ({"shared": "g"}, {"strategy": "Local"}, "Local", True, True),
    ({"shared": "g"}, {"compilationCache": {"enabled": False}}, "Memory", False, False),
    ({"vendor": "nvidia"}, {"compilationCache": {"enabled": True}}, "SharedPVC", False, True),
])
def test_cache_defaults(gpu, cache, strategy, explicit, compile_cache):
    c = model(gpu=gpu, cache=cache).spec.cache
    assert (c.strategy, c.strategy_explicit, c.compilation_cache.enabled) == (strategy, explicit, compile_cache)
    assert c.declared is (cache is not None)
    assert (c.size, c.host_path, c.storage_class) == ("50Gi", "/var/lib/flexinfer/models", None)
    assert c.compilation_cache.host_path == "/var/lib/flexinfer/compile-cache"
    assert c.compilation_cache.size_limit == "2Gi"
    fl = c.flash_loader
    assert (fl.enabled, fl.concurrency, fl.buffer_size_kb, fl.verify_integrity) == (None, 4, 4096, False)
    assert c.local_dir("ns", "m") == "/var/lib/flexinfer/models/ns/m"


def test_litellm_kv_and_capability_defaults():
    s = model().spec
    assert (s.litellm.declared, s.litellm.enabled, s.litellm.aliases) == (False, True, ())
    assert (s.kv_cache.pressure_policy, s.kv_cache.high_watermark, s.kv_cache.low_watermark) == ("Observe", 0.85, 0.6)
    assert s.kv_cache.reconfigure_cooldown_s == 300.0 and not s.kv_cache.declared
    assert s.effective_capabilities.tool_calling is True and s.effective_capabilities.image_generation is False
    s = model(litellm={"enabled": False, "aliases": ["a", "b"]}, capabilities={"toolCalling": False},
              kvCache={"maxBlockSize": 16, "swapSpace": 4}).spec
    assert (s.litellm.declared, s.litellm.enabled, s.litellm.aliases) == (True, False, ("a", "b"))
    assert s.effective_capabilities.tool_calling is False
    assert (s.kv_cache.max_block_size, s.kv_cache.swap_space_gb, s.kv_cache.declared) == (16, 4, True)


def test_backend_alias_source_and_names():
    s = model(backend="llama.cpp", gpu=None, source="HF://org/repo-GGUF",
              config={"ggufFile": "x.gguf", "contextSize": "4096", "mmproj": "mm.gguf"}).spec
    assert s.backend == "llamacpp" and s.backend_def.port == 8080
    assert (s.source.scheme, s.source.ref, s.source.model_id) == ("hf", "org/repo-GGUF", "org/repo-GGUF")
    assert s.served_name == "org/repo-GGUF" and s.context_window == 4096 and s.gguf_file == "x.gguf"
    assert s.effective_capabilities.vision is True
    s = model(config={"servedModelName": "chat", "maxModelLen": 8192}, source="pvc://models/llama/8b").spec
    assert s.served_name == "chat" and s.context_window == 8192
    assert (s.source.pvc_claim, s.source.pvc_path) == ("models", "llama/8b")
    assert model(backend="ollama", source="ollama://llama3:8b").spec.source.model_id == "llama3:8b"
    assert model(source="file:///data/m").spec.source.ref == "/data/m"


def test_resources_tolerations_and_meta():
    m = model(resources={"limits": {"memory": "8Gi", "cpu": 4}}, tolerations=[{"key": "k", "operator": "Exists"}],
              nodeSelector={"node.flexstack.io/gpu-vendor": "amd"}, gpu={"vendor": "amd"})
    assert m.spec.resources.to_k8s() == {"limits": {"memory": "8Gi", "cpu": "4"}}
    assert m.spec.tolerations[0].to_k8s() == {"key": "k", "operator": "Exists"}
    assert (m.name, m.namespace, m.meta.generation, m.meta.key) == ("m", "ns", 3, "ns/m")


def test_config_stays_free_json():
    s = model(config={"speculativeConfig": {"method": "ngram", "n": 3}, "unknownKnob": [1, 2]}).spec
    assert s.config["speculativeConfig"] == {"method": "ngram", "n": 3} and s.config["unknownKnob"] == [1, 2]


def test_spec_is_frozen():
    s = model().spec
    with pytest.raises(AttributeError):
        s.backend = "x"  # type: ignore[misc]
    with pytest.raises(TypeError):
        s.config["x"] = 1  # type: ignore[index]


# ---- SpecError -------------------------------------------------------------------------------------

SEL = "node.flexstack.io/gpu-vendor"


@pytest.mark.parametrize(("over", "reason", "needle"), [
    ({"backend": "tgi"}, "UnknownBackend", "spec.backend"),
    ({"backend": 7}, "InvalidSpec", "spec.backend"),
    ({"source": None}, "InvalidSpec", "spec.source: required"),
    ({"source": "s3://bucket/m"}, "InvalidSpec", "spec.source"),
    ({"source": "file://relative/path"}, "InvalidSource", "absolute"),
    ({"gpu": {"priority": 1001}}, "InvalidSpec", "spec.gpu.priority"),
    ({"gpu": {"priority": "high"}}, "InvalidSpec", "spec.gpu.priority"),
    ({"gpu": {"count": 9}}, "InvalidSpec", "spec.gpu.count"),
    ({"gpu": {"vendor": "intel"}}, "InvalidSpec", "spec.gpu.vendor"),
    ({"gpu": {"vendor": "cpu", "count": 1}, "backend": "llamacpp"}, "InvalidSpec", "vendor cpu"),
    ({"gpu": {"vendor": "cpu", "shared": "g"}, "backend": "llamacpp"}, "InvalidSpec", "vendor cpu"),
    ({"gpu": {"shared": "bad name!"}}, "InvalidSpec", "spec.gpu.shared"),
    ({"resources": {"limits": {"nvidia.com/gpu": 1}}}, "InvalidSpec", "spec.gpu.count"),
    ({"nodeSelector": {SEL: "nvidia"}, "gpu": {"vendor": "amd"}}, "InvalidSpec", "spec.nodeSelector"),
    ({"source": "pvc://c/p", "cache": {"strategy": "Memory"}}, "InvalidSpec", "pvc://"),
    ({"serverless": {"idleTimeout": "5 minutes"}}, "InvalidSpec", "spec.serverless.idleTimeout"),
    ({"serverless": {"minReplicas": 11}}, "InvalidSpec", "spec.serverless.minReplicas"),
    ({"kvCache": {"lowWatermark": 0.9, "highWatermark": 0.5}}, "InvalidSpec", "lowWatermark"),
    ({"serviceLabels": [f"l{i}" for i in range(11)]}, "InvalidSpec", "at most 10"),
    ({"serviceLabels": ["a", "a"]}, "InvalidSpec", "duplicate"),
    ({"cache": {"flashLoader": {"concurrency": 64}}}, "InvalidSpec", "concurrency"),
    ({"gpu": None}, "BackendUnsupported", "no spec.gpu means CPU"),  # vllm on CPU
    ({"backend": "diffusers", "gpu": {"vendor": "cpu"}}, "BackendUnsupported", "diffusers"),
    ({"backend": "llamacpp", "source": "ollama://llama3"}, "InvalidSource", "ollama://"),
    ({"backend": "llamacpp"}, "InvalidConfig", "ggufFile"),
    ({"backend": "llamacpp", "config": {"ggufFile": "model.bin"}}, "InvalidConfig", "ggufFile"),
    ({"backend": "llamacpp", "config": {"ggufFile": "m.gguf", "flashAttention": "maybe"}}, "InvalidConfig",
     "flashAttention"),
    ({"config": {"maxModelLen": "big"}}, "InvalidConfig", "spec.config.maxModelLen"),
    ({"config": {"trustRemoteCode": "perhaps"}}, "InvalidConfig", "trustRemoteCode"),
    ({"config": {"extraArgs": {"a": 1}}}, "InvalidConfig", "extraArgs"),
    ({"config": "x"}, "InvalidSpec", "spec.config"),
])
def test_spec_errors(over, reason, needle):
    with pytest.raises(SpecError) as e:
        model(**over)
    assert e.value.reason == reason, e.value.message
    assert needle in e.value.message
    assert e.value.reason[0].isupper() and " " not in e.value.reason


def test_object_level_errors():
    with pytest.raises(SpecError, match="spec: required") as e:
        Model.from_obj({"kind": "Model", "metadata": {"name": "m"}})
    assert e.value.reason == "InvalidSpec"
    with pytest.raises(SpecError) as e:
        Model.from_obj({"kind": "LoRAAdapter", "metadata": {"name": "m"}, "spec": spec()})
    assert e.value.reason == "WrongKind"
    with pytest.raises(SpecError) as e:
        Model.from_obj({"apiVersion": "other.io/v1", "metadata": {"name": "m"}, "spec": spec()})
    assert e.value.reason == "WrongKind"
    with pytest.raises(SpecError, match=r"metadata\.name"):
        Model.from_obj({"metadata": {}, "spec": spec()})
    with pytest.raises(SpecError) as e:
        parse({"kind": "Pod"})
    assert e.value.reason == "WrongKind"


def test_null_fields_mean_absent_and_unknown_fields_are_pruned():
    s = ModelSpec.from_dict({**spec(), "gpu": {"priority": None}, "serverless": None, "bogus": 1})
    assert s.gpu.priority == 100 and s.serverless.enabled is True


# ---- status ----------------------------------------------------------------------------------------

def test_status_is_parsed_leniently():
    obj = {"kind": "Model", "metadata": {"name": "m", "generation": 2,
                                         "deletionTimestamp": "2025-07-01T10:00:00Z"},
           "spec": spec(),
           "status": {
               "phase": "Exploded",  # not a phase: dropped
               "observedGeneration": 2,
               "lastActiveTime": "2025-07-01T12:00:00Z",
               "conditions": [{"type": "Ready", "status": "True", "reason": "BackendReady",
                               "lastTransitionTime": "2025-07-01T12:00:01Z", "observedGeneration": 2},
                              {"type": "Cached", "status": "maybe"}],  # bad status: dropped
               "metrics": {"tokensPerSecond": 41.5, "avgLatencyMs": "fast"},
               "sharedGroup": {"groupName": "g", "state": "Queued", "queuePosition": 2,
                               "preemptedAt": "2025-07-01T11:00:00Z"},
               "cache": {"ready": True, "strategy": "Memory"},
               "kvCache": {"utilization": 0.7, "pressure": False},
               "surprise": {"x": 1},
           }}
    st = Model.from_obj(obj).status
    assert st.phase is None and st.observed_generation == 2 and st.ready
    assert st.last_active_time == datetime(2025, 7, 1, 12, tzinfo=UTC)
    assert [c.type for c in st.conditions] == ["Ready"]
    assert st.tokens_per_second == 41.5 and st.avg_latency_ms is None
    assert st.shared_group is not None and st.shared_group.queue_position == 2
    assert st.shared_group.preempted_at == datetime(2025, 7, 1, 11, tzinfo=UTC)
    assert st.cache is not None and st.cache.ready and st.kv_utilization == 0.7
    assert Model.from_obj(obj).meta.deleting


def test_status_absent_or_garbage():
    for raw in (None, {}, "garbage", {"conditions": "nope"}):
        obj = {"kind": "Model", "metadata": {"name": "m"}, "spec": spec(), "status": raw}
        st = Model.from_obj(obj).status
        assert st.phase is None and st.conditions == () and not st.ready
