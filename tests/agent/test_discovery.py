"""GPU discovery with a fake sysfs tree, fake NVML and amdsmi modules, and the amdsmi import guard."""

from __future__ import annotations

import logging
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from flexinfer.agent import discovery as disc
from flexinfer.agent.discovery import GPU, Discovery, gfx_from_target_version, import_amdsmi

GiB = 1024 ** 3


# ---- fakes -------------------------------------------------------------------------------------------


def fake_nvml(gpus: list[dict[str, Any]], *, init_error: str | None = None,
              broken_fields: set[str] = frozenset()) -> Any:  # type: ignore[assignment]
    """A stand-in for ``pynvml`` with the calls the agent makes."""

    class NVMLError(Exception):
        pass

    class NVMLError_LibraryNotFound(NVMLError):
        pass

    class NVMLError_NotSupported(NVMLError):
        pass

    state = {"init": 0, "shutdown": 0}

    def nvmlInit() -> None:
        state["init"] += 1
        if init_error:
            raise NVMLError_LibraryNotFound(init_error)

    def field(name: str, value: Any) -> Any:
        if name in broken_fields:
            raise NVMLError_NotSupported(name)
        return value

    return SimpleNamespace(
        NVMLError=NVMLError, NVML_TEMPERATURE_GPU=0, state=state,
        nvmlInit=nvmlInit,
        nvmlShutdown=lambda: state.__setitem__("shutdown", state["shutdown"] + 1),
        nvmlDeviceGetCount=lambda: len(gpus),
        nvmlDeviceGetHandleByIndex=lambda i: gpus[i],
        nvmlDeviceGetName=lambda h: field("name", h["name"].encode()),
        nvmlDeviceGetMemoryInfo=lambda h: field("mem", SimpleNamespace(total=h["total"], used=h["used"],
                                                                       free=h["total"] - h["used"])),
        nvmlDeviceGetUtilizationRates=lambda h: field("util", SimpleNamespace(gpu=h["util"], memory=0)),
        nvmlDeviceGetCudaComputeCapability=lambda h: field("cc", h["cc"]),
        nvmlDeviceGetTemperature=lambda h, t: field("temp", h.get("temp", 40)),
    )


def fake_amdsmi(gpus: list[dict[str, Any]], *, init_error: bool = False) -> Any:
    class AmdSmiException(Exception):
        pass

    class AmdSmiLibraryException(AmdSmiException):
        pass

    def amdsmi_init(flags: Any = None) -> None:
        if init_error:
            raise AmdSmiLibraryException("AMDSMI_STATUS_INIT_ERROR")

    def activity(h: dict[str, Any]) -> dict[str, Any]:
        if h.get("activity") == "raise":
            raise AmdSmiLibraryException("not supported")
        return {"gfx_activity": h.get("activity", 0), "umc_activity": 0, "mm_activity": "N/A"}

    return SimpleNamespace(
        AmdSmiException=AmdSmiException,
        AmdSmiInitFlags=SimpleNamespace(INIT_AMD_GPUS=2),
        AmdSmiMemoryType=SimpleNamespace(VRAM=0, VIS_VRAM=1, GTT=2),
        AmdSmiTemperatureType=SimpleNamespace(EDGE=0),
        AmdSmiTemperatureMetric=SimpleNamespace(CURRENT=0),
        amdsmi_init=amdsmi_init,
        amdsmi_shut_down=lambda: None,
        amdsmi_get_processor_handles=lambda: list(gpus),
        amdsmi_get_gpu_asic_info=lambda h: {"market_name": h["name"], "target_graphics_version": h["gfx"]},
        amdsmi_get_gpu_memory_total=lambda h, t: h["total"],
        amdsmi_get_gpu_memory_usage=lambda h, t: h["used"],
        amdsmi_get_gpu_activity=activity,
        amdsmi_get_temp_metric=lambda h, t, m: 55,
    )


def make_card(root: Path, n: int, vendor: str, *, total: int | None = None, used: int | None = None,
              busy: int | None = None, render_minor: int | None = None, name: str | None = None) -> Path:
    dev = root / "sys" / "class" / "drm" / f"card{n}" / "device"
    dev.mkdir(parents=True)
    (dev / "vendor").write_text(vendor + "\n")
    (dev / "device").write_text("0x744c\n")
    if total is not None:
        (dev / "mem_info_vram_total").write_text(f"{total}\n")
    if used is not None:
        (dev / "mem_info_vram_used").write_text(f"{used}\n")
    if busy is not None:
        (dev / "gpu_busy_percent").write_text(f"{busy}\n")
    if name:
        (dev / "product_name").write_text(name + "\n")
    if render_minor is not None:
        (dev / "drm" / f"renderD{render_minor}").mkdir(parents=True)
    return dev


