"""Heap tuning of the extender process for its 20 MiB request bodies (reliability plan F20).

Owns: :func:`tune_malloc`. A ``nodeCacheCapable: false`` kube-scheduler sends the whole NodeList on
every ``/filter`` and ``/score`` (~4 KiB per node: 20.7 MiB for 5,000 nodes). glibc's malloc serves
blocks that large with ``mmap`` and gives freed heap tops back to the kernel, so every request's body
pieces, its joined copy and the ``/filter`` echo land in fresh pages: measured here, the page faults
of that fresh memory cost ~40 ms CPU per 20.7 MiB request (58-64 ms → 15-21 ms for the HTTP core alone
to receive the body, and the wall time to answer fell ~150 ms on the loaded 2-core box). Raising
``M_MMAP_THRESHOLD`` above the body limit and ``M_TRIM_THRESHOLD`` to a few body limits keeps those
blocks in the heap and reuses them warm; the cost is that the process keeps up to the trim threshold
of freed memory (its RSS stays near its peak instead of shrinking between requests).

Must not: fail the process. Only glibc has ``mallopt`` with these meanings; elsewhere (musl, macOS)
this is a no-op that says so.
"""

from __future__ import annotations

import ctypes
import logging
import platform

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3


def tune_malloc(max_body: int) -> bool:
    """Keep blocks up to ``2 × max_body`` off ``mmap`` and up to ``8 × max_body`` of freed heap top
    in the process (glibc only). True when both settings took."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        log.info("malloc tuning skipped: not glibc")
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # pragma: no cover - glibc always has it
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    cap = 2**31 - 1
    ok = bool(mallopt(M_MMAP_THRESHOLD, min(2 * max_body, cap))) and bool(
        mallopt(M_TRIM_THRESHOLD, min(8 * max_body, cap)))
    if not ok:  # pragma: no cover - glibc refuses a threshold over its heap maximum
        log.warning("malloc tuning refused by glibc (max body %d bytes)", max_body)
    return ok
