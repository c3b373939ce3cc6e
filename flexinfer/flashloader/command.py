"""The ``flexinfer flash-load`` command and the run that strings the flash-loader's parts together.

This module owns the command (flags, exit codes, one-line errors) and :func:`flash_load`: steps 1-6 of
:mod:`flexinfer.flashloader` in order, the thread pool that copies the planned files (one
:func:`~flexinfer.flashloader.transfer.copy_file` each), the progress line and the final report. What to
copy is :mod:`flexinfer.flashloader.plan`'s, how one file's bytes move is
:mod:`flexinfer.flashloader.transfer`'s. Like every part of the flash-loader, it must not import
asyncio, Kubernetes clients or anything heavy.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import TextIO

from flexinfer.errors import report_failure
from flexinfer.flashloader.config import FlashConfig, FlashError, load_config
from flexinfer.flashloader.plan import (
    MB,
    Plan,
    SourceFile,
    Walk,
    check_roots,
    check_space,
    destination_sizes,
    fmt_bytes,
    plan_copies,
    remove_stale_tmp,
    select_files,
    statvfs_free_bytes,
    walk_source,
)
from flexinfer.flashloader.transfer import (
    Cancelled,
    Copier,
    CopyProgress,
    copy_data,
    copy_file,
    fsync_dirs,
    sha256_file,
)
from flexinfer.settings import SettingsError

log = logging.getLogger("flexinfer.flashloader")


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
    ``copier`` default to :func:`statvfs_free_bytes` and :func:`copy_data` (looked up in this module
    at call time, so tests may patch them here)."""
    out = sys.stderr if out is None else out
    free_bytes = free_bytes or statvfs_free_bytes
    copier = copier or copy_data
    tty = bool(getattr(out, "isatty", lambda: False)())
    interval = progress_interval if progress_interval is not None else (0.5 if tty else 5.0)
    check_roots(cfg)
    stale = remove_stale_tmp(cfg.dst)
    walk = walk_source(cfg.src, cfg.exclude)
    plan = make_plan(cfg, walk)
    check_space(cfg.dst, plan.bytes_to_copy, free_bytes)
    try:
        os.makedirs(cfg.dst, exist_ok=True)
        dirs = sorted({os.path.dirname(os.path.join(cfg.dst, f.rel)) for f in plan.copy})
        for d in dirs:
            os.makedirs(d, exist_ok=True)
    except OSError as exc:
        raise FlashError(f"cannot create directories under {cfg.dst}: {exc.strerror or exc}") from None

    progress = CopyProgress(plan.bytes_to_copy, len(plan.copy))
    stop = threading.Event()
    methods: Counter[str] = Counter()
    first_error: BaseException | None = None
    if plan.copy:
        workers = min(cfg.concurrency, len(plan.copy))
        pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="flash")
        try:
            pending: set[Future[str]] = {pool.submit(copy_file, job, cfg, copier, progress, stop)
                                         for job in plan.copy}
            last = time.monotonic()
            while pending:
                done, pending = wait(pending, timeout=interval, return_when=FIRST_EXCEPTION)
                for fut in done:
                    err = fut.exception()
                    if err is None:
                        methods[fut.result()] += 1
                    elif first_error is None and not isinstance(err, Cancelled):
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
        fsync_dirs(sorted({os.path.dirname(os.path.join(cfg.dst, f.rel)) for f in plan.copy}))
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
    except Exception as exc:  # no traceback for the user; --log-level debug shows it
        return report_failure("flash-load", exc, (FlashError, SettingsError), log)
    return 0
