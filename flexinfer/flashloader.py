"""Flash-loader (``flexinfer flash-load``): copy a model directory into tmpfs, in parallel, safely.

This module owns the whole copy of model files from a slow volume (PVC, hostPath) into a fast one
(``/dev/shm/...``) before a backend starts, as the original ``flexinfer-flash-loader`` init container
did (``shared/reference/flexinfer-upstream.md`` §7.2):

1. remove stale ``*.flash-tmp`` files that an interrupted run left under the destination;
2. walk the source (symlinks and special files skipped, excluded prefixes pruned);
3. plan: drop excluded files and, with ``FLASH_VARIANT=fp16``, ``X.safetensors`` whenever
   ``X.fp16.safetensors`` exists; skip files whose destination already has the same size;
4. preflight the free space of the destination (bytes to copy + max(5 %, 10 MiB));
5. copy with a thread pool, each file through the fastest path the kernel offers
   (``copy_file_range`` -> ``sendfile`` -> a buffered read/write loop), written to
   ``<f>.flash-tmp``, fsynced, optionally verified, then renamed over the final name, so a final
   name never holds a partial file;
6. report progress and MB/s (10^6 bytes per second) on stderr.

Planning (``select_files``, ``plan_copies``, ``required_bytes``, ``variant_name``) is pure; the
walk, the copy and the command shell are thin around it. Configuration comes from the environment
through :func:`flexinfer.settings.from_env` (FLASH_* variables), overridden by CLI flags.
This module must not import asyncio, Kubernetes clients or anything heavy: it runs as an init
container before anything else.
"""

from __future__ import annotations

import argparse
import errno
import hashlib
import logging
import os
import stat
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from typing import Any, TextIO

from flexinfer.settings import SettingsError, from_env

log = logging.getLogger("flexinfer.flashloader")

TMP_SUFFIX = ".flash-tmp"
DEFAULT_EXCLUDES: tuple[str, ...] = (".cache/", ".git/")
MB = 1_000_000
MiB = 1024 * 1024
SPACE_MARGIN_MIN = 10 * MiB  # the preflight keeps at least this much free
SPACE_MARGIN_FRACTION = 0.05  # ... or 5 % of the bytes to copy, whichever is larger
KERNEL_CHUNK = 64 * MiB  # bytes per copy_file_range / sendfile call (progress granularity)
VARIANT_EXTENSIONS = (".safetensors", ".bin")

# errno values meaning "this copy path does not work here": try the next one (only before any byte moved).
_FALLBACK_ERRNOS = frozenset(
    e for e in (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, getattr(errno, "ENOTSUP", None),
                errno.EINVAL, errno.EPERM, errno.EBADF) if e is not None
)
COPY_METHODS: tuple[str, ...] = ("copy_file_range", "sendfile", "buffered")


class FlashError(Exception):
    """A failure with a one-line message meant for the user; the command exits 1 with it."""


# ---- configuration ---------------------------------------------------------------------------

def _f(default: Any, env: str, doc: str) -> Any:
    return field(default=default, metadata={"env": env, "doc": doc})


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


# ---- planning (pure) -------------------------------------------------------------------------

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


