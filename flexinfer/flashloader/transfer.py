"""Flash-loader copy engine: move one file's bytes as fast as the kernel allows, and never leave a
partial file under a final name.

This module owns the data path: :func:`copy_data` (``copy_file_range`` -> ``sendfile`` -> a buffered
read/write loop, falling back only on "not supported here" errnos), :func:`copy_file` (write to
``<f>.flash-tmp``, fsync, optionally verify size or sha256, rename over the final name, remove the tmp
file on any failure), the shared progress counter, SHA-256 of a file and the directory fsync. What to
copy is :mod:`flexinfer.flashloader.plan`'s; the thread pool and the report are
:mod:`flexinfer.flashloader.command`'s.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from flexinfer.flashloader.config import FlashConfig, FlashError
from flexinfer.flashloader.plan import MB, TMP_SUFFIX, MiB, SourceFile, fmt_bytes

log = logging.getLogger("flexinfer.flashloader")

KERNEL_CHUNK = 64 * MiB  # bytes per copy_file_range / sendfile call (progress granularity)

# errno values meaning "this copy path does not work here": try the next one (only before any byte moved).
_FALLBACK_ERRNOS = frozenset(
    e for e in (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, getattr(errno, "ENOTSUP", None),
                errno.EINVAL, errno.EPERM, errno.EBADF) if e is not None
)
COPY_METHODS: tuple[str, ...] = ("copy_file_range", "sendfile", "buffered")


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


ChunkCallback = Callable[[int], None]
Copier = Callable[[int, int, int, int, ChunkCallback], str]
"""``copier(src_fd, dst_fd, size, buffer_bytes, on_chunk) -> method used``; copies to EOF."""


def _kernel_copy(copy: Callable[[int], int], method: str, done: int, used: list[str],
                 on_chunk: ChunkCallback) -> int:
    """``copy(offset)`` (one in-kernel chunk at that source offset: bytes copied, 0 at EOF) until EOF;
    returns the new offset. ``method`` goes into ``used`` once it has copied a byte."""
    while True:
        n = copy(done)
        if n == 0:
            return done
        done += n
        if method not in used:
            used.append(method)
        on_chunk(n)


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
                done = _kernel_copy(lambda at: os.copy_file_range(src_fd, dst_fd, chunk, at, at),
                                    method, done, used, on_chunk)
            elif method == "sendfile" and hasattr(os, "sendfile"):
                os.lseek(dst_fd, done, os.SEEK_SET)
                done = _kernel_copy(lambda at: os.sendfile(dst_fd, src_fd, at, chunk), method, done, used, on_chunk)
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
class CopyProgress:
    """Bytes and files done so far, shared by the copy workers (locked), and its progress line."""

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


class Cancelled(Exception):
    """Raised inside a worker once the run is stopping (another file failed, or Ctrl-C)."""


def copy_file(job: SourceFile, cfg: FlashConfig, copier: Copier, progress: CopyProgress,
              stop: threading.Event) -> str:
    """Copy one file to ``<dst>.flash-tmp`` with ``copier``, fsync, verify (size, or sha256), keep
    mode and mtime, rename over the final name; the tmp file is removed on any failure. Returns the
    copy method used; raises FlashError, or Cancelled once ``stop`` is set."""
    if stop.is_set():
        raise Cancelled
    src = os.path.join(cfg.src, job.rel)
    dst = os.path.join(cfg.dst, job.rel)
    tmp = dst + TMP_SUFFIX

    def on_chunk(n: int) -> None:
        progress.add(n)
        if stop.is_set():
            raise Cancelled

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


def fsync_dirs(paths: Iterable[str]) -> None:
    """fsync each directory so the renames in it are durable (best effort)."""
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
