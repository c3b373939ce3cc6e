"""The framing check of an HTTP head we write, and the builder of its header lines: the reference
twin of headscan_c.

Owns: :func:`head_lines_ok`, which says whether a head built from ``lines`` lines holds exactly
``lines`` CR bytes, exactly ``lines`` LF bytes and no NUL. The HTTP core builds every head it sends
(a response to a client, a request to a backend) from lines that each end in one CRLF of its own,
so any other count means a name or value carried a CR, LF or NUL that could split the message.
:func:`head_block` builds such a head (lines given by the caller around a list of headers) in one
pass, for the common case only: it answers None wherever the caller's own builder must decide.
:func:`request_head` finds where a request head that arrived in one read ends, and the version
its request line plainly names, so the server need not ask its parser for the version (httptools
formats it as a new string per call). :func:`request_fields` reads the method, target and fields
of a plainly written request head (a strict subset of what llhttp accepts), so that the server
can take such a request without its parser.
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


def request_head(data: bytes, pos: int) -> tuple[int, str | None]:
    """Where the request head that starts at ``data[pos]`` ends (the offset just after its first
    CRLF CRLF; -1 when that has not arrived), and the version its request line names when the
    line plainly is ``METHOD SP target SP HTTP/1.x CR LF``: up to its first LF it holds a space
    before the one ahead of ``HTTP/1.``, and a CR before the LF; ``"1.1"`` or ``"1.0"``. None
    otherwise (an incomplete head, leading empty lines, another version or form): the caller asks
    its HTTP parser, which also decides whether the line is valid at all."""
    if not isinstance(data, bytes):
        raise TypeError(f"request_head() takes bytes, not {type(data).__name__}")
    pos = max(pos, 0)
    i = data.find(b"\r\n\r\n", pos)
    if i == -1:
        return -1, None
    end = i + 4
    k = data.find(b"\n", pos, end)  # found: the blank line's at the latest
    if (k - 10 >= pos and data[k - 1] == 13 and data[k - 10] == 32 and data[k - 9:k - 2] == b"HTTP/1."
            and data.find(b" ", pos, k - 10) != -1):
        minor = data[k - 2]
        return end, "1.1" if minor == 49 else "1.0" if minor == 48 else None
    return end, None


#: the methods :func:`request_fields` reads (llhttp knows them all; CONNECT and TRACE are left to
#: the caller's parser), each mapped to itself so that the caller gets the same object every time
PLAIN_METHODS: dict[bytes, bytes] = {m: m for m in (b"GET", b"POST", b"PUT", b"DELETE", b"HEAD", b"OPTIONS", b"PATCH")}
#: ``METHOD SP origin-form SP HTTP/1.1 CRLF``: the target's bytes are RFC 3986's path and query
#: characters (unreserved, sub-delims, ``: @ / ? %``), no fragment
_PLAIN_LINE = re.compile(rb"([A-Z]+) (/[A-Za-z0-9\-._~!$&'()*+,;=:@/?%]*) HTTP/1\.1\r\n")
#: ``name ":" OWS value CRLF``: the name letters, digits and ``-``; the value visible ASCII, SP and
#: HTAB (no obs-text, no obs-fold); the value without its leading whitespace, its trailing kept
_PLAIN_FIELD = re.compile(rb"([A-Za-z0-9\-]+):[ \t]*([\x20-\x7e\t]*)\r\n")


def request_fields(data: bytes, pos: int, end: int) -> tuple[bytes, bytes, list[tuple[bytes, bytes]]] | None:
    """The method, target and header fields of the request head ``data[pos:end]`` (``end`` just
    after its blank line, as :func:`request_head` says) when the head is plainly written, else None.

    Plainly written: the request line is ``METHOD SP target SP HTTP/1.1 CRLF`` with a method of
    :data:`PLAIN_METHODS` and an origin-form target of path and query characters only; every field
    line is ``name ":" OWS value CRLF`` with a name of letters, digits and ``-`` (not
    ``Proxy-Connection``, which llhttp reads as a Connection header) and a value of visible ASCII,
    SP and HTAB; the blank line ends it. The fields come as ``(name, value)`` as received, the value
    without its leading whitespace, its trailing kept: what llhttp hands its callbacks for the same
    bytes. A strict subset of what llhttp accepts: whatever is not plain (another version or
    method, a fold, a lone CR or LF, obs-text, a byte outside these sets) is None, and the caller's
    parser reads (or refuses) it. Nothing is checked against limits or header rules here."""
    if not isinstance(data, bytes):
        raise TypeError(f"request_fields() takes bytes, not {type(data).__name__}")
    if pos < 0 or end > len(data) or end - pos < 18 or data[end - 2:end] != b"\r\n":
        return None
    stop = end - 2
    m = _PLAIN_LINE.match(data, pos, stop)
    if m is None:
        return None
    method = PLAIN_METHODS.get(m.group(1))
    if method is None:
        return None
    fields = _plain_fields(data, m.end(), stop, False)
    return None if fields is None else (method, m.group(2), fields)


def _plain_fields(data: bytes, p: int, stop: int, lower: bool) -> list[tuple[bytes, bytes]] | None:
    """The plain field lines of ``data[p:stop]`` (``stop`` where the blank line begins) as
    ``(name, value)``, names lower-cased when ``lower``; None at the first one that is not plain."""
    fields: list[tuple[bytes, bytes]] = []
    while p < stop:
        f = _PLAIN_FIELD.match(data, p, stop)
        if f is None:
            return None
        name = f.group(1)
        if len(name) == 16 and name.lower() == b"proxy-connection":
            return None
        fields.append((name.lower() if lower else name, f.group(2)))
        p = f.end()
    return fields if p == stop else None


#: ``HTTP/1.1 SP status SP reason CRLF``: a final status 200-599, a reason of visible ASCII, SP, HTAB
_PLAIN_STATUS = re.compile(rb"HTTP/1\.1 ([2-5][0-9][0-9]) [\x20-\x7e\t]*\r\n")


def response_head(data: bytes) -> tuple[int, int, list[tuple[bytes, bytes]]] | None:
    """Where the plainly written response head at the start of ``data`` ends (just after its blank
    line), its status, and its fields as ``(lower-cased name, value)``; None when no blank line has
    arrived or the head is not plainly written.

    Plainly written: the status line is ``HTTP/1.1 SP status SP reason CRLF`` with a status of
    200-599 and a reason of visible ASCII, SP and HTAB (possibly empty); the field lines are those
    of :func:`request_fields` (no ``Proxy-Connection``), each value without its leading whitespace,
    its trailing kept: what llhttp hands its callbacks. A strict subset of what llhttp accepts;
    the caller's parser reads (or refuses) anything else. Nothing is checked against limits or
    header rules here."""
    if not isinstance(data, bytes):
        raise TypeError(f"response_head() takes bytes, not {type(data).__name__}")
    i = data.find(b"\r\n\r\n")
    if i == -1:
        return None
    stop = i + 2
    m = _PLAIN_STATUS.match(data, 0, stop)
    if m is None:
        return None
    fields = _plain_fields(data, m.end(), stop, True)
    return None if fields is None else (i + 4, int(m.group(1)), fields)
