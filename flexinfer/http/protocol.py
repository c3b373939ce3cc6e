"""One HTTP/1.1 connection: httptools callbacks, limits, deadlines, keep-alive, pipelining.

Owns: :class:`HttpProtocol` (one per connection), the :class:`Handler` interface and THE place where
a parse failure or a broken rule becomes a response (:meth:`HttpProtocol._parse_failed` maps, and
:meth:`HttpProtocol._reject` answers: once, OpenAI JSON, ``Connection: close``, one counter, and
the handler is never called). :class:`Request` and :class:`ResponseWriter` live in request.py and
are re-exported here, as the contract names them.

How it works: parser callbacks only record (and raise ``_Reject`` to stop the parser at once when a
rule is broken). Limits are checked as bytes arrive: URL bytes in ``on_url``, the header count in
``on_header``, and the raw bytes fed while the header block is still open, so a 1 MiB header value
is refused after about one read; names and values are checked in one local loop at headers-complete.
Bytes are fed in slices cut where a head or a Content-Length body ends, so each slice belongs to one
message: inside a chunked body, the raw bytes minus the data and the chunks' own framing are the
chunk extensions and trailer fields, bounded per request (``max_chunk_extension``) after every slice
and before the request is handed on. While a request is handled, further bytes
are kept raw (reading pauses past 64 KiB) and parsed only once its response is finished, so
responses leave in order and on_headers runs in order; when the client stops reading its
responses, nothing more is answered or read until it does. Deadlines are plain floats checked by
the server's tick (no timer per request).

Must not: know models, forward anything, log on the hot path, or let a traceback reach a client.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import TYPE_CHECKING, Protocol, cast

import httptools

from flexinfer.errors import (
    FlexInferError,
    InternalError,
)
from flexinfer.http.flow import ClientGone, FlowControl
from flexinfer.http.request import Request, ResponseWriter
from flexinfer.http.responses import (
    CONTINUE_100,
    DATE,
    error_response_parts,
    rejection_parts,
)

if TYPE_CHECKING:
    from flexinfer.http.server import HTTPServer

__all__ = ["ClientGone", "Handler", "HttpProtocol", "Request", "ResponseWriter"]

log = logging.getLogger("flexinfer.http")

KiB = 1024

#: Raw pipelined bytes kept while a request is handled; over this, reading pauses.
PENDING_HIGH = 64 * KiB
#: Complete requests parsed ahead (same read as an earlier one) before the connection is closed.
PIPELINE_MAX = 64
#: After a rejection: how long and how much we keep reading (and dropping) so that the kernel does
#: not answer the client's unread bytes with a RST that would destroy our response in flight.
LINGER_SECONDS = 2.0
LINGER_BYTES = 1024 * KiB
#: Bytes around a chunk extension (size digits, ';', CRLFs) and around the header block (method,
#: version, CRLFs) tolerated on top of the configured limits by the raw-byte checks.
_CHUNK_LINE_SLACK = 64
_HEAD_SLACK = 64
#: Smallest slice a chunked body is fed in (see _feed; at most half the metadata limit): bounds the
#: parser calls per body byte of a request that has spent most of its chunk metadata.
_CHUNK_SLICE_MIN = 1024

# parse phases
_IDLE, _HEAD, _BODY, _CHUNKED = 0, 1, 2, 3
# deadline kinds
_DL_FRESH, _DL_KEEPALIVE, _DL_HEADER, _DL_BODY, _DL_LINGER, _DL_WRITE = 1, 2, 3, 4, 5, 6

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


def _keeps_alive_10(conn: bytes | None) -> bool:
    """Whether an HTTP/1.0 request's Connection header asks to persist (RFC 9112 §9.3): the
    ``keep-alive`` option and no ``close``. llhttp's should_keep_alive() also honours the
    non-standard ``Proxy-Connection: keep-alive`` and lets ``keep-alive`` win over ``close``, so a
    strict parser (h11) would end the connection where we read on."""
    if conn is None:
        return False
    tokens = {t.strip().lower() for t in conn.split(b",")}
    return b"keep-alive" in tokens and b"close" not in tokens


class _Reject(Exception):
    """Raised inside a parser callback: stop parsing and answer with the core rejection ``reason``
    (or with ``err`` when the handler's on_headers refused the request)."""

    def __init__(self, reason: str | None, err: FlexInferError | None = None) -> None:
        self.reason = reason
        self.err = err


class _Stop(Exception):
    """Raised in on_message_complete of a non-keep-alive request: nothing after it is parsed."""


class Handler(Protocol):
    """What a server serves. ``attach(server)``, when defined, is called by HTTPServer.__init__."""

    def on_headers(self, req: Request) -> FlexInferError | None: ...

    async def handle(self, req: Request, resp: ResponseWriter) -> None: ...


class HttpProtocol(asyncio.Protocol):
    """One client connection (see the module docstring)."""

    __slots__ = (
        "_active",
        "_cb_exc",
        "_chunk_mark",
        "_chunk_min",
        "_chunk_slice_min",
        "_closing",
        "_dl_kind",
        "_feed_len",
        "_final",
        "_handler",
        "_head_limit",
        "_headers",
        "_length",
        "_lingered",
        "_loop",
        "_lost",
        "_max_hdr_bytes",
        "_max_headers",
        "_max_url",
        "_parser",
        "_peer",
        "_pending",
        "_phase",
        "_queue",
        "_raw",
        "_rejected",
        "_req",
        "_server",
        "_settings",
        "_stats",
        "_tail",
        "_transport",
        "_url",
        "_url_len",
        "_write_wait",
        "deadline",
        "flow",
    )

    def __init__(self, server: HTTPServer) -> None:
        s = server.settings
        self._server = server
        self._settings = s
        self._handler = server.handler
        self._stats = server.stats
        self._loop = asyncio.get_running_loop()
        self._parser = httptools.HttpRequestParser(self)
        self._max_url = s.max_request_line
        self._max_headers = s.max_headers
        self._max_hdr_bytes = s.max_header_bytes
        self._head_limit = s.max_header_bytes + _HEAD_SLACK
        self._chunk_slice_min = max(1, min(_CHUNK_SLICE_MIN, (s.max_chunk_extension + _CHUNK_LINE_SLACK) // 2))
        self._transport: asyncio.Transport = None  # type: ignore[assignment]
        self.flow: FlowControl = None  # type: ignore[assignment]
        self._peer = ""
        self._phase = _IDLE
        self._raw = 0
        self._feed_len = 0
        self._tail = b""  # the last bytes of a head that continues in the next read
        self._length = 0  # Content-Length of the body being read
        self._chunk_min = 0  # framing bytes of the chunks read so far (size digits, CRLFs)
        self._chunk_mark = 0  # body bytes at the end of the last chunk
        self._req: Request | None = None
        self._active: ResponseWriter | None = None
        self._queue: deque[Request] = deque()
        self._pending: bytearray | None = None
        self._final: tuple[bytes, bytes] | None = None
        self._closing = False
        self._rejected = False
        self._lingered = 0
        self._lost = False
        self._write_wait = False
        self._cb_exc: BaseException | None = None
        self.deadline = 0.0
        self._dl_kind = 0
        self._reset_message()

    def _reset_message(self) -> None:
        self._url = b""
        self._url_len = 0
        self._headers: list[tuple[bytes, bytes]] = []

    # ---- asyncio callbacks ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass
        self.flow = FlowControl(transport, self._settings.write_buffer_high)
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple) and len(peer) >= 2:
            host = str(peer[0])
            self._peer = f"[{host}]:{peer[1]}" if ":" in host else f"{host}:{peer[1]}"
        elif peer:
            self._peer = str(peer)
        self._server._register(self)
        if self._stats.connections_active > self._settings.max_connections:
            self._reject("too_many_connections")
            return
        self.deadline = self._loop.time() + self._settings.header_timeout
        self._dl_kind = _DL_FRESH

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self.deadline = 0.0
        self.flow.connection_lost()
        self._server._unregister(self)
        self._queue.clear()
        self._pending = None
        w = self._active
        if w is not None:
            w._client_lost()

    def eof_received(self) -> bool | None:
        # A half-close counts as going away (nginx: 499). Returning None closes the transport, and
        # connection_lost tells the in-flight handler.
        return None

    def pause_writing(self) -> None:
        self.flow.pause_writing()

    def resume_writing(self) -> None:
        self.flow.resume_writing()
        if self._write_wait:
            self._write_wait = False
            if self._active is None and not self._lost:
                self._next()

    def data_received(self, data: bytes) -> None:
        if self._active is not None or self._write_wait:
            if self._closing:
                return  # nothing after this connection's last request is ever handled
            pending = self._pending
            if pending is None:
                pending = self._pending = bytearray(data)
            else:
                pending += data
            if len(pending) > PENDING_HIGH:
                self.flow.pause_reading()
            return
        if self._closing:  # lingering after the last response: read and drop, bounded
            self._lingered += len(data)
            if self._lingered > LINGER_BYTES:
                self._transport.abort()
            return
        self._feed(data)

    # ---- parsing ----------------------------------------------------------------------------
    def _feed(self, data: bytes | bytearray) -> None:
        """Parse ``data`` in slices that end where a message's head or Content-Length body ends
        (and, inside a chunked body, at most the room left for chunk metadata), so that every
        slice belongs to one phase of one message and the raw-byte limits count exact bytes."""
        n = len(data)
        pos = 0
        view: memoryview | None = None
        while True:
            phase = self._phase
            end = n
            if phase in (_IDLE, _HEAD):
                i = -1
                if phase == _HEAD and pos == 0 and self._tail:
                    i = self._split_head_end(data)
                if i == -1:
                    i = data.find(b"\r\n\r\n", pos)
                    if i != -1:
                        end = i + 4
                else:
                    end = i
            elif phase == _BODY:
                req = self._req
                if req is not None:
                    end = min(n, pos + self._length - req._body_len)
            else:
                room = self._chunk_room()
                end = min(n, pos + (room if room > self._chunk_slice_min else self._chunk_slice_min))
            if pos == 0 and end >= n:
                self._feed_slice(data, phase)
                return
            if view is None:
                view = memoryview(data)
            self._feed_slice(view[pos:end], phase)
            if end >= n or self._closing or self._lost:
                return
            pos = end

    def _split_head_end(self, data: bytes | bytearray) -> int:
        """Where a head whose blank line began in the previous read ends in ``data`` (-1: it did not)."""
        tail = self._tail
        j = (tail + data[:3]).find(b"\r\n\r\n")
        return -1 if j == -1 else j + 4 - len(tail)

    def _chunk_room(self) -> int:
        """Bytes of chunk metadata (extensions, trailers) this request may still send."""
        req = self._req
        body = req._body_len if req is not None else 0
        return self._settings.max_chunk_extension + _CHUNK_LINE_SLACK - (self._raw - body - self._chunk_min)

    def _feed_slice(self, data: bytes | bytearray | memoryview, phase: int) -> None:
        n = len(data)
        self._feed_len = n
        if phase in (_HEAD, _CHUNKED):
            self._raw += n
        try:
            self._parser.feed_data(data)
        except Exception as exc:
            self._parse_failed(exc)
            return
        phase = self._phase
        if phase == _HEAD:
            if self._raw - self._url_len > self._head_limit:
                self._reject("header_too_large")
            else:
                self._tail = (self._tail + bytes(data[-3:]))[-3:]
        elif phase == _CHUNKED and self._chunk_room() < 0:
            self._reject("chunk_extension_too_large")

    def _parse_failed(self, exc: Exception) -> None:
        """THE place where a parse failure becomes a response."""
        if isinstance(exc, httptools.HttpParserCallbackError):
            # the callback's own record: httptools hands it over as __context__, which Python
            # overwrites when feed_data runs inside an ``except`` block (a handler answering from
            # one feeds the bytes pipelined behind its request)
            ctx = self._cb_exc or exc.__context__
            self._cb_exc = None
            if isinstance(ctx, _Reject):
                self._reject(ctx.reason, ctx.err)
            elif isinstance(ctx, _Stop):
                pass
            elif ctx is not None:
                log.error("request callback failed", exc_info=ctx)
                self._reject("internal_error")
            else:
                self._reject("bad_request")
        elif isinstance(exc, httptools.HttpParserUpgrade):
            self._reject("upgrade_rejected")
        elif isinstance(exc, httptools.HttpParserError):
            self._reject("bad_request")
        else:
            log.error("request parser failed", exc_info=exc)
            self._reject("internal_error")

    def _cb_failed(self, exc: BaseException) -> BaseException:
        """Remember why a parser callback is about to raise ``exc`` (see _parse_failed)."""
        self._cb_exc = exc
        return exc

    def on_message_begin(self) -> None:
        if len(self._queue) >= PIPELINE_MAX:
            raise self._cb_failed(_Reject("pipeline_overflow"))
        self._phase = _HEAD
        self._raw = self._feed_len
        self._tail = b""
        self._reset_message()
        if self._active is None:
            self.deadline = self._loop.time() + self._settings.header_timeout
            self._dl_kind = _DL_HEADER

    def on_url(self, piece: bytes) -> None:
        n = self._url_len + len(piece)
        if n > self._max_url:
            raise self._cb_failed(_Reject("uri_too_long"))
        self._url_len = n
        self._url = self._url + piece if self._url else piece

    def on_header(self, name: bytes, value: bytes) -> None:
        # record only; names and values are checked in one local loop at headers-complete, the
        # byte size as bytes arrive (_feed) and exactly at headers-complete. Trailer fields land
        # in a fresh list after headers-complete and are dropped.
        headers = self._headers
        headers.append((name, value))
        if len(headers) > self._max_headers:
            raise self._cb_failed(_Reject("too_many_headers"))

    def on_headers_complete(self) -> None:
        p = self._parser
        version = p.get_http_version()
        if version != "1.1" and version != "1.0":
            raise self._cb_failed(_Reject("version_not_supported"))
        mb = p.get_method()
        method = _METHODS.get(mb) or mb.decode("ascii", "replace")
        if method == "CONNECT":
            raise self._cb_failed(_Reject("method_not_allowed"))
        # (an Upgrade header is refused below, CONNECT above: llhttp's upgrade flag needs one of them)
        url = self._url
        if url[:1] != b"/" and not (url == b"*" and method == "OPTIONS"):
            raise self._cb_failed(_Reject("bad_target"))
        if b"#" in url or not url.isascii():
            raise self._cb_failed(_Reject("bad_target"))
        raw = self._headers
        self._headers = []
        headers: list[tuple[bytes, bytes]] = []
        append = headers.append
        special = _SPECIAL
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
                    raise self._cb_failed(_Reject("bad_header_name"))
                known = (lname, special.get(lname, 0))
                if len(names) < _NAMES_MAX:
                    names[name] = known
            name, kind = known
            if not value.isascii():
                raise self._cb_failed(_Reject("bad_header_value"))
            if value and (value[-1] == 32 or value[-1] == 9):
                value = value.rstrip(b" \t")
            if kind:
                if kind == _H_HOST:
                    hosts += 1
                elif kind == _H_CL:
                    if cl is not None:
                        raise self._cb_failed(_Reject("bad_framing"))
                    cl = value
                elif kind == _H_TE:
                    if te is not None:
                        raise self._cb_failed(_Reject("bad_framing"))
                    te = value
                elif kind == _H_UPGRADE:
                    raise self._cb_failed(_Reject("upgrade_rejected"))
                elif kind == _H_EXPECT:
                    expect = value.lower() == b"100-continue"
                elif kind == _H_CONN:
                    conn = value if conn is None else conn + b"," + value
                else:
                    ctype = value
            append((name, value))
        if total > self._max_hdr_bytes:
            raise self._cb_failed(_Reject("header_too_large"))
        if hosts != 1 and (hosts > 1 or version == "1.1"):
            raise self._cb_failed(_Reject("bad_host"))
        chunked = False
        length = 0
        if te is not None:
            if cl is not None or version == "1.0" or te.lower() != b"chunked":
                raise self._cb_failed(_Reject("bad_framing"))
            chunked = True
        elif cl is not None:
            if not cl.isdigit() or len(cl) > 18:
                raise self._cb_failed(_Reject("bad_framing"))
            length = int(cl)
        if ctype:
            ctype = ctype.split(b";", 1)[0].strip().lower()
        s = self._settings
        limit = s.max_body_multipart if ctype == b"multipart/form-data" else s.max_body_json
        if length > limit:
            raise self._cb_failed(_Reject("body_too_large"))
        if self._server.draining:
            raise self._cb_failed(_Reject("shutting_down"))
        path, _, query = url.partition(b"?")
        keep_alive = p.should_keep_alive()
        if keep_alive and version == "1.0" and not _keeps_alive_10(conn):
            keep_alive = False
        req = Request(method, url, path.decode("ascii"), query.decode("ascii") if query else "", version,
                      headers, keep_alive, self._peer, ctype)
        req._limit = limit
        try:
            err = self._handler.on_headers(req)
        except Exception as exc:
            self._cb_failed(exc)
            raise
        if err is not None:
            raise self._cb_failed(_Reject(None, err))
        self._req = req
        if chunked or length:
            self._phase = _CHUNKED if chunked else _BODY
            self._raw = 0
            self._length = length
            self._chunk_min = self._chunk_mark = 0
            if self._active is None:
                self.deadline = self._loop.time() + s.body_timeout
                self._dl_kind = _DL_BODY
            if expect and version == "1.1":
                if self._active is None:
                    self._transport.write(CONTINUE_100)
                else:
                    req._expect = True  # sent once the responses before it are out
        else:
            self._phase = _BODY

    def on_body(self, piece: bytes) -> None:
        req = self._req
        if req is None:  # pragma: no cover - the parser calls on_body only inside a message
            return
        n = req._body_len + len(piece)
        if n > req._limit:
            raise self._cb_failed(_Reject("body_too_large"))
        req._body_len = n
        req._parts.append(piece)

    def on_chunk_complete(self) -> None:
        # credit the chunk's own framing (size digits, two CRLFs; for the last chunk "0", CRLF and
        # the blank line): what is left of the raw bytes is chunk extensions and trailer fields
        req = self._req
        if req is not None:
            size = req._body_len - self._chunk_mark
            self._chunk_mark = req._body_len
            self._chunk_min += max(1, (size.bit_length() + 3) >> 2) + 4

    def on_message_complete(self) -> None:
        req = self._req
        if self._phase == _CHUNKED and self._chunk_room() < 0:
            # the slice may hold bytes of the next request too, but slices inside a chunked body
            # are cut to the room left (_feed): only a request that already spent nearly all of it
            # can be refused by them
            raise self._cb_failed(_Reject("chunk_extension_too_large"))
        self._req = None
        self._phase = _IDLE
        self._feed_len = 0
        if req is None:  # pragma: no cover - defensive
            return
        parts = req._parts
        if parts:
            req.body = parts[0] if len(parts) == 1 else b"".join(parts)
            req._parts = []
        if self._active is None:
            self._start(req)
        else:
            self._queue.append(req)
        if not req.keep_alive:
            self._closing = True
            raise self._cb_failed(_Stop())

    # ---- handling ---------------------------------------------------------------------------
    def _start(self, req: Request) -> None:
        w = ResponseWriter(self, req)
        self._active = w
        self.deadline = 0.0
        self._stats.requests_total += 1
        w._task = self._loop.create_task(self._run(req, w))

    async def _run(self, req: Request, w: ResponseWriter) -> None:
        try:
            await self._handler.handle(req, w)
        except ClientGone:
            return
        except asyncio.CancelledError:
            if not w.finished:
                w.abort()
            return
        except Exception:
            log.exception("handler failed on %r", req)
            if w.disconnected or w.finished:
                return
            if w.started:
                w.abort()
                return
            w._keep_alive = False
            w.send_error(InternalError("Internal server error."))
            return
        if not w.finished and not w.disconnected:
            log.error("handler returned without finishing the response to %r", req)
            if w.started:
                w.abort()
            else:
                w._keep_alive = False
                w.send_error(InternalError("Internal server error."))

    def _response_done(self, w: ResponseWriter) -> None:
        """The active response is complete: go on with the next request, or close."""
        if self._active is w:
            self._active = None
        if self._lost:
            return
        if not w._keep_alive:
            self._closing = True
            self._close_gracefully()
            return
        if self.flow.write_paused and (self._queue or not self._closing):
            # The client does not read its responses: answer and read nothing more until it does
            # (resume_writing), or drop it at the stall deadline. Bounds what a pipelining client
            # that never reads can make us buffer.
            self._write_wait = True
            self.flow.pause_reading()
            self.deadline = self._loop.time() + self._settings.keepalive_timeout
            self._dl_kind = _DL_WRITE
            return
        self._next()

    def _next(self) -> None:
        """Serve the next queued request, the deferred rejection, or go on reading."""
        queue = self._queue
        if queue:
            self._start(queue.popleft())
            return
        final = self._final
        if final is not None:
            self._final = None
            self._write_final(final[0], final[1])
            return
        if self._closing:
            self._close_gracefully()
            return
        req = self._req
        if req is not None and req._expect:
            req._expect = False
            self._transport.write(CONTINUE_100)
        now = self._loop.time()
        phase = self._phase
        if phase == _IDLE:
            self.deadline = now + self._settings.keepalive_timeout
            self._dl_kind = _DL_KEEPALIVE
        elif phase == _HEAD:
            self.deadline = now + self._settings.header_timeout
            self._dl_kind = _DL_HEADER
        else:
            self.deadline = now + self._settings.body_timeout
            self._dl_kind = _DL_BODY
        pending = self._pending
        if pending:
            self._pending = None
            self.flow.resume_reading()
            self._feed(pending)
        else:
            self.flow.resume_reading()

    # ---- rejections and closing -------------------------------------------------------------
    def _reject(self, reason: str | None, err: FlexInferError | None = None) -> None:
        """Answer once with an error, close, count ``reason``. Never calls the handler."""
        if self._rejected:
            return
        self._rejected = True
        self._closing = True
        self.deadline = 0.0
        if reason is not None:
            rej = self._stats.rejections
            rej[reason] = rej.get(reason, 0) + 1
        if reason == "pipeline_overflow":
            if self._active is None:
                self._close_gracefully()
            return
        if err is None:
            line, rest = rejection_parts(reason or "bad_request")
        else:
            try:
                line, rest = error_response_parts(err, close=True)
            except ValueError:
                log.error("on_headers error %r has an invalid header", err)
                line, rest = rejection_parts("internal_error")
        if self._active is not None:
            self._final = (line, rest)  # answered after the responses before it
            return
        self._write_final(line, rest)

    def _write_final(self, line: bytes, rest: bytes) -> None:
        if self._lost:
            return
        self._transport.write(line + DATE[0] + rest)
        self._close_gracefully()

    def _close_gracefully(self) -> None:
        """Send FIN after the buffered bytes, then keep reading and dropping for a short while."""
        self._closing = True
        tr = self._transport
        if self._lost or tr.is_closing():
            return
        self._queue.clear()
        self._pending = None
        if tr.can_write_eof():
            try:
                tr.write_eof()
            except (OSError, RuntimeError):
                tr.close()
                return
            self.flow.resume_reading()
            self.deadline = self._loop.time() + min(LINGER_SECONDS, self._settings.header_timeout)
            self._dl_kind = _DL_LINGER
        else:
            tr.close()

    def _abort_connection(self) -> None:
        """Close at once, unfinished response included (no terminating chunk)."""
        self._closing = True
        self.deadline = 0.0
        tr = self._transport
        if self._lost or tr.is_closing():
            return
        if self.flow.write_paused:
            tr.abort()
        else:
            tr.close()

    def on_deadline(self) -> None:
        """Called by the server tick when ``deadline`` passed."""
        self.deadline = 0.0
        if self._lost or self._active is not None:
            return
        kind = self._dl_kind
        if kind == _DL_HEADER:
            self._reject("header_timeout")
        elif kind == _DL_BODY:
            self._reject("body_timeout")
        elif kind in (_DL_LINGER, _DL_WRITE):
            self._closing = True
            self._transport.abort()
        else:  # fresh or idle keep-alive connection: close quietly
            self._closing = True
            self._transport.close()

    # ---- server-driven ----------------------------------------------------------------------
    @property
    def idle(self) -> bool:
        """No request handled, queued or half received."""
        return self._active is None and not self._queue and self._phase == _IDLE

    @property
    def busy(self) -> bool:
        """A request is handled, queued, or (on a connection that may still serve) half received."""
        if self._lost:
            return False
        if self._active is not None:
            return True
        return not self._closing and (bool(self._queue) or self._phase != _IDLE or bool(self._pending))

    def shutdown_idle(self) -> None:
        """Drain: close at once if idle (in-flight and half-received requests go on)."""
        if self._lost:
            return
        if (self._closing and self._active is None) or (self.idle and not self._pending):
            self._closing = True
            self._transport.close()

    def shutdown_now(self) -> None:
        """Drain timeout: abort whatever is in flight."""
        w = self._active
        if w is not None:
            w._client_lost()  # on_disconnect callbacks first: the handler sees its client gone
            if w._task is not None and not w._task.done():
                w._task.cancel()
        if not self._lost:
            self._closing = True
            self._transport.abort()