def make_kfd(root: Path, node: int, gfx_target_version: int, render_minor: int) -> None:
    d = root / "sys" / "class" / "kfd" / "kfd" / "topology" / "nodes" / str(node)
    d.mkdir(parents=True)
    (d / "properties").write_text(textwrap.dedent(f"""\
        cpu_cores_count 0
        simd_count 192
        gfx_target_version {gfx_target_version}
        vendor_id 4098
        drm_render_minor {render_minor}
        """))


def no_libs(root: Path, **kw: Any) -> Discovery:
    return Discovery(root=root, nvml=None, amdsmi=None, **kw)


# ---- sysfs ----------------------------------------------------------------------------------------------


def test_sysfs_amd_and_nvidia_cards(tmp_path: Path) -> None:
    make_card(tmp_path, 0, "0x1002", total=24 * GiB, used=4 * GiB, busy=37, render_minor=128, name="Radeon RX 7900 XTX")
    make_card(tmp_path, 1, "0x10de")  # NVIDIA sysfs: vendor only
    make_card(tmp_path, 2, "0x8086", total=GiB)  # Intel: ignored
    (tmp_path / "sys" / "class" / "drm" / "card0-DP-1").mkdir()  # a connector, not a card
    make_kfd(tmp_path, 0, 0, -1)  # the CPU node
    make_kfd(tmp_path, 1, 110000, 128)
    gpus = no_libs(tmp_path).gpus()
    assert gpus == [
        GPU(vendor="AMD", index=0, name="Radeon RX 7900 XTX", arch="gfx1100", vram_total_mb=24576,
            vram_used_mb=4096, util_pct=37.0, int4=True, source="sysfs"),
        GPU(vendor="NVIDIA", index=0, name="NVIDIA 0x744c", source="sysfs"),
    ]
    assert gpus[0].vram_free_mb == 20480


def test_sysfs_amd_igpu_is_ignored_and_highest_gfx_fallback(tmp_path: Path) -> None:
    make_card(tmp_path, 0, "0x1002", total=512 * 1024 * 1024, used=0)  # APU: 512 MiB carve-out
    make_card(tmp_path, 1, "0x1002", total=16 * GiB, used=0)  # no renderD entry: highest gfx present
    make_kfd(tmp_path, 1, 90006, 200)
    make_kfd(tmp_path, 2, 110000, 201)
    gpus = no_libs(tmp_path).gpus()
    assert [(g.index, g.vram_total_mb, g.arch) for g in gpus] == [(1, 16384, "gfx1100")]
    assert no_libs(tmp_path, amd_min_discrete_mb=0).gpus()[0].vram_total_mb == 512


def test_sysfs_absent_or_garbage(tmp_path: Path) -> None:
    assert no_libs(tmp_path).gpus() == []  # no /sys/class/drm at all (like this VM)
    make_card(tmp_path, 0, "0x1002", total=None)
    (tmp_path / "sys/class/drm/card0/device/mem_info_vram_used").write_text("garbage")
    g = no_libs(tmp_path).gpus()[0]
    assert (g.vram_total_mb, g.vram_used_mb, g.vram_free_mb, g.arch) == (None, None, None, None)


@pytest.mark.parametrize(("v", "gfx"), [(110000, "gfx1100"), (90006, "gfx906"), (90010, "gfx90a"),
                                        (100300, "gfx1030"), (0, None)])
def test_gfx_from_target_version(v: int, gfx: str | None) -> None:
    assert gfx_from_target_version(v) == gfx


def test_cpu_avx512(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "cpuinfo").write_text("processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512bw\n\n")
    assert Discovery(root=tmp_path).cpu_avx512() is True
    (proc / "cpuinfo").write_text("processor\t: 0\nflags\t\t: fpu sse avx2 avx512_vnni_x\n")
    assert Discovery(root=tmp_path).cpu_avx512() is False
    other = tmp_path / "ci"
    other.write_text("flags : avx512f\n")
    assert Discovery(root=tmp_path / "nope", cpuinfo=other).cpu_avx512() is True
    assert Discovery(root=tmp_path / "nope").cpu_avx512() is False


# ---- NVML ------------------------------------------------------------------------------------------------

H100 = {"name": "NVIDIA H100 80GB HBM3", "total": 80 * GiB, "used": 10 * GiB, "util": 63, "cc": (9, 0), "temp": 51}
T4 = {"name": "Tesla T4", "total": 16 * GiB, "used": 0, "util": 0, "cc": (7, 5)}


def test_nvml_gpus_and_sysfs_not_double_counted(tmp_path: Path) -> None:
    make_card(tmp_path, 0, "0x10de")  # the same GPU seen by sysfs must not be added again
    nvml = fake_nvml([H100, T4])
    d = Discovery(root=tmp_path, nvml=nvml, amdsmi=None)
    gpus = d.gpus()
    assert gpus == [
        GPU(vendor="NVIDIA", index=0, name="NVIDIA H100 80GB HBM3", arch="sm_90", vram_total_mb=81920,
            vram_used_mb=10240, util_pct=63.0, int4=True, temperature_c=51.0, source="nvml"),
        GPU(vendor="NVIDIA", index=1, name="Tesla T4", arch="sm_75", vram_total_mb=16384, vram_used_mb=0,
            util_pct=0.0, int4=False, temperature_c=40.0, source="nvml"),
    ]
    d.gpus()
    assert nvml.state["init"] == 1  # initialised once, kept
    assert d.sources == {"nvml": True, "amdsmi": False, "sysfs": True}
    d.close()
    assert nvml.state["shutdown"] == 1


