"""One piece of a chunked body, framed: the reference twin of chunkframe_c.

Owns: :func:`frame_chunk`, the bytes the HTTP core writes for one body piece of a chunked response
(the size in hex, CRLF, the piece, CRLF), behind an optional prefix (a response's head, which the
first piece carries in the same write). The relay writes one per upstream read of every stream, so
on a stream that arrives event by event it runs once per event.
Must not: import anything of ours.
"""

from __future__ import annotations


def frame_chunk(prefix: bytes, data: bytes) -> bytes:
    """``prefix`` + the chunk that carries ``data`` (``data`` not empty: an empty chunk ends a body)."""
    return b"%b%x\r\n%b\r\n" % (prefix, len(data), data)
