"""Flash-loader configuration: :class:`FlashConfig` from the FLASH_* environment and CLI flags, and
:class:`FlashError`, the one error the command reports.

This module owns the settings of ``flexinfer flash-load`` (read once through
:func:`flexinfer.settings.from_env`, flags win), their validation and normalisation (``FLASH_VERIFY``
spellings, exclude prefixes made relative with ``.cache/`` and ``.git/`` first). It does no I/O and
must not import the planning or transfer modules.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from flexinfer.settings import SettingsError, from_env
from flexinfer.settings import setting as _f

DEFAULT_EXCLUDES: tuple[str, ...] = (".cache/", ".git/")


class FlashError(Exception):
    """A failure with a one-line message meant for the user; the command exits 1 with it."""


# ---- configuration ---------------------------------------------------------------------------

_VERIFY_MODES = {
    "": "none", "0": "none", "false": "none", "no": "none", "off": "none", "none": "none",
    "1": "size", "true": "size", "yes": "size", "on": "size", "size": "size",
    "sha256": "sha256",
}


def normalize_verify(raw: str) -> str:
    """``FLASH_VERIFY`` -> ``"none"``, ``"size"`` or ``"sha256"``."""
    mode = _VERIFY_MODES.get(raw.strip().lower())
    if mode is None:
        raise SettingsError(f"FLASH_VERIFY: expected false, true, size or sha256, got {raw!r}")
    return mode


def normalize_excludes(prefixes: Iterable[str]) -> tuple[str, ...]:
    """User prefixes made relative (``./x`` and ``/x`` mean ``x``), defaults first, no duplicates."""
    out: list[str] = list(DEFAULT_EXCLUDES)
    for p in prefixes:
        p = p.strip().replace(os.sep, "/")
        while p.startswith("./"):
            p = p[2:]
        p = p.lstrip("/")
        if p and p not in out:
            out.append(p)
    return tuple(out)


@dataclass(frozen=True, slots=True)
class FlashConfig:
    """What to copy and how. Built by :func:`load_config`; every field has a FLASH_* variable."""

    src: str = _f("", "FLASH_SRC", "Source directory (PVC or hostPath mount). Required.")
    dst: str = _f("", "FLASH_DST", "Destination directory, usually under /dev/shm. Required.")
    concurrency: int = _f(4, "FLASH_CONCURRENCY", "Files copied at the same time (threads).")
    buffer_kb: int = _f(4096, "FLASH_BUFFER_KB", "Buffer of the read/write fallback loop, in KiB.")
    verify: str = _f("none", "FLASH_VERIFY", "none (false) | size (true) | sha256: check each copy.")
    exclude: tuple[str, ...] = _f(DEFAULT_EXCLUDES, "FLASH_EXCLUDE",
                                  "Path prefixes not copied; comma-separated, added to .cache/ and .git/.")
    variant: str = _f("", "FLASH_VARIANT", "e.g. fp16: skip X.safetensors when X.fp16.safetensors exists.")

    def validate(self) -> None:
        if not self.src:
            raise SettingsError("FLASH_SRC (or --src) is required")
        if not self.dst:
            raise SettingsError("FLASH_DST (or --dst) is required")
        if not 1 <= self.concurrency <= 256:
            raise SettingsError(f"FLASH_CONCURRENCY must be 1..256, got {self.concurrency}")
        if not 4 <= self.buffer_kb <= 1024 * 1024:
            raise SettingsError(f"FLASH_BUFFER_KB must be 4..1048576, got {self.buffer_kb}")
        normalize_verify(self.verify)
        if self.variant and not all(c.isalnum() or c in "_-" for c in self.variant):
            raise SettingsError(f"FLASH_VARIANT must be a plain name like fp16, got {self.variant!r}")

    @property
    def buffer_bytes(self) -> int:
        return self.buffer_kb * 1024


def load_config(env: Mapping[str, str] | None = None, **overrides: Any) -> FlashConfig:
    """Read the FLASH_* environment once (``None``: the process environment); ``overrides`` are CLI
    flags (``None`` = not given) and win over the environment. Raises SettingsError."""
    cfg: FlashConfig = from_env(FlashConfig, env, **overrides)
    return replace(cfg, verify=normalize_verify(cfg.verify), exclude=normalize_excludes(cfg.exclude),
                   variant=cfg.variant.strip())
