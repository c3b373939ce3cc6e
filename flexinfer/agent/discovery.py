"""GPU and CPU discovery of the node agent: NVML, then amdsmi, then sysfs.

NVML (``pynvml`` from nvidia-ml-py) reports NVIDIA GPUs, amdsmi reports AMD GPUs; sysfs
(``<root>/sys/class/drm/card*/device``) covers any vendor whose library is missing or failing.
No GPU is a normal answer (an empty list), never an error. A backend that fails is logged once (and
again only when its error changes or it recovers), not every interval. ``amdsmi`` is imported lazily
and guarded: a broken install prints to stdout and raises ``KeyError`` at import time.

Everything that touches the machine is injectable (the sysfs/proc root, the NVML and amdsmi
modules), so tests run on a fake tree. This module never talks to Kubernetes.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flexinfer.labels import VENDOR_AMD, VENDOR_NVIDIA

log = logging.getLogger(__name__)

MiB = 1024 * 1024
PCI_VENDORS = {"0x10de": VENDOR_NVIDIA, "0x1002": VENDOR_AMD}
_CARD = re.compile(r"^card(\d+)$")
_UNSET: Any = object()


@dataclass(frozen=True, slots=True)
class GPU:
    """One GPU as the agent publishes it. Sizes are MiB (what the labels call MB)."""

    vendor: str                       # "NVIDIA" | "AMD"
    index: int
    name: str
    arch: str | None = None           # "sm_89", "gfx1100"
    vram_total_mb: int | None = None
    vram_used_mb: int | None = None
    util_pct: float | None = None     # 0..100
    int4: bool = False
    temperature_c: float | None = None
    source: str = "sysfs"             # "nvml" | "amdsmi" | "sysfs"

    @property
    def vram_free_mb(self) -> int | None:
        if self.vram_total_mb is None or self.vram_used_mb is None:
            return None
        return max(self.vram_total_mb - self.vram_used_mb, 0)


class OnceLog:
    """Log a backend's failure once; log again only when the message changes or it recovers."""

    def __init__(self, logger: logging.Logger = log) -> None:
        self.logger = logger
        self.last: dict[str, str | None] = {}

    def failed(self, backend: str, message: str, level: int = logging.INFO) -> bool:
        """Record a failure; returns True when it was logged now."""
        if self.last.get(backend) == message:
            return False
        self.last[backend] = message
        self.logger.log(level, "GPU discovery: %s unavailable: %s", backend, message)
        return True

    def ok(self, backend: str) -> None:
        if self.last.get(backend) is not None:
            self.logger.info("GPU discovery: %s available again", backend)
        self.last[backend] = None


