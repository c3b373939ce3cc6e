"""Builders of Node / Pod dicts for the extender tests (no tests here)."""

from __future__ import annotations

from typing import Any

from flexinfer import labels


def make_node(name: str, *, vendor: str | None = "NVIDIA", arch: str | None = "sm_89", vram: str | None = "24Gi",
              count: int | None = 1, int4: str | None = "true", free: float | None = None,
              util: float | None = None, kv: float | None = None, cost: float | None = None,
              spot: bool = False, extra_labels: dict[str, str] | None = None) -> dict[str, Any]:
    lab: dict[str, str] = {"kubernetes.io/hostname": name}
    ann: dict[str, str] = {}
    for k, v in ((labels.GPU_VENDOR, vendor), (labels.GPU_ARCH, arch), (labels.GPU_VRAM, vram),
                 (labels.GPU_COUNT, None if count is None else str(count)), (labels.GPU_INT4, int4)):
        if v is not None:
            lab[k] = v
    if spot:
        lab[labels.SPOT_TERMINATING] = "true"
    for k, fv in ((labels.GPU_FREE_MEMORY, free), (labels.GPU_UTIL, util), (labels.KV_CACHE_USAGE, kv),
                  (labels.COST, cost)):
        if fv is not None:
            ann[k] = str(fv)
    lab.update(extra_labels or {})
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": lab, "annotations": ann},
            "spec": {}, "status": {}}


def make_pod(name: str = "p", namespace: str = "team-a", *, backend: str | None = "vllm",
             model: str | None = "llama3", vram_mb: float | str | None = None, gpus: int | None = None,
             resource: str = labels.RESOURCE_NVIDIA_GPU, pod_labels: dict[str, str] | None = None,
             node_name: str | None = None, phase: str | None = None) -> dict[str, Any]:
    ann: dict[str, str] = {}
    if backend is not None:
        ann[labels.BACKEND] = backend
    if model is not None:
        ann[labels.MODEL] = model
    if vram_mb is not None:
        ann[labels.VRAM_ESTIMATE_MB] = str(vram_mb)
    container: dict[str, Any] = {"name": "model", "image": "x"}
    if gpus is not None:
        container["resources"] = {"limits": {resource: str(gpus)}}
    pod: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod",
                           "metadata": {"name": name, "namespace": namespace, "annotations": ann,
                                        "labels": dict(pod_labels or {})},
                           "spec": {"containers": [container]}, "status": {}}
    if node_name:
        pod["spec"]["nodeName"] = node_name
    if phase:
        pod["status"]["phase"] = phase
    return pod
