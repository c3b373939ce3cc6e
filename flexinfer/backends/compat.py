"""GPU compatibility: which backend runs on which architecture, and whether a model fits.

Owns: the support matrix (full / experimental / unsupported, longest architecture-prefix match),
the VRAM-per-architecture table used when the node's measured VRAM is unknown, the 95 % (fail) and
80 % (warn) VRAM thresholds, and the Maxwell rules. ``check_placement`` returns findings with
CamelCase reasons that the operator turns into conditions and events.

Must not: import Kubernetes clients or CRD code. Pure functions only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

from flexinfer.backends.base import Backend, ConfigKind, read_config


class Support(StrEnum):
    FULL = "full"
    EXPERIMENTAL = "experimental"
    UNSUPPORTED = "unsupported"


_F, _E, _U = Support.FULL, Support.EXPERIMENTAL, Support.UNSUPPORTED

#: backend -> architecture prefix -> support. Architectures without an entry are fully supported.
SUPPORT_MATRIX: Mapping[str, Mapping[str, Support]] = {
    "vllm": {"gfx110": _F, "gfx906": _F, "sm_5": _U},
    "vllm-omni": {"gfx110": _F, "gfx906": _F, "sm_5": _U},
    "llamacpp": {"gfx110": _F, "gfx906": _F, "sm_5": _F},
    "ollama": {"gfx110": _F, "gfx906": _F, "sm_5": _F},
    "mlc-llm": {"gfx110": _F, "gfx906": _E, "sm_5": _F},
    "diffusers": {"gfx110": _F, "gfx906": _E, "sm_5": _U},
    "comfyui": {"gfx110": _F, "gfx906": _E, "sm_5": _U},
}

#: architecture prefix -> VRAM (MiB) of the reference card; used only without a measured value.
VRAM_MB_BY_ARCH: Mapping[str, int] = {"gfx110": 24576, "gfx906": 16384, "sm_5": 4096}

VRAM_FAIL_RATIO = 0.95
VRAM_WARN_RATIO = 0.80


def _longest_prefix(table: Mapping[str, Any], arch: str) -> str | None:
    arch = arch.lower()
    best: str | None = None
    for prefix in table:
        if arch.startswith(prefix) and (best is None or len(prefix) > len(best)):
            best = prefix
    return best


def support_level(backend: str, arch: str) -> Support:
    """Support of canonical ``backend`` on ``arch`` (``sm_86``, ``gfx1100``; empty = unknown = full)."""
    table = SUPPORT_MATRIX.get(backend, {})
    key = _longest_prefix(table, arch) if arch else None
    return table[key] if key is not None else Support.FULL


def arch_vram_mb(arch: str) -> int | None:
    """VRAM of the reference card of ``arch`` in MiB, or None when the table has no entry."""
    key = _longest_prefix(VRAM_MB_BY_ARCH, arch) if arch else None
    return VRAM_MB_BY_ARCH[key] if key is not None else None


def vendor_of_arch(arch: str) -> str | None:
    """``nvidia`` for ``sm_*``, ``amd`` for ``gfx*``, else None."""
    a = arch.lower()
    if a.startswith("sm_"):
        return "nvidia"
    if a.startswith("gfx"):
        return "amd"
    return None


@dataclass(frozen=True, slots=True)
class Finding:
    """One result of a check: an ``error`` fails the Model, a ``warning`` is an event."""

    level: Literal["error", "warning"]
    reason: str
    message: str


def check_vram(estimate_mb: int | None, arch: str, vram_mb: int | None = None) -> Finding | None:
    """VRAM fit of a per-GPU estimate: above 95 % of the card fails, above 80 % warns.

    ``vram_mb`` is the node's measured per-GPU VRAM and wins over the per-arch table.
    """
    if not estimate_mb:
        return None
    total = vram_mb or arch_vram_mb(arch)
    if not total:
        return None
    ratio = estimate_mb / total
    if ratio > VRAM_FAIL_RATIO:
        return Finding("error", "VRAMInsufficient",
                       f"vramEstimateMB {estimate_mb} is {ratio:.0%} of the {total} MiB of {arch or 'this GPU'}"
                       f" (limit {VRAM_FAIL_RATIO:.0%})")
    if ratio > VRAM_WARN_RATIO:
        return Finding("warning", "VRAMPressure",
                       f"vramEstimateMB {estimate_mb} is {ratio:.0%} of the {total} MiB of {arch or 'this GPU'}")
    return None


def check_placement(
    backend: Backend,
    vendor: str,
    arch: str = "",
    *,
    source: str = "",
    config: Mapping[str, Any] | None = None,
    vram_estimate_mb: int | None = None,
    vram_mb: int | None = None,
    generic_image: bool = False,
) -> list[Finding]:
    """All compatibility findings for running ``backend`` on a resolved ``vendor``/``arch``.

    ``vram_mb`` is the node's measured per-GPU VRAM; ``generic_image`` says the image chosen is not
    the arch-specific one (``ImageChoice.generic``). Errors come first in the order checked.
    """
    out: list[Finding] = []
    config = config or {}
    name = backend.name
    if vendor not in backend.vendors:
        out.append(Finding("error", "BackendUnsupported", f"backend {name} does not run on {vendor}"))
        return out
    if vendor == "cpu":
        return out
    level = support_level(name, arch)
    if level is Support.UNSUPPORTED:
        out.append(Finding("error", "BackendUnsupported", f"backend {name} does not support {arch}"))
        return out
    if level is Support.EXPERIMENTAL and generic_image:
        out.append(Finding("warning", "ExperimentalGPUSupport",
                           f"backend {name} support for {arch} is experimental and a generic image is used"))
    if arch.lower().startswith("sm_5"):
        if "f16" in source.lower():
            out.append(Finding("error", "BackendUnsupported",
                               f"Maxwell ({arch}) has no fast fp16: use an f32 variant instead of {source}"))
        if name == "mlc-llm" and not read_config(config, "modelLibPath", ConfigKind.STR) \
                and not source.startswith("file:///models/"):
            out.append(Finding("error", "BackendUnsupported",
                               "mlc-llm on Maxwell needs a precompiled library: set config.modelLibPath"))
    vram = check_vram(vram_estimate_mb, arch, vram_mb)
    if vram is not None:
        out.append(vram)
    return out