def _safe(errors: tuple[type[BaseException], ...], fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, or None when it raises one of ``errors`` (an optional field of one GPU)."""
    try:
        return fn(*args)
    except errors:
        return None


def _text(v: Any) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes | bytearray) else str(v)


def gfx_from_target_version(v: int) -> str | None:
    """KFD ``gfx_target_version`` (e.g. 110000, 90010) → ``gfx1100``, ``gfx90a``."""
    if v <= 0:
        return None
    major, minor, step = v // 10000, (v // 100) % 100, v % 100
    return f"gfx{major}{minor}{step:x}"


def _gfx_key(arch: str) -> tuple[int, str]:
    m = re.match(r"gfx(\d+)", arch)
    return (int(m.group(1)) if m else -1, arch)


def import_amdsmi() -> tuple[Any, str | None]:
    """Import ``amdsmi`` without letting its prints or odd exceptions escape: (module|None, error)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            import amdsmi
        except (ImportError, OSError, KeyError) as exc:
            printed = " ".join((out.getvalue() + err.getvalue()).split())[:200]
            return None, f"{type(exc).__name__}: {exc}" + (f" ({printed})" if printed else "")
    return amdsmi, None


class Discovery:
    """Finds the node's GPUs. One instance per process; not thread-safe."""

    def __init__(self, *, root: str | os.PathLike[str] = "/", cpuinfo: str | os.PathLike[str] | None = None,
                 amd_min_discrete_mb: int = 4096, nvml: Any = _UNSET, amdsmi: Any = _UNSET,
                 once: OnceLog | None = None) -> None:
        self.root = Path(root)
        self.cpuinfo = Path(cpuinfo) if cpuinfo is not None else self.root / "proc" / "cpuinfo"
        self.amd_min_discrete_mb = amd_min_discrete_mb
        self._nvml = nvml
        self._amdsmi = amdsmi
        self._ready: set[str] = set()  # the libraries initialised ("nvml", "amdsmi")
        self.once = once or OnceLog()
        self.sources: dict[str, bool] = {"nvml": False, "amdsmi": False, "sysfs": False}

    # -- the one entry point ------------------------------------------------------------------------

    def gpus(self) -> list[GPU]:
        """Every GPU found: NVML's and amdsmi's, plus sysfs for vendors neither reported."""
        found: list[GPU] = []
        nv = self.nvml_gpus()
        if nv:
            found += nv
        amd = self.amdsmi_gpus()
        if amd:
            found += amd
        covered = {g.vendor for g in found}
        if nv is not None:
            covered.add(VENDOR_NVIDIA)  # NVML works: trust it, even when it sees no GPU
        if amd is not None:
            covered.add(VENDOR_AMD)
        found += self.sysfs_gpus(skip_vendors=covered)
        return [g for g in found if not self._is_igpu(g)]

    def _is_igpu(self, g: GPU) -> bool:
        return (g.vendor == VENDOR_AMD and g.vram_total_mb is not None
                and g.vram_total_mb < self.amd_min_discrete_mb)

    # -- NVML and amdsmi ------------------------------------------------------------------------------

    def _library_gpus(self, source: str, err: tuple[type[BaseException], ...],
                      scan: Callable[[], list[GPU]]) -> list[GPU] | None:
        """``scan()`` (NVML's or amdsmi's), or None when it fails: logged once, and the library is
        initialised again next time."""
        try:
            out = scan()
        except err as exc:
            self._ready.discard(source)
            self.once.failed(source, f"{type(exc).__name__}: {exc}")
            return None
        except Exception as exc:  # a broken binding must not stop the agent
            self._ready.discard(source)
            self.once.failed(source, f"unexpected {type(exc).__name__}: {exc}", logging.WARNING)
            return None
        self.once.ok(source)
        self.sources[source] = True
        return out

    # -- NVML -----------------------------------------------------------------------------------------

    def _nvml_module(self) -> Any:
        if self._nvml is _UNSET:
            try:
                import pynvml
            except ImportError as exc:
                self._nvml = None
                self.once.failed("nvml", f"pynvml not importable: {exc}")
                return None
            self._nvml = pynvml
        return self._nvml

    def nvml_gpus(self) -> list[GPU] | None:
        """NVIDIA GPUs through NVML, or None when NVML is unusable (logged once)."""
        nvml = self._nvml_module()
        self.sources["nvml"] = False
        if nvml is None:
            return None
        err: tuple[type[BaseException], ...] = (nvml.NVMLError,)
        return self._library_gpus("nvml", err, lambda: self._nvml_scan(nvml, err))

    def _nvml_scan(self, nvml: Any, err: tuple[type[BaseException], ...]) -> list[GPU]:
        if "nvml" not in self._ready:
            nvml.nvmlInit()
            self._ready.add("nvml")
        count = int(nvml.nvmlDeviceGetCount())
        out = []
        for i in range(count):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            raw_name = _safe(err, nvml.nvmlDeviceGetName, h)
            name = _text(raw_name) if raw_name else f"NVIDIA GPU {i}"
            mem = _safe(err, nvml.nvmlDeviceGetMemoryInfo, h)
            util = _safe(err, nvml.nvmlDeviceGetUtilizationRates, h)
            cc = _safe(err, nvml.nvmlDeviceGetCudaComputeCapability, h)
            temp = _safe(err, nvml.nvmlDeviceGetTemperature, h, nvml.NVML_TEMPERATURE_GPU)
            major, minor = (int(cc[0]), int(cc[1])) if cc else (None, None)
            out.append(GPU(
                vendor=VENDOR_NVIDIA, index=i, name=name.strip(),
                arch=f"sm_{major}{minor}" if major is not None else None,
                vram_total_mb=int(mem.total) // MiB if mem is not None else None,
                vram_used_mb=int(mem.used) // MiB if mem is not None else None,
                util_pct=float(util.gpu) if util is not None else None,
                int4=major is not None and major >= 8,
                temperature_c=float(temp) if temp is not None else None,
                source="nvml"))
        return out

    # -- amdsmi ---------------------------------------------------------------------------------------

    def _amdsmi_module(self) -> Any:
        if self._amdsmi is _UNSET:
            mod, error = import_amdsmi()  # once per process: a failed import does not heal itself
            self._amdsmi = mod
            if mod is None:
                self.once.failed("amdsmi", error or "not importable")
        return self._amdsmi

    def amdsmi_gpus(self) -> list[GPU] | None:
        """AMD GPUs through amdsmi, or None when it is unusable (logged once)."""
        smi = self._amdsmi_module()
        self.sources["amdsmi"] = False
        if smi is None:
            return None
        base = getattr(smi, "AmdSmiException", None)
        err: tuple[type[BaseException], ...] = (base,) if isinstance(base, type) else ()
        err += (OSError, KeyError, ValueError, TypeError)
        return self._library_gpus("amdsmi", err, lambda: self._amdsmi_scan(smi, err))

    def _amdsmi_scan(self, smi: Any, err: tuple[type[BaseException], ...]) -> list[GPU]:
        if "amdsmi" not in self._ready:
            flags = getattr(getattr(smi, "AmdSmiInitFlags", None), "INIT_AMD_GPUS", None)
            if flags is not None:
                smi.amdsmi_init(flags)
            else:
                smi.amdsmi_init()
            self._ready.add("amdsmi")
        handles = list(smi.amdsmi_get_processor_handles())
        vram_type = getattr(getattr(smi, "AmdSmiMemoryType", None), "VRAM", None)
        out = []
        for i, h in enumerate(handles):
            asic = _safe(err, smi.amdsmi_get_gpu_asic_info, h) or {}
            total = _safe(err, smi.amdsmi_get_gpu_memory_total, h, vram_type)
            used = _safe(err, smi.amdsmi_get_gpu_memory_usage, h, vram_type)
            act = _safe(err, smi.amdsmi_get_gpu_activity, h) or {}
            temp = _safe(err, self._amd_temp, smi, h)
            out.append(GPU(
                vendor=VENDOR_AMD, index=i,
                name=str(asic.get("market_name") or f"AMD GPU {i}").strip(),
                arch=_normalise_gfx(asic.get("target_graphics_version")),
                vram_total_mb=_mb(total), vram_used_mb=_mb(used),
                util_pct=_num(act.get("gfx_activity")) if isinstance(act, dict) else None,
                int4=True, temperature_c=_num(temp), source="amdsmi"))
        return out

    @staticmethod
    def _amd_temp(smi: Any, h: Any) -> Any:
        ttype = getattr(getattr(smi, "AmdSmiTemperatureType", None), "EDGE", None)
        metric = getattr(getattr(smi, "AmdSmiTemperatureMetric", None), "CURRENT", None)
        return smi.amdsmi_get_temp_metric(h, ttype, metric)

    # -- sysfs ----------------------------------------------------------------------------------------

    def _read(self, path: Path) -> str | None:
        try:
            return path.read_text(encoding="utf-8", errors="replace").strip()
        except OSError:
            return None

    def _read_int(self, path: Path) -> int | None:
        raw = self._read(path)
        try:
            return int(raw, 0) if raw else None
        except ValueError:
            return None

    def _kfd_arches(self) -> dict[int, str]:
        """DRM render minor → gfx arch from the KFD topology (AMD); empty when absent."""
        out: dict[int, str] = {}
        nodes = self.root / "sys" / "class" / "kfd" / "kfd" / "topology" / "nodes"
        try:
            entries = sorted(nodes.iterdir())
        except OSError:
            return out
        for node in entries:
            props: dict[str, int] = {}
            for line in (self._read(node / "properties") or "").splitlines():
                parts = line.split()
                if len(parts) == 2 and parts[1].lstrip("-").isdigit():
                    props[parts[0]] = int(parts[1])
            gfx = gfx_from_target_version(props.get("gfx_target_version", 0))
            if gfx:
                out[props.get("drm_render_minor", -1 - len(out))] = gfx
        return out

    def sysfs_gpus(self, skip_vendors: set[str] | frozenset[str] = frozenset()) -> list[GPU]:
        """GPUs under ``<root>/sys/class/drm/card*/device`` (NVIDIA, AMD), vendors in ``skip_vendors`` left out."""
        drm = self.root / "sys" / "class" / "drm"
        try:
            cards = sorted((p for p in drm.iterdir() if _CARD.match(p.name)),
                           key=lambda p: int(_CARD.match(p.name).group(1)))  # type: ignore[union-attr]
        except OSError:
            self.sources["sysfs"] = False
            return []
        self.sources["sysfs"] = True
        kfd: dict[int, str] | None = None
        seen: set[str] = set()
        counters: dict[str, int] = {}
        out: list[GPU] = []
        for card in cards:
            dev = card / "device"
            vendor = PCI_VENDORS.get((self._read(dev / "vendor") or "").lower())
            if vendor is None or vendor in skip_vendors:
                continue
            real = os.path.realpath(dev)
            if real in seen:
                continue
            seen.add(real)
            total = self._read_int(dev / "mem_info_vram_total")
            used = self._read_int(dev / "mem_info_vram_used")
            busy = self._read_int(dev / "gpu_busy_percent")
            device_id = self._read(dev / "device") or "?"
            name = self._read(dev / "product_name") or f"{vendor} {device_id}"
            arch = None
            if vendor == VENDOR_AMD:
                if kfd is None:
                    kfd = self._kfd_arches()
                arch = self._card_gfx(dev, kfd)
            idx = counters.get(vendor, 0)
            counters[vendor] = idx + 1
            out.append(GPU(vendor=vendor, index=idx, name=name,
                           arch=arch, vram_total_mb=total // MiB if total is not None else None,
                           vram_used_mb=used // MiB if used is not None else None,
                           util_pct=float(busy) if busy is not None else None,
                           int4=vendor == VENDOR_AMD, source="sysfs"))
        return out

    def _card_gfx(self, dev: Path, kfd: dict[int, str]) -> str | None:
        if not kfd:
            return None
        try:
            for entry in (dev / "drm").iterdir():
                if entry.name.startswith("renderD") and entry.name[7:].isdigit():
                    minor = int(entry.name[7:])
                    if minor in kfd:
                        return kfd[minor]
        except OSError:
            pass
        return max(kfd.values(), key=_gfx_key)  # as the original: the highest gfx present

    # -- CPU ------------------------------------------------------------------------------------------

    def cpu_avx512(self) -> bool:
        """True when /proc/cpuinfo lists the ``avx512f`` flag."""
        text = self._read(self.cpuinfo) or ""
        for line in text.splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("flags", "Features") and "avx512f" in value.split():
                return True
        return False

    def close(self) -> None:
        """Release NVML / amdsmi handles."""
        if "nvml" in self._ready and self._nvml not in (None, _UNSET):
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()
        if "amdsmi" in self._ready and self._amdsmi not in (None, _UNSET):
            with contextlib.suppress(Exception):
                self._amdsmi.amdsmi_shut_down()
        self._ready.clear()


def _num(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if f == f and f not in (float("inf"), float("-inf")) else None


def _mb(v: Any) -> int | None:
    f = _num(v)
    return int(f) // MiB if f is not None and f >= 0 else None


def _normalise_gfx(v: Any) -> str | None:
    """amdsmi ``target_graphics_version``: ``"gfx1100"`` as is; ``"1100"``/``0x1100`` → ``gfx1100``."""
    if v is None or v == "" or v == "N/A":
        return None
    s = str(v).strip().lower()
    if s.startswith("gfx"):
        return s
    if s.startswith("0x"):
        s = s[2:]
    return f"gfx{s}" if s.isalnum() else None
