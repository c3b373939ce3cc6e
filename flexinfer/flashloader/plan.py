"""Flash-loader planning: which files to copy, and the preflight checks before any byte moves.

This module owns the selection rules (excluded prefixes; with ``FLASH_VARIANT=fp16``,
``X.safetensors`` is dropped whenever ``X.fp16.safetensors`` exists), the copy plan (files whose
destination is missing or differs in size, largest first), the space preflight (bytes to copy +
max(5 %, 10 MiB)) and the metadata side of the filesystem: walking the source (symlinks and special
files skipped, excluded directories pruned), destination sizes, stale ``*.flash-tmp`` removal, free
space, the source/destination sanity check. ``select_files``, ``plan_copies``, ``required_bytes`` and
``variant_name`` are pure. It reads no file contents and copies nothing (that is
:mod:`flexinfer.flashloader.transfer`).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from flexinfer.flashloader.config import FlashConfig, FlashError

TMP_SUFFIX = ".flash-tmp"
MB = 1_000_000
MiB = 1024 * 1024
SPACE_MARGIN_MIN = 10 * MiB  # the preflight keeps at least this much free
SPACE_MARGIN_FRACTION = 0.05  # ... or 5 % of the bytes to copy, whichever is larger
VARIANT_EXTENSIONS = (".safetensors", ".bin")


@dataclass(frozen=True, slots=True)
class SourceFile:
    """A regular file under the source root; ``rel`` is a '/'-separated relative path."""

    rel: str
    size: int
    mode: int = 0o644
    mtime_ns: int = 0


@dataclass(frozen=True, slots=True)
class Plan:
    """What the copy will do: ``copy`` jobs (largest first) and the files left alone, with why."""

    copy: tuple[SourceFile, ...]
    unchanged: tuple[SourceFile, ...] = ()
    excluded: tuple[str, ...] = ()
    variant_skipped: tuple[str, ...] = ()

    @property
    def bytes_to_copy(self) -> int:
        return sum(f.size for f in self.copy)


def is_excluded(rel: str, excludes: Sequence[str]) -> bool:
    """True when ``rel`` (a file, or a directory written with a trailing '/') starts with a prefix."""
    return any(rel.startswith(p) for p in excludes)


def variant_name(rel: str, variant: str) -> str | None:
    """The name of the ``variant`` twin of a weights file, or None when ``rel`` has none.

    ``unet/model.safetensors`` -> ``unet/model.fp16.safetensors``; sharded diffusers names too:
    ``model-00001-of-00002.safetensors`` -> ``model.fp16-00001-of-00002.safetensors``. A file that
    already is a variant (``*.fp16.*``) has no twin.
    """
    if not variant:
        return None
    head, _, name = rel.rpartition("/")
    prefix = f"{head}/" if head else ""
    for ext in VARIANT_EXTENSIONS:
        if not name.endswith(ext):
            continue
        stem = name[: -len(ext)]
        if f".{variant}" in stem:
            return None
        base, dash, shard = stem.rpartition("-of-")
        if dash and shard.isdigit():
            body, d2, idx = base.rpartition("-")
            if d2 and idx.isdigit() and body:
                return f"{prefix}{body}.{variant}-{idx}-of-{shard}{ext}"
        return f"{prefix}{stem}.{variant}{ext}"
    return None


def select_files(files: Iterable[SourceFile], excludes: Sequence[str],
                 variant: str = "") -> tuple[list[SourceFile], list[str], list[str]]:
    """Apply exclusions and the variant rule -> (kept, excluded rels, variant-skipped rels)."""
    all_files = list(files)
    names = {f.rel for f in all_files}
    kept: list[SourceFile] = []
    excluded: list[str] = []
    skipped: list[str] = []
    for f in all_files:
        if is_excluded(f.rel, excludes) or f.rel.endswith(TMP_SUFFIX):
            excluded.append(f.rel)
            continue
        twin = variant_name(f.rel, variant)
        if twin is not None and twin in names and not is_excluded(twin, excludes):
            skipped.append(f.rel)
            continue
        kept.append(f)
    return kept, excluded, skipped


def plan_copies(files: Iterable[SourceFile], dst_sizes: Mapping[str, int], *,
                excluded: Sequence[str] = (), variant_skipped: Sequence[str] = (),
                force: Iterable[str] = ()) -> Plan:
    """Files whose destination is missing or differs in size are copied, largest first (better
    balance across workers); equal sizes are left alone unless named in ``force``."""
    forced = set(force)
    copy: list[SourceFile] = []
    unchanged: list[SourceFile] = []
    for f in files:
        if dst_sizes.get(f.rel) == f.size and f.rel not in forced:
            unchanged.append(f)
        else:
            copy.append(f)
    copy.sort(key=lambda f: (-f.size, f.rel))
    return Plan(tuple(copy), tuple(unchanged), tuple(excluded), tuple(variant_skipped))


def required_bytes(bytes_to_copy: int) -> int:
    """Free bytes the destination needs: the data plus max(5 %, 10 MiB) of headroom."""
    if bytes_to_copy <= 0:
        return 0
    return bytes_to_copy + max(int(bytes_to_copy * SPACE_MARGIN_FRACTION), SPACE_MARGIN_MIN)


def check_space(dst: str, bytes_to_copy: int, free_bytes: Callable[[str], int]) -> None:
    """The preflight: FlashError unless ``free_bytes(dst)`` covers :func:`required_bytes`."""
    need = required_bytes(bytes_to_copy)
    if need:
        free = free_bytes(dst)
        if free < need:
            raise FlashError(
                f"not enough space on {dst}: need {fmt_bytes(need)} ({fmt_bytes(bytes_to_copy)} "
                f"+ {fmt_bytes(need - bytes_to_copy)} headroom), {fmt_bytes(free)} free")


def fmt_bytes(n: float) -> str:
    """Human size in powers of 1000 (as MB/s is)."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1000
    return f"{n:.2f} TB"  # pragma: no cover


