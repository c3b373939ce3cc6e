"""Request-head rules of the server side, as pure functions over what the parser recorded.

Owns: the request-line checks (version, method, request-target), the ONE loop over the header
fields (names lower-cased through a bounded cache, ``_`` in a name, non-ASCII values, trailing
whitespace, the byte limit of the block) with the rules on the headers the core interprets (one
Host for 1.1 and never two, Content-Length and Transfer-Encoding framing, Upgrade refused,
``Expect: 100-continue``, the media type of Content-Type, the 1.0 ``Connection`` keep-alive
option), :func:`plain_connection` (the one reading of a Connection value that the parser-free
paths of both sides, protocol.py's requests and client.py's responses, accept without llhttp), and
:class:`Rejected`, the exception that carries a core rejection reason.

The header loop is one local loop: per header, one dict lookup in the name cache, one ASCII check
and the compares of the kinds the core interprets; nothing is allocated but the ``(name, value)``
pair. The result is a plain tuple (:data:`Head`): the per-request cost is one call and one tuple
(and one more call for a request with framing headers).

Must not: touch a connection, a transport or the settings object, keep per-request state, or
decide what a rejection looks like on the wire (protocol.py answers it).
"""

from __future__ import annotations

try:
    import cython
except ImportError:  # no Cython here: its decorators do nothing in pure Python
    from flexinfer import _nocython as cython  # type: ignore[no-redef]

from flexinfer.errors import FlexInferError

__all__ = ["Head", "Rejected", "body_length", "keeps_alive_10", "plain_connection", "read_headers",
           "request_line"]


class Rejected(Exception):
    """A broken rule: answer with the core rejection ``reason`` (or with ``err`` when the handler's
    on_headers refused the request). Raised inside a parser callback, it stops the parser at once."""

    def __init__(self, reason: str | None, err: FlexInferError | None = None) -> None:
        self.reason = reason
        self.err = err


# headers the core interprets
_H_HOST, _H_CL, _H_TE, _H_UPGRADE, _H_EXPECT, _H_CT, _H_CONN = 1, 2, 3, 4, 5, 6, 7
_SPECIAL = {
    b"connection": _H_CONN,
    b"host": _H_HOST,
    b"content-length": _H_CL,
    b"transfer-encoding": _H_TE,
    b"upgrade": _H_UPGRADE,
    b"expect": _H_EXPECT,
    b"content-type": _H_CT,
}
#: raw header name as received -> (lower-cased name, _SPECIAL kind or 0); bounded so that random
#: names cannot grow it. Saves a lower(), a '_' scan and a lookup per header per request.
_NAMES: dict[bytes, tuple[bytes, int]] = {}
_NAMES_MAX = 2048
_METHODS = {m.encode(): m for m in (
    "GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH", "CONNECT", "TRACE")}

#: What :func:`read_headers` found: ``(headers, content_type, length, expect_continue, connection)``:
#: the validated fields (names lower-cased, trailing whitespace stripped), the lower-cased media
#: type without parameters (b"" if absent), the body framing (a Content-Length, 0 if none, -1 for
#: chunked), whether ``Expect: 100-continue`` was sent, and the Connection values joined with ","
#: (None if absent).
Head = tuple[list[tuple[bytes, bytes]], bytes, int, bool, "bytes | None"]


def request_line(version: str, method: bytes, target: bytes) -> str:
    """The method as a str once the request line passes: HTTP/1.1 or 1.0, no CONNECT, an
    origin-form target (or ``*`` for OPTIONS) with no fragment and ASCII only."""
    if version != "1.1" and version != "1.0":
        raise Rejected("version_not_supported")
    methods: dict[bytes, str] = _METHODS  # typed: the build's get is a C dict lookup, not a method call
    m = methods.get(method) or method.decode("ascii", "replace")
    if m == "CONNECT":
        raise Rejected("method_not_allowed")
    # (an Upgrade header is refused by read_headers, CONNECT here: llhttp's upgrade flag needs one)
    if target[:1] != b"/" and not (target == b"*" and m == "OPTIONS"):
        raise Rejected("bad_target")
    if b"#" in target or not target.isascii():
        raise Rejected("bad_target")
    return m


