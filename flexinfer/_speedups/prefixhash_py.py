"""Chained block hashes of a prompt prefix: the reference twin (the executable spec).

Owns: turning the first bytes of a prompt into a list of block hashes for prefix-affinity
routing. Must not: import anything from flexinfer, know about chat messages or JSON (the
router builds the text), or hash more than ``max_blocks * block_size`` bytes.
``prefixhash_c.pyx`` gives bit-identical results with its own XXH3-64 in C.

Spec
----
* ``data`` is a ``str`` (encoded as UTF-8 with ``surrogatepass``, so it never raises) or
  a bytes-like object (read as unsigned bytes; must be C-contiguous).
* Only the first ``limit = block_size * max_blocks`` bytes count. For ``str`` only the
  first ``limit`` characters are encoded: each character is at least one byte, so that
  is always enough, and a 220 KB prompt costs no more than an 8 KiB one.
* The bytes are cut into ``block_size`` blocks; the trailing partial block is included
  too (so short identical prompts still match), giving ``ceil(min(len, limit) / block_size)``
  hashes; empty input gives ``[]``.
* ``h[0] = xxh3_64(block[0], seed=seed)`` (``seed`` 0 unless given) and ``h[i] = xxh3_64(block[i], seed=h[i-1])``, as
  ``xxhash.xxh3_64_intdigest`` computes them: equal ``h[i]`` implies (up to 64-bit
  collisions) equal blocks ``0..i``, so the longest common prefix of two prompts is the
  length of the common prefix of their hash lists. A trailing partial block only matches
  a block that ends at the same byte.
"""

from __future__ import annotations

from array import array
from operator import index
from typing import Literal, overload

from xxhash import xxh3_64_intdigest

__all__ = ["DEFAULT_BLOCK_SIZE", "DEFAULT_MAX_BLOCKS", "chained_block_hashes"]

DEFAULT_BLOCK_SIZE = 64
DEFAULT_MAX_BLOCKS = 128


@overload
def chained_block_hashes(data: str | bytes, block_size: int = ..., max_blocks: int = ...,
                         packed: Literal[False] = ..., seed: int = ...) -> list[int]: ...
@overload
def chained_block_hashes(data: str | bytes, block_size: int, max_blocks: int,
                         packed: Literal[True], seed: int = ...) -> array[int]: ...
def chained_block_hashes(
    data: str | bytes,
    block_size: int = DEFAULT_BLOCK_SIZE,
    max_blocks: int = DEFAULT_MAX_BLOCKS,
    packed: bool = False,
    seed: int = 0,
) -> list[int] | array[int]:
    """Chained XXH3-64 hashes of ``data``'s first ``max_blocks`` blocks (see module doc);
    ``packed``: as an ``array('Q')`` (machine words, no Python int per block) instead of a list;
    ``seed``: the chain's start (block 0's XXH3 seed; 0 by default)."""
    seed = index(seed)
    if not 0 <= seed < 1 << 64:
        raise OverflowError("seed must be in [0, 2**64)")
    block_size = index(block_size)
    max_blocks = index(max_blocks)
    if block_size < 1:
        raise ValueError("block_size must be >= 1")
    if max_blocks < 0:
        raise ValueError("max_blocks must be >= 0")
    limit = block_size * max_blocks
    if isinstance(data, str):
        view = memoryview(data[:limit].encode("utf-8", "surrogatepass"))
    else:
        view = memoryview(data).cast("B")
    end = min(len(view), limit)
    out: list[int] = []
    for start in range(0, end, block_size):
        seed = xxh3_64_intdigest(view[start : min(start + block_size, end)], seed)
        out.append(seed)
    return array("Q", out) if packed else out
