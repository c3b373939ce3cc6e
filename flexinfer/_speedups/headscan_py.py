"""The framing check of an HTTP head we write, and the builder of its header lines: the reference
twin of headscan_c.

Owns: :func:`head_lines_ok`, which says whether a head built from ``lines`` lines holds exactly
``lines`` CR bytes, exactly ``lines`` LF bytes and no NUL. The HTTP core builds every head it sends
(a response to a client, a request to a backend) from lines that each end in one CRLF of its own,
so any other count means a name or value carried a CR, LF or NUL that could split the message.
:func:`head_block` builds such a head (lines given by the caller around a list of headers) in one
pass, for the common case only: it answers None wherever the caller's own builder must decide.
Must not: import anything of ours.
"""

from __future__ import annotations

import re


def head_lines_ok(head: bytes, lines: int) -> bool:
    """Whether ``head`` holds exactly ``lines`` CR and ``lines`` LF bytes and no NUL."""
    return head.count(b"\n") == lines and head.count(b"\r") == lines and b"\x00" not in head


#: the bytes a lower-case header name may hold: RFC 9110's tchar less A-Z
_LOWER_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9a-z]+")
#: more headers than this go to the caller's own builder (head_block's keep marks are 64 wide in C)
MAX_BLOCK_HEADERS = 64


def head_block(lead: tuple[bytes, ...], headers: list[tuple[bytes, bytes]] | tuple[tuple[bytes, bytes], ...],
               rules: dict[bytes, bool], tail: tuple[bytes, ...], lines: int) -> bytes | None:
    """The head ``lead`` + one ``name: value`` CRLF line per header, in order + ``tail``, or None
    where the caller's own (slower, fuller) builder must decide.

    ``lead`` and ``tail`` are the caller's lines (a status or request line, a Host or framing line,
    the empty line): together they must hold exactly ``lines`` CR, ``lines`` LF and no NUL. A header
    whose name ``rules`` maps to True is left out; its value is not looked at.
    None, and nothing is built, when: ``headers`` is not a list or tuple of (bytes, bytes) tuples or
    holds more than :data:`MAX_BLOCK_HEADERS`; a name is empty or not a lower-case token; ``rules``
    maps a name to anything but True (a header the caller handles itself, such as Connection); a
    kept value holds CR, LF or NUL; ``lead`` + ``tail`` do not hold their ``lines``. So a CR, LF or
    NUL can never reach the head through this function: the caller's builder rejects it there."""
    if type(headers) is not list and type(headers) is not tuple:
        return None
    if len(headers) > MAX_BLOCK_HEADERS:
        return None
    parts: list[bytes] = list(lead)
    for item in headers:
        if type(item) is not tuple or len(item) != 2:
            return None
        name, value = item
        if type(name) is not bytes or type(value) is not bytes or _LOWER_TOKEN.fullmatch(name) is None:
            return None
        rule = rules.get(name)
        if rule is not None:
            if rule is True:
                continue
            return None
        if b"\r" in value or b"\n" in value or b"\x00" in value:
            return None
        parts += (name, b": ", value, b"\r\n")
    for piece in (*lead, *tail):
        if type(piece) is not bytes:
            return None
    edges = b"".join(lead) + b"".join(tail)
    if not head_lines_ok(edges, lines):
        return None
    parts += tail
    return b"".join(parts)