def test_nvml_unsupported_fields_are_none(tmp_path: Path) -> None:
    d = Discovery(root=tmp_path, nvml=fake_nvml([H100], broken_fields={"util", "temp", "cc", "name"}), amdsmi=None)
    (g,) = d.gpus()
    assert (g.name, g.arch, g.util_pct, g.temperature_c, g.int4, g.vram_total_mb) == (
        "NVIDIA GPU 0", None, None, None, False, 81920)


def test_nvml_failure_falls_back_to_sysfs_and_logs_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    make_card(tmp_path, 0, "0x10de")
    nvml = fake_nvml([H100], init_error="NVML Shared Library Not Found")
    d = Discovery(root=tmp_path, nvml=nvml, amdsmi=None)
    with caplog.at_level(logging.INFO, logger=disc.__name__):
        for _ in range(5):
            gpus = d.gpus()
    assert [(g.vendor, g.source) for g in gpus] == [("NVIDIA", "sysfs")]
    assert nvml.state["init"] == 5  # retried every interval (the driver may come up)...
    msgs = [r.getMessage() for r in caplog.records if "nvml" in r.getMessage()]
    assert len(msgs) == 1 and "Library Not Found" in msgs[0]  # ...but logged once


def test_real_pynvml_without_driver_is_an_empty_answer(tmp_path: Path) -> None:
    d = Discovery(root=tmp_path, amdsmi=None)  # the real pynvml: no libnvidia-ml here
    assert d.gpus() == [] and d.nvml_gpus() is None


# ---- amdsmi ---------------------------------------------------------------------------------------------

MI = {"name": "AMD Instinct MI210", "gfx": "gfx90a", "total": 64 * GiB, "used": 2 * GiB, "activity": 12}
W7900 = {"name": "Radeon PRO W7900", "gfx": "gfx1100", "total": 48 * GiB, "used": 0, "activity": "raise"}


def test_amdsmi_gpus(tmp_path: Path) -> None:
    make_card(tmp_path, 0, "0x1002", total=64 * GiB, used=0)  # covered by amdsmi: not added twice
    d = Discovery(root=tmp_path, nvml=None, amdsmi=fake_amdsmi([MI, W7900]))
    gpus = d.gpus()
    assert [(g.name, g.arch, g.vram_total_mb, g.vram_used_mb, g.util_pct, g.int4, g.temperature_c, g.source)
            for g in gpus] == [
        ("AMD Instinct MI210", "gfx90a", 65536, 2048, 12.0, True, 55.0, "amdsmi"),
        ("Radeon PRO W7900", "gfx1100", 49152, 0, None, True, 55.0, "amdsmi"),
    ]


def test_amdsmi_init_failure_falls_back(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    make_card(tmp_path, 0, "0x1002", total=16 * GiB, used=GiB)
    d = Discovery(root=tmp_path, nvml=None, amdsmi=fake_amdsmi([MI], init_error=True))
    with caplog.at_level(logging.INFO, logger=disc.__name__):
        assert [g.source for g in d.gpus()] == ["sysfs"]
        d.gpus()
    assert sum("amdsmi" in r.getMessage() for r in caplog.records) == 1


def test_mixed_vendors(tmp_path: Path) -> None:
    d = Discovery(root=tmp_path, nvml=fake_nvml([H100]), amdsmi=fake_amdsmi([MI]))
    assert [g.vendor for g in d.gpus()] == ["NVIDIA", "AMD"]


def test_amdsmi_import_guard(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # a package that behaves like the broken amdsmi wheel: prints to stdout, then raises KeyError
    pkg = tmp_path / "site" / "amdsmi"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        "print('/opt/rocm/lib/libamd_smi.so: cannot open shared object file')\n"
        "print('Unable to find libamd_smi.so')\n"
        "raise KeyError('libamd_smi.so')\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.delitem(sys.modules, "amdsmi", raising=False)
    mod, error = import_amdsmi()
    assert mod is None and error is not None and "KeyError" in error and "Unable to find" in error
    assert capsys.readouterr().out == ""  # nothing leaked to stdout
    d = Discovery(root=tmp_path, nvml=None)  # the real lazy import path
    assert d.gpus() == [] and d.amdsmi_gpus() is None


def test_amdsmi_not_installed() -> None:
    mod, error = import_amdsmi()
    if mod is not None:  # pragma: no cover - only where a working amdsmi exists
        pytest.skip("amdsmi importable here")
    assert error
