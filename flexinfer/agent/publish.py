"""What the agent writes on its Node, as pure functions: desired labels/annotations from the
discovered GPUs, and the minimal merge patch from the node's current state.

Labels (``--label-prefix``, default ``flexinfer.ai/``): ``gpu.vendor``, ``gpu.vram`` (per-GPU,
``<MiB // 1024>Gi``), ``gpu.arch``, ``gpu.int4``, ``gpu.count``, ``cpu.avx512``. Annotations:
``gpu-free-memory`` (MiB summed), ``gpu.util`` (percent, averaged), ``kv-cache-usage`` (0..1, ``%.4f``).
A node with GPUs of two vendors publishes the vendor with more GPUs (ties: more VRAM, then NVIDIA):
one vendor per node is what the labels can say and what the extender filters on.

The patch carries only keys whose value changes, ``None`` for keys the agent owns that no longer
apply, and nothing at all (``{}``: no write) when the node is already right. Keys it does not own
are never touched. No I/O here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from flexinfer.agent.discovery import GPU
from flexinfer.labels import DEFAULT_NODE_KEYS, VENDOR_NVIDIA, NodeKeys


@dataclass(frozen=True, slots=True)
class Desired:
    """Labels and annotations the agent wants on its node (owned keys only)."""

    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)


def primary_gpus(gpus: Sequence[GPU]) -> list[GPU]:
    """The GPUs of the vendor this node is published as (see the module docstring)."""
    if not gpus:
        return []
    by_vendor: dict[str, list[GPU]] = {}
    for g in gpus:
        by_vendor.setdefault(g.vendor, []).append(g)

    def rank(vendor: str) -> tuple[int, int, int]:
        group = by_vendor[vendor]
        return (len(group), max((g.vram_total_mb or 0) for g in group), 1 if vendor == VENDOR_NVIDIA else 0)

    best = max(sorted(by_vendor), key=rank)
    return by_vendor[best]


def _fmt_pct(v: float) -> str:
    return f"{v:.0f}"


def desired_state(gpus: Sequence[GPU], *, kv_usage: float | None, avx512: bool,
                  keys: NodeKeys = DEFAULT_NODE_KEYS) -> Desired:
    """Desired owned labels/annotations for ``gpus`` (empty: only ``cpu.avx512``)."""
    lab: dict[str, str] = {keys.cpu_avx512: "true" if avx512 else "false"}
    ann: dict[str, str] = {}
    group = primary_gpus(gpus)
    if group:
        lab[keys.gpu_vendor] = group[0].vendor
        lab[keys.gpu_count] = str(len(group))
        lab[keys.gpu_int4] = "true" if all(g.int4 for g in group) else "false"
        # the label describes the biggest GPU (first by index among equals)
        biggest = max(group, key=lambda g: (g.vram_total_mb or 0, -g.index))
        if biggest.vram_total_mb:
            lab[keys.gpu_vram] = f"{biggest.vram_total_mb // 1024}Gi"
        arch = biggest.arch or next((g.arch for g in group if g.arch), None)
        if arch:
            lab[keys.gpu_arch] = arch
        frees = [g.vram_free_mb for g in group]
        if all(f is not None for f in frees):
            ann[keys.gpu_free_memory] = str(sum(f for f in frees if f is not None))
        utils = [g.util_pct for g in group if g.util_pct is not None]
        if utils:
            ann[keys.gpu_util] = _fmt_pct(sum(utils) / len(utils))
    if kv_usage is not None:
        ann[keys.kv_cache_usage] = f"{min(max(kv_usage, 0.0), 1.0):.4f}"
    return Desired(lab, ann)


def _diff(desired: Mapping[str, str], current: Mapping[str, Any], owned: Sequence[str]) -> dict[str, str | None]:
    out: dict[str, str | None] = {k: v for k, v in desired.items() if current.get(k) != v}
    for k in owned:
        if k in current and k not in desired:
            out[k] = None
    return out


def node_patch(desired: Desired, current_labels: Mapping[str, Any] | None,
               current_annotations: Mapping[str, Any] | None, keys: NodeKeys = DEFAULT_NODE_KEYS) -> dict[str, Any]:
    """The merge patch that brings the node to ``desired``; ``{}`` when nothing changes."""
    lp = _diff(desired.labels, current_labels or {}, keys.labels)
    ap = _diff(desired.annotations, current_annotations or {}, keys.annotations)
    meta: dict[str, Any] = {}
    if lp:
        meta["labels"] = lp
    if ap:
        meta["annotations"] = ap
    return {"metadata": meta} if meta else {}
