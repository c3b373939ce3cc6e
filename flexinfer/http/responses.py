"""Bytes made ahead for responses: status lines, header pieces, the cached Date header, OpenAI error
responses and SSE framing.

Owns: every constant byte string the server side writes, the Date cache (refreshed by the server's
tick, never per request), the table of the core's own rejections (reason -> prebuilt response) and
the rendering of a :class:`~flexinfer.errors.FlexInferError` into a complete HTTP response.
Must not: touch sockets, know about connections or requests, or log.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from http import HTTPStatus

try:
    import cython
except ImportError:  # no Cython here: its decorators do nothing in pure Python
    from flexinfer import _nocython as cython  # type: ignore[no-redef]

from flexinfer.errors import (
    BadRequest,
    FlexInferError,
    HeadersTooLarge,
    InternalError,
    MethodNotAllowed,
    PayloadTooLarge,
    RequestTimeout,
    ServiceUnavailable,
    ShuttingDown,
    URITooLong,
    VersionNotSupported,
)

__all__ = [
    "CHUNKED",
    "CONNECTION_CLOSE",
    "CONNECTION_KEEP_ALIVE",
    "CONTINUE_100",
    "CORE_ERRORS",
    "DATE",
    "JSON_CONTENT_TYPE",
    "LAST_CHUNK",
    "date_header",
    "error_response",
    "error_response_parts",
    "http_date",
    "refresh_date",
    "rejection_parts",
    "sse_comment",
    "sse_event",
    "status_line",
]

# ---- status lines ----------------------------------------------------------------------------

_STATUS_LINES: dict[int, bytes] = {
    int(s): b"HTTP/1.1 %d %s\r\n" % (int(s), s.phrase.encode("ascii")) for s in HTTPStatus
}


@cython.annotation_typing(False)  # the cpdef of responses.pxd
def status_line(status: int) -> bytes:
    """``HTTP/1.1 <code> <phrase>\\r\\n``; prebuilt for every known code, built and cached otherwise."""
    lines = _STATUS_LINES  # (a dict local in the build: its get is a C dict lookup)
    line = lines.get(status)
    if line is None:
        if not 100 <= status <= 999:
            raise ValueError(f"invalid HTTP status {status!r}")
        line = lines[status] = b"HTTP/1.1 %d \r\n" % status
    return line


# ---- header pieces ---------------------------------------------------------------------------

CONNECTION_CLOSE = b"connection: close\r\n"
CONNECTION_KEEP_ALIVE = b"connection: keep-alive\r\n"
CHUNKED = b"transfer-encoding: chunked\r\n"
JSON_CONTENT_TYPE = b"content-type: application/json\r\n"
CONTINUE_100 = b"HTTP/1.1 100 Continue\r\n\r\n"
LAST_CHUNK = b"0\r\n\r\n"

# ---- Date: one cached header line, refreshed by the server tick -----------------------------

#: ``DATE[0]`` is the current ``date: ...\r\n`` line. A one-element list so that hot code can index
#: it without a function call while the tick swaps the value.
DATE: list[bytes] = [b""]
_date_second = [-1]
_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def http_date(sec: int) -> str:
    """``sec`` as an IMF-fixdate (RFC 9110 5.6.7: ``Sun, 06 Nov 1994 08:49:37 GMT``), in English
    whatever the locale (``email.utils.formatdate`` writes the same; its package costs the proxy
    0.4 MB of memory for this one line)."""
    t = time.gmtime(sec)
    return (f"{_DAYS[t.tm_wday]}, {t.tm_mday:02d} {_MONTHS[t.tm_mon - 1]} {t.tm_year:04d} "
            f"{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d} GMT")


def refresh_date(now: float | None = None) -> bool:
    """Rebuild the Date line if the wall-clock second changed. Returns True when it changed."""
    sec = int(time.time() if now is None else now)
    if sec == _date_second[0]:
        return False
    _date_second[0] = sec
    DATE[0] = b"date: " + http_date(sec).encode("ascii") + b"\r\n"
    return True


def date_header() -> bytes:
    """The cached ``date: ...\\r\\n`` line (refreshed once a second by the server's tick)."""
    return DATE[0]


refresh_date()

# ---- SSE -------------------------------------------------------------------------------------


def sse_event(data: bytes) -> bytes:
    """One SSE event: ``data: <line>\\n`` per line of ``data``, then a blank line."""
    if b"\n" not in data and b"\r" not in data:
        return b"data: " + data + b"\n\n"
    lines = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
    return b"".join(b"data: " + line + b"\n" for line in lines) + b"\n"


def sse_comment(text: str) -> bytes:
    """An SSE comment (ignored by clients; used as a keep-alive ping): ``: <text>\\n\\n``."""
    raw = text.encode("utf-8")
    if b"\n" not in raw and b"\r" not in raw:
        return b": " + raw + b"\n\n"
    lines = raw.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
    return b"".join(b": " + line + b"\n" for line in lines) + b"\n"


# ---- errors ----------------------------------------------------------------------------------


def _retry_after(seconds: float) -> bytes:
    return b"%d" % max(1, math.ceil(seconds))


def error_response_parts(err: FlexInferError, headers: Iterable[tuple[bytes, bytes]] = (), *,
                         close: bool, keep_alive_10: bool = False) -> tuple[bytes, bytes]:
    """(status line, rest) of a complete OpenAI-shaped error response; the Date line goes between.

    Adds ``x-should-retry`` when ``err.should_retry`` is not None and ``retry-after`` (integer
    seconds, rounded up, at least 1) when ``err.retry_after`` is set, then ``err.headers`` and
    ``headers``. Header values must not contain CR, LF or NUL (ValueError).
    """
    body = err.body()
    parts = [JSON_CONTENT_TYPE]
    if err.should_retry is not None:
        parts.append(b"x-should-retry: true\r\n" if err.should_retry else b"x-should-retry: false\r\n")
    if err.retry_after is not None:
        parts.append(b"retry-after: " + _retry_after(err.retry_after) + b"\r\n")
    for name, value in (*err.headers, *headers):
        lname = name.lower()
        if lname in _FRAMING or lname in (b"content-type", b"retry-after", b"x-should-retry"):
            continue
        parts.append(name + b": " + value + b"\r\n")
    parts.append(b"content-length: %d\r\n" % len(body))
    if close:
        parts.append(CONNECTION_CLOSE)
    elif keep_alive_10:
        parts.append(CONNECTION_KEEP_ALIVE)
    head = b"".join(parts)
    check_header_block(head, len(parts))
    return status_line(err.status), head + b"\r\n" + body


def error_response(err: FlexInferError, headers: Iterable[tuple[bytes, bytes]] = (), *,
                   close: bool = True) -> bytes:
    """A complete error response (with the current Date)."""
    line, rest = error_response_parts(err, headers, close=close)
    return line + DATE[0] + rest


_FRAMING = frozenset({b"content-length", b"transfer-encoding", b"connection", b"keep-alive", b"date"})


def check_header_block(block: bytes, lines: int) -> None:
    """Raise ValueError unless ``block`` (``lines`` header lines) has exactly one CRLF per line and no
    NUL: catches CR, LF or NUL smuggled into a name or value with three C-speed scans."""
    if block.count(b"\n") != lines or block.count(b"\r") != lines or b"\x00" in block:
        raise ValueError("header name or value contains CR, LF or NUL")


#: The core's own rejections: stats reason -> the error it answers with. Every one closes the
#: connection. Messages are fixed (they never echo client bytes).
CORE_ERRORS: dict[str, FlexInferError] = {
    "bad_request": BadRequest("Malformed HTTP request."),
    "bad_host": BadRequest("The request must carry exactly one Host header."),
    "bad_framing": BadRequest("Invalid message framing: conflicting or unsupported "
                              "Content-Length / Transfer-Encoding."),
    "bad_header_name": BadRequest("Header names must be tokens without '_'."),
    "bad_header_value": BadRequest("A header value contains invalid characters."),
    "bad_target": BadRequest("The request target must be an absolute path (origin form)."),
    "upgrade_rejected": BadRequest("Protocol upgrades are not supported."),
    "chunk_extension_too_large": BadRequest("Chunk extension too large."),
    "method_not_allowed": MethodNotAllowed("CONNECT is not supported."),
    "uri_too_long": URITooLong("Request target too long."),
    "header_too_large": HeadersTooLarge("Request header block too large."),
    "too_many_headers": HeadersTooLarge("Too many request headers."),
    "body_too_large": PayloadTooLarge("Request body too large."),
    "header_timeout": RequestTimeout("Request headers not received in time."),
    "body_timeout": RequestTimeout("Request body not received in time."),
    "version_not_supported": VersionNotSupported("Only HTTP/1.0 and HTTP/1.1 are supported."),
    "shutting_down": ShuttingDown("The server is shutting down."),
    "too_many_connections": ServiceUnavailable("Too many connections."),
    "internal_error": InternalError("Internal server error."),
}

_PREBUILT: dict[str, tuple[bytes, bytes]] = {
    reason: error_response_parts(err, close=True) for reason, err in CORE_ERRORS.items()
}


def rejection_parts(reason: str) -> tuple[bytes, bytes]:
    """Prebuilt (status line, rest) of the core rejection ``reason`` (Date goes between)."""
    return _PREBUILT[reason]
