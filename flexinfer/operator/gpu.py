"""GPU detection from node objects: which vendor and architecture a Model will run on.

Owns: the original's ``detectGPU`` (``shared/reference/flexinfer-upstream.md`` §2.1 step 4) as a pure
function of the node list: Ready nodes that match the Model's ``nodeSelector`` and have capacity
``nvidia.com/gpu`` or ``amd.com/gpu`` of at least 1; the architecture from the NVIDIA GPU feature
discovery labels (``sm_<major><minor>``), the AMD labeller labels or the agent's
``flexinfer.ai/gpu.arch``; per-GPU VRAM from the agent's ``flexinfer.ai/gpu.vram``. Vendor ``auto``
with both vendors present is ``AmbiguousGPUVendor``; no matching node is ``NoMatchingNodes``.

Must not: do I/O; the caller passes the nodes it has.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from flexinfer import labels
from flexinfer.api.common import SpecError, parse_quantity

NO_MATCHING_NODES = "NoMatchingNodes"
AMBIGUOUS_GPU_VENDOR = "AmbiguousGPUVendor"
VENDOR_RESOURCES = {"nvidia": labels.RESOURCE_NVIDIA_GPU, "amd": labels.RESOURCE_AMD_GPU}
#: AMD GPU family labels (the AMD node labeller) and the architectures they mean
AMD_FAMILY_ARCH = {"amd.com/gpu.family.GC_11_0_0": "gfx1100", "amd.com/gpu.family.GC_10_3_6": "gfx1036"}
NVIDIA_COMPUTE_MINOR = "nvidia.com/gpu.compute.minor"


@dataclass(frozen=True, slots=True)
class GPUTarget:
    """Where a Model's pods will land: resolved vendor, architecture ("" if unknown), fit."""

    vendor: str
    arch: str = ""
    nodes: int = 0
    vram_mb: int | None = None  # smallest per-GPU VRAM among the matching nodes of ``arch``


def node_ready(node: Mapping[str, Any]) -> bool:
    for c in (node.get("status") or {}).get("conditions") or ():
        if isinstance(c, Mapping) and c.get("type") == "Ready":
            return c.get("status") == "True"
    return False


def selector_matches(selector: Mapping[str, str], node_labels: Mapping[str, str]) -> bool:
    return all(node_labels.get(k) == v for k, v in selector.items())


def gpu_capacity(node: Mapping[str, Any], vendor: str) -> int:
    cap = (node.get("status") or {}).get("capacity") or {}
    raw = cap.get(VENDOR_RESOURCES[vendor])
    if raw is None:
        return 0
    try:
        return int(parse_quantity(raw))
    except (SpecError, ValueError):
        return 0


def node_arch(node_labels: Mapping[str, str], vendor: str) -> str:
    """The GPU architecture a node's labels announce for ``vendor`` ("" when none does)."""
    if vendor == "nvidia":
        major = node_labels.get(labels.NVIDIA_COMPUTE_MAJOR, "").strip()
        if major.isdigit():
            minor = node_labels.get(NVIDIA_COMPUTE_MINOR, "").strip()
            return f"sm_{major}{minor if minor.isdigit() else ''}"
        return node_labels.get(labels.GPU_ARCH, "").strip()
    arch = node_labels.get(labels.AMD_GPU_ARCH, "").strip() or node_labels.get(labels.GPU_ARCH, "").strip()
    if arch:
        return arch
    for key, fam_arch in AMD_FAMILY_ARCH.items():
        if key in node_labels:
            return fam_arch
    if "7900" in node_labels.get(labels.AMD_GPU_MODEL, ""):
        return "gfx1100"
    return ""


def node_vram_mb(node_labels: Mapping[str, str]) -> int | None:
    raw = node_labels.get(labels.GPU_VRAM)
    if not raw:
        return None
    try:
        return int(parse_quantity(raw) // (1024 * 1024))
    except (SpecError, ValueError, ArithmeticError):
        return None


def detect_gpu(nodes: Iterable[Mapping[str, Any]], node_selector: Mapping[str, str], vendor: str) -> GPUTarget:
    """Resolve ``vendor`` (auto | nvidia | amd) against the nodes; raises ``SpecError`` when nothing fits.

    Among the matching nodes the most common architecture wins (ties: the first by node name).
    """
    found: dict[str, list[tuple[str, str, int | None]]] = {"nvidia": [], "amd": []}
    for node in sorted(nodes, key=lambda n: str((n.get("metadata") or {}).get("name") or "")):
        md = node.get("metadata") or {}
        node_labels = md.get("labels") or {}
        if not node_ready(node) or not selector_matches(node_selector, node_labels):
            continue
        for v in found:
            if gpu_capacity(node, v) >= 1:
                found[v].append((str(md.get("name")), node_arch(node_labels, v), node_vram_mb(node_labels)))
    wanted = ["nvidia", "amd"] if vendor == "auto" else [vendor]
    present = [v for v in wanted if found.get(v)]
    sel = ", ".join(f"{k}={v}" for k, v in sorted(node_selector.items())) or "none"
    if not present:
        what = "NVIDIA or AMD GPUs" if vendor == "auto" else f"{vendor} GPUs"
        raise SpecError(NO_MATCHING_NODES, f"no Ready node with {what} matches the node selector ({sel})")
    if len(present) > 1:
        raise SpecError(AMBIGUOUS_GPU_VENDOR, "gpu.vendor is auto but both NVIDIA and AMD GPU nodes match "
                                              f"(node selector: {sel}); set gpu.vendor or a nodeSelector")
    v = present[0]
    entries = found[v]
    counts = Counter(arch for _, arch, _ in entries)
    best = max(counts.values())
    arch = next(a for _, a, _ in entries if counts[a] == best)
    vrams = [m for _, a, m in entries if a == arch and m]
    return GPUTarget(vendor=v, arch=arch, nodes=len(entries), vram_mb=min(vrams) if vrams else None)
