"""The framing check of an HTTP head we wrote: the reference twin of headscan_c.

Owns: :func:`head_lines_ok`, which says whether a head built from ``lines`` lines holds exactly
``lines`` CR bytes, exactly ``lines`` LF bytes and no NUL. The HTTP core builds every head it sends
(a response to a client, a request to a backend) from lines that each end in one CRLF of its own,
so any other count means a name or value carried a CR, LF or NUL that could split the message.
Must not: import anything of ours.
"""

from __future__ import annotations


def head_lines_ok(head: bytes, lines: int) -> bool:
    """Whether ``head`` holds exactly ``lines`` CR and ``lines`` LF bytes and no NUL."""
    return head.count(b"\n") == lines and head.count(b"\r") == lines and b"\x00" not in head