def fmt_bytes(n: float) -> str:
    """Human size in powers of 1000 (as MB/s is)."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1000
    return f"{n:.2f} TB"  # pragma: no cover


# ---- filesystem side -------------------------------------------------------------------------

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


def _fadvise_sequential(fd: int) -> None:
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
    except (AttributeError, OSError):
        pass


def sha256_file(path: str, buffer_bytes: int = 4 * MiB) -> str:
    """Hex SHA-256 of a file, read sequentially (hashlib releases the GIL on large updates)."""
    h = hashlib.sha256()
    buf = bytearray(buffer_bytes)
    view = memoryview(buf)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        _fadvise_sequential(fd)
        while True:
            n = os.readv(fd, [buf])
            if n == 0:
                break
            h.update(view[:n])
    finally:
        os.close(fd)
    return h.hexdigest()


# ---- copying ---------------------------------------------------------------------------------

ChunkCallback = Callable[[int], None]
Copier = Callable[[int, int, int, int, ChunkCallback], str]
"""``copier(src_fd, dst_fd, size, buffer_bytes, on_chunk) -> method used``; copies to EOF."""


def copy_data(src_fd: int, dst_fd: int, size: int, buffer_bytes: int, on_chunk: ChunkCallback,
              methods: Sequence[str] = COPY_METHODS) -> str:
    """Copy ``src_fd`` to ``dst_fd`` from offset 0 to EOF with the first method that works.

    ``copy_file_range`` (in-kernel, reflink on the same XFS/btrfs) falls back to ``sendfile``
    (in-kernel, works across filesystems, e.g. ext4/NFS -> tmpfs since Linux 5.19 refuses
    cross-fs copy_file_range) and then to a read/write loop with ``buffer_bytes``. A method is
    abandoned only with one of the "not supported here" errnos, or when it stops short of ``size``;
    the next one continues at the same offset. ``on_chunk(n)`` is called after every chunk and may
    raise to abort. Returns the names of the methods used, '+'-joined.
    """
    done = 0
    used: list[str] = []
    chunk = max(buffer_bytes, KERNEL_CHUNK)
    for method in methods:
        eof = False
        try:
            if method == "copy_file_range" and hasattr(os, "copy_file_range"):
                while True:
                    n = os.copy_file_range(src_fd, dst_fd, chunk, done, done)
                    if n == 0:
                        break
                    done += n
                    if method not in used:
                        used.append(method)
                    on_chunk(n)
            elif method == "sendfile" and hasattr(os, "sendfile"):
                os.lseek(dst_fd, done, os.SEEK_SET)
                while True:
                    n = os.sendfile(dst_fd, src_fd, done, chunk)
                    if n == 0:
                        break
                    done += n
                    if method not in used:
                        used.append(method)
                    on_chunk(n)
            elif method == "buffered":
                os.lseek(src_fd, done, os.SEEK_SET)
                os.lseek(dst_fd, done, os.SEEK_SET)
                buf = bytearray(buffer_bytes)
                view = memoryview(buf)
                used.append(method)
                while True:
                    n = os.readv(src_fd, [buf])
                    if n == 0:
                        break
                    w = 0
                    while w < n:
                        w += os.write(dst_fd, view[w:n])
                    done += n
                    on_chunk(n)
                eof = True
            else:
                continue
        except OSError as exc:
            if exc.errno in _FALLBACK_ERRNOS and method != "buffered" and method not in used:
                log.debug("%s unavailable (%s); trying the next copy method", method, exc)
                continue
            raise
        if eof or done >= size:
            break
        # stopped short (0 before the expected size): continue with the next method
    return "+".join(used) or "empty"


@dataclass
class _Progress:
    total_bytes: int
    total_files: int
    started: float = field(default_factory=time.monotonic)
    bytes_done: int = 0
    files_done: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, n: int) -> None:
        with self.lock:
            self.bytes_done += n

    def file_done(self) -> None:
        with self.lock:
            self.files_done += 1

    def line(self) -> str:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        pct = 100.0 * self.bytes_done / self.total_bytes if self.total_bytes else 100.0
        return (f"flash-load: {fmt_bytes(self.bytes_done)} / {fmt_bytes(self.total_bytes)} ({pct:.0f}%), "
                f"{self.files_done}/{self.total_files} files, {self.bytes_done / MB / elapsed:.0f} MB/s")


class _Cancelled(Exception):
    pass


@dataclass(frozen=True, slots=True)
class FlashReport:
    """What a run did; ``mb_per_s`` is copied bytes / 10^6 / copy seconds."""

    copied_files: int
    copied_bytes: int
    seconds: float
    unchanged: int
    excluded: int
    variant_skipped: int
    symlinks_skipped: int
    stale_removed: int
    methods: dict[str, int]

    @property
    def mb_per_s(self) -> float:
        return self.copied_bytes / MB / self.seconds if self.seconds > 0 else 0.0


def _copy_one(job: SourceFile, cfg: FlashConfig, copier: Copier, progress: _Progress,
              stop: threading.Event) -> str:
    if stop.is_set():
        raise _Cancelled
    src = os.path.join(cfg.src, job.rel)
    dst = os.path.join(cfg.dst, job.rel)
    tmp = dst + TMP_SUFFIX

    def on_chunk(n: int) -> None:
        progress.add(n)
        if stop.is_set():
            raise _Cancelled

    try:
        src_fd = os.open(src, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise FlashError(f"cannot open {src}: {exc.strerror}") from None
    copied = 0
    try:
        _fadvise_sequential(src_fd)
        size = os.fstat(src_fd).st_size
        try:
            dst_fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise FlashError(f"cannot create {tmp}: {exc.strerror}") from None
        try:
            try:
                def counting(n: int) -> None:
                    nonlocal copied
                    copied += n
                    on_chunk(n)
                method = copier(src_fd, dst_fd, size, cfg.buffer_bytes, counting)
                os.fchmod(dst_fd, job.mode & 0o7777)
                os.fsync(dst_fd)
                written = os.fstat(dst_fd).st_size
            finally:
                os.close(dst_fd)
            if written != size or (cfg.verify != "none" and os.stat(src).st_size != size):
                raise FlashError(f"size mismatch after copying {job.rel}: source {size} bytes, "
                                 f"copy {written} bytes (did the source change?)")
            if cfg.verify == "sha256":
                want, got = sha256_file(src, cfg.buffer_bytes), sha256_file(tmp, cfg.buffer_bytes)
                if want != got:
                    raise FlashError(f"sha256 mismatch after copying {job.rel}: source {want[:16]}…, "
                                     f"copy {got[:16]}…")
            if job.mtime_ns:
                os.utime(tmp, ns=(job.mtime_ns, job.mtime_ns))
            os.replace(tmp, dst)
        except BaseException as exc:
            progress.add(-copied)
            try:
                os.unlink(tmp)
            except OSError:
                pass
            if isinstance(exc, OSError):
                if exc.errno == errno.ENOSPC:
                    raise FlashError(f"no space left on the destination while writing {job.rel}") from None
                raise FlashError(f"copying {job.rel} failed: {exc.strerror or exc}") from None
            raise
    finally:
        os.close(src_fd)
    progress.file_done()
    return method


def _fsync_dirs(paths: Iterable[str]) -> None:
    for d in paths:
        try:
            fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            os.fsync(fd)
        except OSError:
            pass
        finally:
            os.close(fd)


def _check_roots(cfg: FlashConfig) -> None:
    if not os.path.isdir(cfg.src):
        raise FlashError(f"source {cfg.src!r} is not a directory")
    src = os.path.realpath(cfg.src)
    dst = os.path.realpath(cfg.dst)
    if dst == src or dst.startswith(src.rstrip("/") + "/"):
        raise FlashError(f"destination {cfg.dst!r} must not be inside the source {cfg.src!r}")
    if os.path.exists(cfg.dst) and not os.path.isdir(cfg.dst):
        raise FlashError(f"destination {cfg.dst!r} exists and is not a directory")


def make_plan(cfg: FlashConfig, walk: Walk) -> Plan:
    """Select and plan against the current destination (sha256 mode re-hashes equal-size files
    and re-copies the ones that differ, so a corrupted tmpfs copy is repaired)."""
    kept, excluded, skipped = select_files(walk.files, cfg.exclude, cfg.variant)
    sizes = destination_sizes(cfg.dst, (f.rel for f in kept))
    plan = plan_copies(kept, sizes, excluded=list(walk.pruned) + excluded, variant_skipped=skipped)
    if cfg.verify == "sha256" and plan.unchanged:
        with ThreadPoolExecutor(max_workers=cfg.concurrency) as pool:
            def differs(f: SourceFile) -> bool:
                return sha256_file(os.path.join(cfg.src, f.rel), cfg.buffer_bytes) != \
                    sha256_file(os.path.join(cfg.dst, f.rel), cfg.buffer_bytes)
            stale = [f.rel for f, d in zip(plan.unchanged, pool.map(differs, plan.unchanged), strict=True) if d]
        if stale:
            log.info("sha256 differs for %d equal-size files; copying them again", len(stale))
            plan = plan_copies(kept, sizes, excluded=plan.excluded, variant_skipped=skipped, force=stale)
    return plan


def flash_load(cfg: FlashConfig, *, free_bytes: Callable[[str], int] | None = None,
               copier: Copier | None = None, out: TextIO | None = None,
               progress_interval: float | None = None) -> FlashReport:
    """Run the whole copy. Raises FlashError (one-line message) on any failure; the final names
    then hold either the old file or a complete new one, never a partial one. ``free_bytes`` and
    ``copier`` default to :func:`statvfs_free_bytes` and :func:`copy_data` (looked up at call time,
    so tests may patch them)."""
    out = sys.stderr if out is None else out
    free_bytes = free_bytes or statvfs_free_bytes
    copier = copier or copy_data
    tty = bool(getattr(out, "isatty", lambda: False)())
    interval = progress_interval if progress_interval is not None else (0.5 if tty else 5.0)
    _check_roots(cfg)
    stale = remove_stale_tmp(cfg.dst)
    walk = walk_source(cfg.src, cfg.exclude)
    plan = make_plan(cfg, walk)
    need = required_bytes(plan.bytes_to_copy)
    if need:
        free = free_bytes(cfg.dst)
        if free < need:
            raise FlashError(
                f"not enough space on {cfg.dst}: need {fmt_bytes(need)} ({fmt_bytes(plan.bytes_to_copy)} "
                f"+ {fmt_bytes(need - plan.bytes_to_copy)} headroom), {fmt_bytes(free)} free")
    try:
        os.makedirs(cfg.dst, exist_ok=True)
        dirs = sorted({os.path.dirname(os.path.join(cfg.dst, f.rel)) for f in plan.copy})
        for d in dirs:
            os.makedirs(d, exist_ok=True)
    except OSError as exc:
        raise FlashError(f"cannot create directories under {cfg.dst}: {exc.strerror or exc}") from None

    progress = _Progress(plan.bytes_to_copy, len(plan.copy))
    stop = threading.Event()
    methods: Counter[str] = Counter()
    first_error: BaseException | None = None
    if plan.copy:
        workers = min(cfg.concurrency, len(plan.copy))
        pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="flash")
        try:
            pending: set[Future[str]] = {pool.submit(_copy_one, job, cfg, copier, progress, stop)
                                         for job in plan.copy}
            last = time.monotonic()
            while pending:
                done, pending = wait(pending, timeout=interval, return_when=FIRST_EXCEPTION)
                for fut in done:
                    err = fut.exception()
                    if err is None:
                        methods[fut.result()] += 1
                    elif first_error is None and not isinstance(err, _Cancelled):
                        first_error = err
                        stop.set()
                now = time.monotonic()
                if pending and now - last >= interval * 0.99:
                    last = now
                    out.write(("\r" + progress.line() + "\x1b[K") if tty else progress.line() + "\n")
                    out.flush()
        except BaseException:
            stop.set()  # KeyboardInterrupt: workers abort at their next chunk and remove their tmp files
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        if tty:
            out.write("\r\x1b[K")
        if first_error is not None:
            if isinstance(first_error, FlashError):
                raise first_error
            raise FlashError(f"copy failed: {first_error}") from None
        _fsync_dirs(sorted({os.path.dirname(os.path.join(cfg.dst, f.rel)) for f in plan.copy}))
    elapsed = time.monotonic() - progress.started
    report = FlashReport(len(plan.copy), plan.bytes_to_copy, elapsed, len(plan.unchanged),
                         len(plan.excluded), len(plan.variant_skipped), walk.symlinks, stale, dict(methods))
    parts = [f"flash-load: copied {report.copied_files} files ({fmt_bytes(report.copied_bytes)}) "
             f"in {elapsed:.2f} s, {report.mb_per_s:.0f} MB/s"]
    if report.unchanged:
        parts.append(f"{report.unchanged} unchanged")
    if report.excluded:
        parts.append(f"{report.excluded} excluded")
    if report.variant_skipped:
        parts.append(f"{report.variant_skipped} replaced by .{cfg.variant} variants")
    if report.symlinks_skipped:
        parts.append(f"{report.symlinks_skipped} symlinks skipped")
    if stale:
        parts.append(f"{stale} stale tmp files removed")
    if methods:
        parts.append("via " + ", ".join(f"{m} ×{n}" for m, n in sorted(methods.items())))
    out.write("; ".join(parts) + "\n")
    if not walk.files and walk.symlinks:
        out.write("flash-load: warning: the source holds only symlinks (a Hugging Face snapshot?); "
                  "point FLASH_SRC at the real files\n")
    out.flush()
    return report


# ---- command ---------------------------------------------------------------------------------

def configure(parser: argparse.ArgumentParser) -> None:
    """Flags of ``flexinfer flash-load``; each overrides its FLASH_* variable."""
    parser.description = ("Copy a model directory into tmpfs in parallel (tmp file + rename, skip equal "
                          "sizes). Flags override the FLASH_* environment variables.")
    parser.add_argument("--src", help="source directory (FLASH_SRC)")
    parser.add_argument("--dst", help="destination directory (FLASH_DST)")
    parser.add_argument("--concurrency", type=int, help="parallel copies (FLASH_CONCURRENCY, default 4)")
    parser.add_argument("--buffer-kb", type=int, help="read/write fallback buffer (FLASH_BUFFER_KB, 4096)")
    parser.add_argument("--verify", help="false | true/size | sha256 (FLASH_VERIFY, default false)")
    parser.add_argument("--exclude", action="append",
                        help="comma-separated path prefixes to skip, repeatable; added to .cache/ and "
                             ".git/ (FLASH_EXCLUDE)")
    parser.add_argument("--variant", help="e.g. fp16: skip X.safetensors when X.fp16.safetensors exists "
                                          "(FLASH_VARIANT)")


def run(args: argparse.Namespace) -> int:
    """Exit 0 on success, 1 with a one-line message on stderr on any failure."""
    exclude = None
    if getattr(args, "exclude", None):
        exclude = tuple(p for item in args.exclude for p in item.split(",") if p.strip())
    try:
        cfg = load_config(None, src=args.src, dst=args.dst, concurrency=args.concurrency,
                          buffer_kb=args.buffer_kb, verify=args.verify, exclude=exclude,
                          variant=args.variant)
        flash_load(cfg)
    except (FlashError, SettingsError) as exc:
        print(f"flash-load: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename else ""
        print(f"flash-load: error: {exc.strerror or exc}{where}", file=sys.stderr)
        return 1
    except Exception as exc:  # no traceback for the user; --log-level debug shows it
        log.debug("flash-load failed", exc_info=True)
        print(f"flash-load: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0
