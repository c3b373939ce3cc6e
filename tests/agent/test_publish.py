"""Desired node labels/annotations and the minimal merge patch (pure)."""

from __future__ import annotations

import pytest

from flexinfer import labels as L
from flexinfer.agent.discovery import GPU
from flexinfer.agent.publish import Desired, desired_state, node_patch, primary_gpus

K = L.DEFAULT_NODE_KEYS


def nv(i: int, total: int = 24576, used: int = 4096, util: float | None = 50.0, arch: str = "sm_89",
       int4: bool = True) -> GPU:
    return GPU(vendor="NVIDIA", index=i, name="RTX 4090", arch=arch, vram_total_mb=total, vram_used_mb=used,
               util_pct=util, int4=int4, source="nvml")


def amd(i: int, total: int = 49152, used: int = 0, arch: str = "gfx1100") -> GPU:
    return GPU(vendor="AMD", index=i, name="W7900", arch=arch, vram_total_mb=total, vram_used_mb=used,
               util_pct=10.0, int4=True, source="amdsmi")


def test_two_nvidia_gpus() -> None:
    d = desired_state([nv(0), nv(1, used=8192, util=30.0)], kv_usage=0.123456, avx512=True)
    assert d == Desired(
        labels={L.GPU_VENDOR: "NVIDIA", L.GPU_COUNT: "2", L.GPU_INT4: "true", L.GPU_VRAM: "24Gi",
                L.GPU_ARCH: "sm_89", L.CPU_AVX512: "true"},
        annotations={L.GPU_FREE_MEMORY: str(20480 + 16384), L.GPU_UTIL: "40", L.KV_CACHE_USAGE: "0.1235"})


def test_no_gpu_publishes_cpu_only() -> None:
    assert desired_state([], kv_usage=None, avx512=False) == Desired(labels={L.CPU_AVX512: "false"})


@pytest.mark.parametrize(("gpus", "expect"), [
    ([nv(0, int4=True), nv(1, arch="sm_75", int4=False, total=16384)], {L.GPU_INT4: "false", L.GPU_ARCH: "sm_89"}),
    ([nv(0, total=16384, arch="sm_75"), nv(1, total=81920, arch="sm_90")], {L.GPU_VRAM: "80Gi", L.GPU_ARCH: "sm_90"}),
    ([nv(0, total=24000)], {L.GPU_VRAM: "23Gi"}),  # MiB // 1024, as the original
    ([GPU(vendor="NVIDIA", index=0, name="x", source="sysfs")], {L.GPU_VRAM: None, L.GPU_ARCH: None,
                                                                 L.GPU_INT4: "false"}),
])
def test_label_rules(gpus: list[GPU], expect: dict[str, str | None]) -> None:
    d = desired_state(gpus, kv_usage=None, avx512=False)
    for k, v in expect.items():
        assert d.labels.get(k) == v


def test_unknown_memory_or_util_leaves_annotations_out() -> None:
    g = GPU(vendor="AMD", index=0, name="x", arch="gfx1100", vram_total_mb=24576, vram_used_mb=None)
    d = desired_state([g], kv_usage=None, avx512=False)
    assert L.GPU_FREE_MEMORY not in d.annotations and L.GPU_UTIL not in d.annotations


def test_kv_is_clamped() -> None:
    assert desired_state([], kv_usage=1.7, avx512=False).annotations == {L.KV_CACHE_USAGE: "1.0000"}


def test_primary_vendor_choice() -> None:
    assert {g.vendor for g in primary_gpus([nv(0), amd(0), amd(1)])} == {"AMD"}  # more GPUs
    assert {g.vendor for g in primary_gpus([nv(0, total=24576), amd(0, total=49152)])} == {"AMD"}  # more VRAM
    assert {g.vendor for g in primary_gpus([nv(0, total=49152), amd(0, total=49152)])} == {"NVIDIA"}  # tie
    assert primary_gpus([]) == []


def test_patch_only_changed_keys_and_foreign_keys_untouched() -> None:
    d = desired_state([nv(0)], kv_usage=None, avx512=True)
    current_labels = {**d.labels, "kubernetes.io/hostname": "n1", L.GPU_COUNT: "3"}
    current_ann = {**d.annotations, L.GPU_UTIL: "99", "other/annotation": "x"}
    assert node_patch(d, current_labels, current_ann) == {
        "metadata": {"labels": {L.GPU_COUNT: "1"}, "annotations": {L.GPU_UTIL: "50"}}}


def test_patch_empty_when_node_is_right() -> None:
    d = desired_state([nv(0)], kv_usage=0.5, avx512=True)
    assert node_patch(d, dict(d.labels), dict(d.annotations)) == {}
    assert node_patch(Desired(), {}, None) == {}


def test_patch_removes_stale_owned_keys() -> None:
    before = desired_state([nv(0)], kv_usage=0.5, avx512=True)
    after = desired_state([], kv_usage=None, avx512=True)  # the GPU went away, no model pods
    patch = node_patch(after, {**before.labels, "x": "y"}, {**before.annotations, "z": "w"})
    assert patch == {"metadata": {
        "labels": {L.GPU_VENDOR: None, L.GPU_COUNT: None, L.GPU_INT4: None, L.GPU_VRAM: None, L.GPU_ARCH: None},
        "annotations": {L.GPU_FREE_MEMORY: None, L.GPU_UTIL: None, L.KV_CACHE_USAGE: None}}}


def test_custom_prefix() -> None:
    keys = L.node_keys("example.com")
    d = desired_state([nv(0)], kv_usage=None, avx512=False, keys=keys)
    assert set(d.labels) == {"example.com/gpu.vendor", "example.com/gpu.count", "example.com/gpu.int4",
                             "example.com/gpu.vram", "example.com/gpu.arch", "example.com/cpu.avx512"}
    # keys of the default prefix are not owned under another prefix
    patch = node_patch(d, {L.GPU_VENDOR: "NVIDIA"}, {}, keys)
    assert L.GPU_VENDOR not in patch["metadata"]["labels"]
    assert L.key("x", "a.io") == "a.io/x" and L.key("x") == "flexinfer.ai/x"
    assert L.queue_key("m") == "flexinfer.ai/queue.m" and L.queue_since_key("m") == "flexinfer.ai/queue-since.m"
