"""The bench-result keys of :mod:`flexinfer.labels`: device class, hash, keys and ConfigMap names."""

from __future__ import annotations

import hashlib

from flexinfer import labels


def test_bench_keys() -> None:
    dc = labels.device_class("AMD", "gfx1100", "24Gi", 1, True)
    assert dc == "vendor=AMD,arch=gfx1100,vram=24Gi,count=1,int4=true"
    assert labels.device_class_from_labels({"flexinfer.ai/gpu.vendor": "AMD", "flexinfer.ai/gpu.arch": "gfx1100",
                                           "flexinfer.ai/gpu.vram": "24Gi", "flexinfer.ai/gpu.count": "1",
                                           "flexinfer.ai/gpu.int4": "true"}) == dc
    assert labels.device_class_from_labels({"x.io/gpu.vendor": "AMD"}, prefix="x.io/").startswith("vendor=AMD,")
    h = labels.bench_hash("vllm", "llama3", dc)
    assert h == hashlib.sha256(f"vllm|llama3|{dc}".encode()).hexdigest()[:16] and len(h) == 16
    assert labels.bench_key("vllm", "llama3", dc) == "bench_" + h
    assert labels.meta_key("vllm", "llama3", dc) == "meta_" + h
    assert labels.deployment_configmap_name("m") == "m-benchmark-results"
    assert labels.BENCHMARK_CONFIGMAP == "flexinfer-benchmark-results"
