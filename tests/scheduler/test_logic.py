"""Pure extender logic: filter reasons, the score formula, normalisation, and properties."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flexinfer import labels
from flexinfer.labels import bench_key
from flexinfer.scheduler import logic
from flexinfer.scheduler.logic import NodeFacts, PodFacts, ScoreInputs
from flexinfer.scheduler.settings import ExtenderSettings, load_extender_settings
from flexinfer.settings import SettingsError
from tests.scheduler.helpers import make_node, make_pod

S = ExtenderSettings()


# ---- parsing ----------------------------------------------------------------------------------------------


def test_node_facts_parse_and_defaults() -> None:
    f = logic.node_facts(make_node("n", free=12000, util=55, kv=0.5, cost=3, count=2))
    assert (f.vendor, f.arch, f.vram_gi, f.count, f.free_mb, f.util, f.kv, f.cost) == (
        "NVIDIA", "sm_89", 24.0, 2, 12000.0, 55.0, 0.5, 3.0)
    assert f.device_class == "vendor=NVIDIA,arch=sm_89,vram=24Gi,count=2,int4=true"
    bad = make_node("b", vram="lots", count=None)
    bad["metadata"]["annotations"] = {labels.GPU_UTIL: "nan", labels.KV_CACHE_USAGE: "7",
                                      labels.GPU_FREE_MEMORY: "x"}
    f = logic.node_facts(bad)
    assert (f.vram_gi, f.count, f.util, f.kv, f.free_mb) == (None, 1, 0.0, 1.0, None)
    assert logic.node_facts({"metadata": "junk"}).name == ""
    assert logic.parse_vram_gi("8192Mi") == 8.0


@pytest.mark.parametrize(("pod", "expected"), [
    (make_pod(gpus=None), (1, None)),
    (make_pod(gpus=2), (2, labels.RESOURCE_NVIDIA_GPU)),
    (make_pod(gpus=1, resource=labels.RESOURCE_AMD_GPU), (1, labels.RESOURCE_AMD_GPU)),
    ({"spec": {"containers": [{"resources": {"requests": {"amd.com/gpu": 3}}}]}}, (3, "amd.com/gpu")),
    ({"spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "1"}}},
                              {"resources": {"limits": {"nvidia.com/gpu": "1"}}}],
               "initContainers": [{"resources": {"limits": {"nvidia.com/gpu": "4"}}}]}}, (4, "nvidia.com/gpu")),
    ({"spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "1.5"}}}]}}, (1, None)),
    ({"spec": "junk"}, (1, None)),
])
def test_gpu_request(pod: dict, expected: tuple[int, str | None]) -> None:
    assert logic.gpu_request(pod) == expected


def test_pod_facts() -> None:
    p = logic.pod_facts(make_pod(backend="llama.cpp", vram_mb=8000, gpus=2, pod_labels={"team": "x"}), "team")
    assert (p.backend, p.model, p.vram_estimate_mb, p.gpu_count, p.tenant) == ("llamacpp", "llama3", 8000.0, 2, "x")
    assert logic.pod_facts(make_pod(vram_mb="junk")).vram_estimate_mb is None
    assert logic.pod_facts(make_pod(vram_mb=-5)).vram_estimate_mb is None
    assert logic.pod_facts(make_pod()).tenant == "team-a"
    assert logic.pod_facts({}).namespace == "default"


# ---- filter -------------------------------------------------------------------------------------------------

FILTER_CASES = [
    # (id, pod kwargs, node kwargs, expected codes, unresolvable?)
    ("fits", {}, {}, [], False),
    ("no vendor label", {}, {"vendor": None}, ["no_vendor"], True),
    ("vendor mismatch", {"gpus": 1, "resource": labels.RESOURCE_AMD_GPU}, {"vendor": "NVIDIA"},
     ["vendor_mismatch"], True),
    ("vendor match amd", {"gpus": 1, "resource": labels.RESOURCE_AMD_GPU, "backend": "llamacpp"},
     {"vendor": "AMD", "arch": "gfx1100"}, [], False),
    ("spot", {}, {"spot": True}, ["spot_terminating"], True),
    ("vram enough", {"vram_mb": 8000, "gpus": 2}, {"free": 16000}, [], False),
    ("vram short x count", {"vram_mb": 8000, "gpus": 2}, {"free": 15999}, ["insufficient_vram"], False),
    ("vram unknown passes", {"vram_mb": 8000}, {"free": None}, [], False),
    ("vram zero free fails", {"vram_mb": 1}, {"free": 0}, ["insufficient_vram"], False),
    ("no estimate passes", {"vram_mb": None}, {"free": 0}, [], False),
    ("arch unsupported", {"backend": "vllm"}, {"arch": "sm_52"}, ["arch_unsupported"], True),
    ("arch alias unsupported", {"backend": "comfy"}, {"arch": "sm_50"}, ["arch_unsupported"], True),
    ("arch experimental passes", {"backend": "mlc-llm"}, {"arch": "gfx906"}, [], False),
    ("unknown backend passes", {"backend": "mystery"}, {"arch": "sm_52"}, [], False),
    ("several reasons", {"backend": "vllm", "vram_mb": 9000}, {"arch": "sm_52", "free": 10, "spot": True},
     ["spot_terminating", "insufficient_vram", "arch_unsupported"], True),
]


@pytest.mark.parametrize(("pod_kw", "node_kw", "codes", "hard"), [c[1:] for c in FILTER_CASES],
                         ids=[c[0] for c in FILTER_CASES])
def test_filter_reasons(pod_kw: dict, node_kw: dict, codes: list[str], hard: bool) -> None:
    pod = logic.pod_facts(make_pod(**pod_kw))
    node = logic.node_facts(make_node("n1", **node_kw))
    out = logic.filter_nodes(pod, [node])
    if not codes:
        assert out.passed == ["n1"] and out.failed == {} and out.unresolvable == {}
        return
    assert out.passed == [] and out.codes["n1"] == codes and out.failed["n1"]
    assert ("n1" in out.unresolvable) == hard


def test_filter_messages() -> None:
    pod = logic.pod_facts(make_pod(vram_mb=8000, gpus=2))
    out = logic.filter_nodes(pod, [logic.node_facts(make_node("n", free=1000))])
    assert out.failed["n"] == "insufficient free VRAM: have 1000 MB need 16000 MB"
    out = logic.filter_nodes(pod, [logic.node_facts(make_node("n", vendor=None))])
    assert labels.GPU_VENDOR in out.failed["n"]


# ---- score formula (before normalisation) --------------------------------------------------------------------

SCORE_CASES = [
    # (id, node kwargs, tps, tenant adj, expected raw)
    ("neutral", {}, 0.0, 0.0, 0.0),
    ("tps only", {}, 100.0, 0.0, 70.0),
    ("util", {"util": 50}, 0.0, 0.0, -10.0),
    ("cost", {"cost": 4}, 0.0, 0.0, -0.4),
    ("kv below threshold", {"kv": 0.5}, 0.0, 0.0, -0.15),
    ("kv above threshold", {"kv": 0.95}, 0.0, 0.0, -0.3 * 0.95 - 0.1 * 20),
    ("free ratio half", {"free": 12288, "vram": "24Gi", "count": 1}, 0.0, 0.0, 5.0),
    ("free ratio x count", {"free": 24576, "vram": "24Gi", "count": 2}, 0.0, 0.0, 5.0),
    ("free ratio clamped", {"free": 1e9, "vram": "24Gi"}, 0.0, 0.0, 10.0),
    ("free without vram", {"free": 1000, "vram": None}, 0.0, 0.0, 0.0),
    ("tenant adj", {}, 0.0, 2.5, 2.5),
    ("everything", {"util": 10, "cost": 1, "kv": 0.9, "free": 6144, "vram": "24Gi"}, 50.0, -1.0,
     35 - 2 - 0.1 - 0.27 + 2.5 - 0.05 * 20 - 1.0),
]


@pytest.mark.parametrize(("node_kw", "tps", "adj", "expected"), [c[1:] for c in SCORE_CASES],
                         ids=[c[0] for c in SCORE_CASES])
def test_raw_score_formula(node_kw: dict, tps: float, adj: float, expected: float) -> None:
    node = logic.node_facts(make_node("n", **node_kw))
    assert logic.raw_score(node, tps, S, adj) == pytest.approx(expected)


def test_weights_from_env() -> None:
    s = load_extender_settings({"SCHED_TPS_WEIGHT": "2", "SCHED_UTIL_WEIGHT": "0", "SCHED_VRAM_FREE_WEIGHT": "1",
                                "SCHED_TENANT_FAIRSHARE_ENABLED": "true", "SCHED_TENANT_FAIRSHARE_BUDGET_GPUS": "4",
                                "SCHED_TENANT_FAIRSHARE_WEIGHT": "8", "BENCHMARK_RESULTS_CONFIGMAP": "bench"})
    assert (s.tps_weight, s.util_weight, s.vram_free_weight, s.benchmark_configmap) == (2.0, 0.0, 1.0, "bench")
    node = logic.node_facts(make_node("n", util=90))
    assert logic.raw_score(node, 10.0, s) == pytest.approx(20.0)
    assert logic.tenant_adjustment(s, 1.0) == pytest.approx((1 - 1 / 4) * 8)
    assert logic.tenant_adjustment(S, 1.0) == 0.0  # disabled by default
    with pytest.raises(SettingsError):
        load_extender_settings({"SCHED_TENANT_FAIRSHARE_ENABLED": "1", "SCHED_TENANT_FAIRSHARE_BUDGET_GPUS": "0"})
    with pytest.raises(SettingsError):
        load_extender_settings({"SCHED_TPS_WEIGHT": "heavy"})


def test_tps_lookup_global_then_fallback() -> None:
    pod = logic.pod_facts(make_pod(backend="vllm", model="m1"))
    fast = logic.node_facts(make_node("fast", arch="sm_90"))
    slow = logic.node_facts(make_node("slow", arch="sm_80"))
    other = logic.node_facts(make_node("other", arch="sm_75"))
    bench = {bench_key("vllm", "m1", fast.device_class): "120.5", bench_key("vllm", "m1", slow.device_class): "30",
             bench_key("vllm", "m1", other.device_class): "garbage"}
    assert logic.node_tps(pod, fast, bench, None) == 120.5
    assert logic.node_tps(pod, other, bench, 7.0) == 7.0  # unreadable → deployment fallback
    assert logic.node_tps(pod, other, None, None) == 0.0
    scores = logic.score_nodes(pod, [fast, slow, other], S, ScoreInputs(bench=bench))
    assert scores == {"fast": 10, "slow": 2, "other": 0}


def test_bench_key_format() -> None:
    import hashlib
    k = bench_key("vllm", "m", "vendor=NVIDIA,arch=sm_89,vram=24Gi,count=1,int4=true")
    assert k == "bench_" + hashlib.sha256(b"vllm|m|vendor=NVIDIA,arch=sm_89,vram=24Gi,count=1,int4=true").hexdigest()[:16]


# ---- normalisation -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("raw", "expected"), [
    ({}, {}),
    ({"a": 3.0}, {"a": 10}),
    ({"a": 1.0, "b": 1.0}, {"a": 10, "b": 10}),
    ({"a": 0.0, "b": 10.0}, {"a": 0, "b": 10}),
    ({"a": 0.0, "b": 0.5, "c": 1.0}, {"a": 0, "b": 5, "c": 10}),
    ({"a": 0.0, "b": 0.25, "c": 1.0}, {"a": 0, "b": 3, "c": 10}),  # 2.5 rounds half up
    ({"a": -100.0, "b": -99.0, "c": 50.0}, {"a": 0, "b": 0, "c": 10}),
    ({"a": float("nan"), "b": 1.0, "c": 2.0}, {"a": 0, "b": 0, "c": 10}),
    # a subnormal span (hypothesis found it: a cost of 2.2250738585e-313): 10 / span overflows
    ({"a": 0.0, "b": 2.2250738585e-313}, {"a": 0, "b": 10}),
    ({"a": 0.0, "b": 5e-324, "c": 1e-323}, {"a": 0, "b": 5, "c": 10}),
])
def test_normalise(raw: dict, expected: dict) -> None:
    assert logic.normalise(raw) == expected


# ---- properties -------------------------------------------------------------------------------------------

_names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=12)
_num = st.one_of(st.none(), st.floats(min_value=-1e6, max_value=1e6, allow_nan=False),
                 st.sampled_from(["nan", "inf", "junk", "", "-1"]))


@st.composite
def node_dicts(draw: st.DrawFn, name: str) -> dict:
    node = make_node(
        name,
        vendor=draw(st.sampled_from([None, "NVIDIA", "AMD", "nvidia", ""])),
        arch=draw(st.sampled_from([None, "sm_52", "sm_89", "gfx906", "gfx1100", "weird"])),
        vram=draw(st.sampled_from([None, "24Gi", "16Gi", "8192Mi", "junk", "0Gi"])),
        count=draw(st.sampled_from([None, 0, 1, 2, 8])),
        spot=draw(st.booleans()),
    )
    ann = node["metadata"]["annotations"]
    for key in (labels.GPU_FREE_MEMORY, labels.GPU_UTIL, labels.KV_CACHE_USAGE, labels.COST):
        v = draw(_num)
        if v is not None:
            ann[key] = str(v)
    return node


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[dict, list[dict]]:
    names = draw(st.lists(_names, min_size=1, max_size=25, unique=True))
    nodes = [draw(node_dicts(n)) for n in names]
    pod = make_pod(backend=draw(st.sampled_from([None, "vllm", "llamacpp", "comfyui", "mlc-llm", "odd"])),
                   model=draw(st.sampled_from([None, "m1"])),
                   vram_mb=draw(st.sampled_from([None, 0, 1000, 16000, 80000, "junk"])),
                   gpus=draw(st.sampled_from([None, 1, 2, 4])),
                   resource=draw(st.sampled_from(list(labels.GPU_RESOURCES))))
    return pod, nodes


PROP = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROP
@given(scenarios(), st.randoms(use_true_random=False))
def test_property_scores_in_range_and_order_independent(sc: tuple[dict, list[dict]], rnd: random.Random) -> None:
    pod_d, nodes_d = sc
    pod = logic.pod_facts(pod_d)
    facts = [logic.node_facts(n) for n in nodes_d]
    bench = {bench_key("vllm", "m1", f.device_class): str(i * 7.5) for i, f in enumerate(facts)}
    inputs = ScoreInputs(bench=bench, fallback_tps=3.0, tenant_used_gpus=1.0)
    scores = logic.score_nodes(pod, facts, S, inputs)
    assert set(scores) == {f.name for f in facts}
    assert all(isinstance(v, int) and 0 <= v <= 10 for v in scores.values())
    assert max(scores.values()) == 10
    shuffled = facts[:]
    rnd.shuffle(shuffled)
    assert logic.score_nodes(pod, shuffled, S, inputs) == scores
    raw = logic.raw_scores(pod, facts, S, inputs)
    assert all(math.isfinite(v) for v in raw.values())


@PROP
@given(scenarios(), st.randoms(use_true_random=False))
def test_property_filter_partitions_and_order_independent(sc: tuple[dict, list[dict]], rnd: random.Random) -> None:
    pod_d, nodes_d = sc
    pod = logic.pod_facts(pod_d)
    facts = [logic.node_facts(n) for n in nodes_d]
    out = logic.filter_nodes(pod, facts)
    names = {f.name for f in facts}
    assert set(out.passed) | set(out.failed) == names
    assert not set(out.passed) & set(out.failed)
    assert all(isinstance(r, str) and r for r in out.failed.values())
    assert set(out.unresolvable) <= set(out.failed)
    for f in facts:  # the filter's fast path and the detailed check agree
        assert (check_node := logic.check_node(pod, f)) == [] or f.name in out.failed
        assert (f.name in out.passed) == (check_node == [])
    shuffled = facts[:]
    rnd.shuffle(shuffled)
    again = logic.filter_nodes(pod, shuffled)
    assert set(again.passed) == set(out.passed)
    assert again.failed == out.failed and again.unresolvable == out.unresolvable


def test_duplicate_node_names_first_wins() -> None:
    pod = logic.pod_facts(make_pod())
    a = NodeFacts(name="n", vendor="NVIDIA")
    b = NodeFacts(name="n", vendor=None)
    assert logic.filter_nodes(pod, [a, b]).passed == ["n"]
    assert list(logic.score_nodes(PodFacts(), [a, b], S)) == ["n"]
