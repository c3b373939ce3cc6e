"""Temp trees and a quiet whole run for the flash-loader tests (no tests here)."""

from __future__ import annotations

import io
from pathlib import Path

from flexinfer.flashloader import command as fl
from flexinfer.flashloader import config as fconf
from flexinfer.flashloader.config import FlashConfig

MiB = 1024 * 1024


def make_tree(root: Path, files: dict[str, bytes | int]) -> None:
    """``{rel: bytes or size}``; sizes get deterministic pseudo-random content."""
    for rel, content in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, int):
            content = (rel.encode() * (content // max(len(rel), 1) + 1))[:content]
        p.write_bytes(content)


def listing(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def cfg_for(src: Path, dst: Path, **kw: object) -> FlashConfig:
    return fconf.load_config({}, src=str(src), dst=str(dst), **kw)


def run_load(src: Path, dst: Path, **kw: object) -> fl.FlashReport:
    extra = {k: kw.pop(k) for k in ("free_bytes", "copier") if k in kw}
    return fl.flash_load(cfg_for(src, dst, **kw), out=io.StringIO(), **extra)  # type: ignore[arg-type]
