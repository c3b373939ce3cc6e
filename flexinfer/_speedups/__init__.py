"""Compiled hot paths with pure-Python twins, and the one switch between them.

Owns: choosing, per primitive, the compiled ``<name>_c`` module or its ``<name>_py`` twin,
and saying which one is active. Must not: import anything from flexinfer (this package sits
below every layer), or do work at import beyond loading the modules.

* ``FLEXINFER_NO_EXTENSIONS`` set to anything but ``""``/``"0"`` forces the Python twins
  (the same rule as ``setup.py``). Otherwise each primitive uses its compiled module when
  it imports, and its twin on ``ImportError`` (no compiler at install time, a stale or
  foreign build), so a pure install always works.
* ``IMPLEMENTATIONS`` maps each primitive to ``"c"`` or ``"py"``; ``IMPLEMENTATION`` is
  ``"c"`` or ``"py"`` when all agree, else ``"mixed"``. ``flexinfer.__speedups__`` reads it.
* Type checkers always see the Python twins (same API, typed).
"""

from __future__ import annotations

import os
from importlib import import_module
from types import ModuleType
from typing import TYPE_CHECKING

__all__ = [
    "IMPLEMENTATION",
    "IMPLEMENTATIONS",
    "NO_EXTENSIONS",
    "PRIMITIVES",
    "BodyFrame",
    "BucketRegistry",
    "ChunkedBody",
    "FramingError",
    "HashRing",
    "LengthBody",
    "SharedBuckets",
    "SharedCounts",
    "SharedPrefixes",
    "SseClock",
    "TableFull",
    "TokenBucket",
    "best_of",
    "chained_block_hashes",
    "event_end",
    "frame_chunk",
    "head_block",
    "head_end",
    "head_lines_ok",
    "keep_below",
    "key_hash",
    "kv_free",
    "least_latency",
    "least_request",
    "load",
    "model_key_scan",
    "parse_usage",
    "request_fields",
    "request_head",
    "response_head",
    "sse_scan",
    "usage_cuts",
]

PRIMITIVES: tuple[str, ...] = ("bodyframe", "chunkframe", "hashring", "headscan", "keyscan", "prefixhash", "schedkern", "shmstate", "ssescan", "tokenbucket")
NO_EXTENSIONS: bool = os.environ.get("FLEXINFER_NO_EXTENSIONS", "") not in ("", "0")
IMPLEMENTATIONS: dict[str, str] = {}


def load(name: str, impl: str) -> ModuleType:
    """Import one twin explicitly: ``load("hashring", "c")``; ImportError when not built."""
    if name not in PRIMITIVES or impl not in ("c", "py"):
        raise ValueError(f"unknown speedup {name!r}/{impl!r}")
    return import_module(f"{__name__}.{name}_{impl}")


def _pick(name: str) -> ModuleType:
    if not NO_EXTENSIONS:
        try:
            module = load(name, "c")
        except ImportError:
            pass
        else:
            IMPLEMENTATIONS[name] = "c"
            return module
    IMPLEMENTATIONS[name] = "py"
    return load(name, "py")


if TYPE_CHECKING:
    from .bodyframe_py import BodyFrame as BodyFrame
    from .bodyframe_py import ChunkedBody as ChunkedBody
    from .bodyframe_py import FramingError as FramingError
    from .bodyframe_py import LengthBody as LengthBody
    from .bodyframe_py import head_end as head_end
    from .chunkframe_py import frame_chunk as frame_chunk
    from .hashring_py import HashRing as HashRing
    from .headscan_py import head_block as head_block
    from .headscan_py import head_lines_ok as head_lines_ok
    from .headscan_py import request_fields as request_fields
    from .headscan_py import request_head as request_head
    from .headscan_py import response_head as response_head
    from .keyscan_py import model_key_scan as model_key_scan
    from .prefixhash_py import chained_block_hashes as chained_block_hashes
    from .schedkern_py import best_of as best_of
    from .schedkern_py import keep_below as keep_below
    from .schedkern_py import kv_free as kv_free
    from .schedkern_py import least_latency as least_latency
    from .schedkern_py import least_request as least_request
    from .shmstate_py import SharedBuckets as SharedBuckets
    from .shmstate_py import SharedCounts as SharedCounts
    from .shmstate_py import SharedPrefixes as SharedPrefixes
    from .shmstate_py import TableFull as TableFull
    from .shmstate_py import key_hash as key_hash
    from .ssescan_py import SseClock as SseClock
    from .ssescan_py import event_end as event_end
    from .ssescan_py import parse_usage as parse_usage
    from .ssescan_py import sse_scan as sse_scan
    from .ssescan_py import usage_cuts as usage_cuts
    from .tokenbucket_py import BucketRegistry as BucketRegistry
    from .tokenbucket_py import TokenBucket as TokenBucket
else:
    _bodyframe = _pick("bodyframe")
    BodyFrame = _bodyframe.BodyFrame
    ChunkedBody = _bodyframe.ChunkedBody
    FramingError = _bodyframe.FramingError
    LengthBody = _bodyframe.LengthBody
    head_end = _bodyframe.head_end
    del _bodyframe
    frame_chunk = _pick("chunkframe").frame_chunk
    HashRing = _pick("hashring").HashRing
    _headscan = _pick("headscan")
    head_block = _headscan.head_block
    head_lines_ok = _headscan.head_lines_ok
    request_fields = _headscan.request_fields
    request_head = _headscan.request_head
    response_head = _headscan.response_head
    del _headscan
    model_key_scan = _pick("keyscan").model_key_scan
    chained_block_hashes = _pick("prefixhash").chained_block_hashes
    _schedkern = _pick("schedkern")
    best_of = _schedkern.best_of
    keep_below = _schedkern.keep_below
    kv_free = _schedkern.kv_free
    least_latency = _schedkern.least_latency
    least_request = _schedkern.least_request
    del _schedkern
    _shmstate = _pick("shmstate")
    SharedBuckets = _shmstate.SharedBuckets
    SharedCounts = _shmstate.SharedCounts
    SharedPrefixes = _shmstate.SharedPrefixes
    TableFull = _shmstate.TableFull
    key_hash = _shmstate.key_hash
    del _shmstate
    _ssescan = _pick("ssescan")
    sse_scan = _ssescan.sse_scan
    usage_cuts = _ssescan.usage_cuts
    SseClock = _ssescan.SseClock
    event_end = _ssescan.event_end
    parse_usage = _ssescan.parse_usage
    del _ssescan
    _tokenbucket = _pick("tokenbucket")
    TokenBucket = _tokenbucket.TokenBucket
    BucketRegistry = _tokenbucket.BucketRegistry
    del _tokenbucket

_kinds = set(IMPLEMENTATIONS.values())
IMPLEMENTATION: str = _kinds.pop() if len(_kinds) == 1 else ("mixed" if _kinds else "py")
del _kinds