@cython.annotation_typing(False)  # the cpdef of head.pxd
def read_headers(raw: list[tuple[bytes, bytes]], version: str, max_bytes: int) -> Head:
    """Check the header fields as received (names raw, in order) and decide the body framing;
    :class:`Rejected` on the first broken rule."""
    headers: list[tuple[bytes, bytes]] = []
    append = headers.append
    special = _SPECIAL  # (head.pxd types the dict locals: their get is a C dict lookup)
    total = 4 * len(raw)
    hosts = 0
    cl: bytes | None = None
    te: bytes | None = None
    expect = False
    ctype = b""
    conn: bytes | None = None
    names = _NAMES
    for name, value in raw:
        total += len(name) + len(value)
        known = names.get(name)
        if known is None:
            lname = name.lower()
            if b"_" in lname:
                raise Rejected("bad_header_name")
            known = (lname, special.get(lname, 0))
            if len(names) < _NAMES_MAX:
                names[name] = known
        name, kind = known
        if not value.isascii():
            raise Rejected("bad_header_value")
        if value and (value[-1] == 32 or value[-1] == 9):
            value = value.rstrip(b" \t")
        if kind:
            if kind == _H_HOST:
                hosts += 1
            elif kind == _H_CL:
                if cl is not None:
                    raise Rejected("bad_framing")
                cl = value
            elif kind == _H_TE:
                if te is not None:
                    raise Rejected("bad_framing")
                te = value
            elif kind == _H_UPGRADE:
                raise Rejected("upgrade_rejected")
            elif kind == _H_EXPECT:
                expect = value.lower() == b"100-continue"
            elif kind == _H_CONN:
                conn = value if conn is None else conn + b"," + value
            else:
                ctype = value
        append((name, value))
    if total > max_bytes:
        raise Rejected("header_too_large")
    if hosts != 1 and (hosts > 1 or version == "1.1"):
        raise Rejected("bad_host")
    length = 0 if cl is None and te is None else body_length(version, cl, te)
    if ctype:
        ctype = ctype.split(b";", 1)[0].strip().lower()
    return headers, ctype, length, expect, conn


def body_length(version: str, cl: bytes | None, te: bytes | None) -> int:
    """The framing decision (RFC 9112 §6): -1 for ``Transfer-Encoding: chunked`` (1.1 only, never
    with Content-Length, no other coding), else the Content-Length (digits only, at most 18)."""
    if te is not None:
        if cl is not None or version == "1.0" or te.lower() != b"chunked":
            raise Rejected("bad_framing")
        return -1
    if cl is None or not cl.isdigit() or len(cl) > 18:
        raise Rejected("bad_framing")
    return int(cl)


@cython.annotation_typing(False)  # the cpdef of head.pxd
def plain_connection(value: bytes | None) -> int:
    """Whether a head read without the parser keeps its connection, from its Connection value
    (None: no such header): 1 for none or ``keep-alive``, 0 for ``close``, -1 for anything else
    (several tokens or headers, another option), which the caller leaves to the parser: llhttp's
    own reading of the Connection tokens decides there (see :func:`keeps_alive_10`)."""
    if value is None:
        return 1
    token = value.strip(b" \t").lower()
    if token == b"keep-alive":
        return 1
    if token == b"close":
        return 0
    return -1


def keeps_alive_10(conn: bytes | None) -> bool:
    """Whether an HTTP/1.0 request's Connection header asks to persist (RFC 9112 §9.3): the
    ``keep-alive`` option and no ``close``. llhttp's should_keep_alive() also honours the
    non-standard ``Proxy-Connection: keep-alive`` and lets ``keep-alive`` win over ``close``, so a
    strict parser (h11) would end the connection where we read on."""
    if conn is None:
        return False
    tokens = {t.strip().lower() for t in conn.split(b",")}
    return b"keep-alive" in tokens and b"close" not in tokens