@dataclass(frozen=True, slots=True)
class Walk:
    """Result of walking the source: regular files (sorted), pruned paths and symlink count."""

    files: tuple[SourceFile, ...]
    pruned: tuple[str, ...] = ()
    symlinks: int = 0


def walk_source(root: str, excludes: Sequence[str]) -> Walk:
    """Regular files under ``root``; symlinks and special files are skipped, excluded dirs pruned."""
    files: list[SourceFile] = []
    pruned: list[str] = []
    symlinks = 0
    stack = [""]
    while stack:
        rel_dir = stack.pop()
        with os.scandir(os.path.join(root, rel_dir) if rel_dir else root) as it:
            entries = sorted(it, key=lambda e: e.name)
        for e in entries:
            rel = f"{rel_dir}{e.name}"
            if e.is_symlink():
                symlinks += 1
                continue
            if e.is_dir(follow_symlinks=False):
                if is_excluded(rel + "/", excludes):
                    pruned.append(rel + "/")
                else:
                    stack.append(rel + "/")
            elif e.is_file(follow_symlinks=False):
                st = e.stat(follow_symlinks=False)
                files.append(SourceFile(rel, st.st_size, stat.S_IMODE(st.st_mode), st.st_mtime_ns))
    files.sort(key=lambda f: f.rel)
    return Walk(tuple(files), tuple(pruned), symlinks)


def destination_sizes(dst: str, rels: Iterable[str]) -> dict[str, int]:
    """Size of each ``rel`` that exists under ``dst`` as a regular file (symlinks do not count)."""
    out: dict[str, int] = {}
    for rel in rels:
        try:
            st = os.lstat(os.path.join(dst, rel))
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            out[rel] = st.st_size
    return out


def remove_stale_tmp(dst: str) -> int:
    """Delete ``*.flash-tmp`` files left under ``dst`` by an interrupted run; returns how many."""
    removed = 0
    if not os.path.isdir(dst):
        return 0
    for dirpath, _dirs, names in os.walk(dst, followlinks=False):
        for name in names:
            if name.endswith(TMP_SUFFIX):
                path = os.path.join(dirpath, name)
                if os.path.islink(path) or os.path.isfile(path):
                    os.unlink(path)
                    removed += 1
    return removed


def statvfs_free_bytes(path: str) -> int:
    """Bytes an unprivileged writer may still use on the filesystem holding ``path`` (or its
    nearest existing ancestor, since the destination may not exist yet)."""
    p = os.path.abspath(path)
    while not os.path.exists(p):
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    st = os.statvfs(p)
    return st.f_bavail * st.f_frsize


def check_roots(cfg: FlashConfig) -> None:
    """The source is a directory; the destination is a directory or missing, and not inside it."""
    if not os.path.isdir(cfg.src):
        raise FlashError(f"source {cfg.src!r} is not a directory")
    src = os.path.realpath(cfg.src)
    dst = os.path.realpath(cfg.dst)
    if dst == src or dst.startswith(src.rstrip("/") + "/"):
        raise FlashError(f"destination {cfg.dst!r} must not be inside the source {cfg.src!r}")
    if os.path.exists(cfg.dst) and not os.path.isdir(cfg.dst):
        raise FlashError(f"destination {cfg.dst!r} exists and is not a directory")
