"""One HTTP/1.1 connection: httptools callbacks, limits, deadlines, keep-alive, pipelining.

Owns: :class:`HttpProtocol` (one per connection), the :class:`Handler` interface and THE place where
a parse failure or a broken rule becomes a response (:meth:`HttpProtocol._parse_failed` maps it to
a rejection reason, and ``_reject`` of closing.py answers: once, OpenAI JSON, ``Connection: close``,
one counter, and the handler is never called). Head rules: pure functions in head.py. How a
connection ends: closing.py's ``Closing``, the base of :class:`HttpProtocol`. :class:`Request` and
:class:`ResponseWriter` live in request.py and are re-exported here, as the contract names them;
the writer uses only ``request.Connection``, the public surface the protocol gives it.

How it works: a request whose head came whole in one read and is plainly written (HTTP/1.1, a
known method, plain field lines: headscan's ``request_fields``) and passes every limit and head
rule is taken without the parser (``_take_plain``; its Content-Length body read as it comes,
``_plain_piece``); everything else goes to httptools from its first byte, so the parser decides
every error. Parser callbacks only record (and raise ``Rejected`` to
stop the parser at once when a rule is broken). Limits are checked as bytes arrive: URL bytes in ``on_url``, the header count in
``on_header``, and the raw bytes fed while the header block is still open, so a 1 MiB header value
is refused after about one read; names and values are checked in one local loop at headers-complete
(head.read_headers). The state of the body being read (its length, limit, pieces, an owed
``100 Continue``) is the connection's, not the Request's.
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

try:
    import cython
except ImportError:  # no Cython here: its decorators do nothing in pure Python
    from flexinfer import _nocython as cython  # type: ignore[no-redef]

from flexinfer._speedups import request_fields, request_head
from flexinfer.errors import FlexInferError, InternalError
from flexinfer.http.closing import DL_BODY, DL_FRESH, DL_HEADER, DL_KEEPALIVE, DL_WRITE, LINGER_BYTES, Closing
from flexinfer.http.flow import ClientGone, FlowControl
from flexinfer.http.head import Rejected, keeps_alive_10, plain_connection, read_headers, request_line
from flexinfer.http.request import Request, ResponseWriter
from flexinfer.http.responses import CONTINUE_100
from flexinfer.http.task import RequestTask

if TYPE_CHECKING:
    from flexinfer.http.server import HTTPServer

__all__ = ["ClientGone", "Handler", "HttpProtocol", "Request", "ResponseWriter"]

log = logging.getLogger("flexinfer.http")
_TASK_NAME = "flexinfer-request"

KiB = 1024

#: Raw pipelined bytes kept while a request is handled; over this, reading pauses.
PENDING_HIGH = 64 * KiB
#: Complete requests parsed ahead (same read as an earlier one) before the connection is closed.
PIPELINE_MAX = 64
#: Bytes around a chunk extension (size digits, ';', CRLFs) and around the header block (method,
#: version, CRLFs) tolerated on top of the configured limits by the raw-byte checks.
_CHUNK_LINE_SLACK = 64
_HEAD_SLACK = 64
#: Smallest slice a chunked body is fed in (see _feed; at most half the metadata limit): bounds the
#: parser calls per body byte of a request that has spent most of its chunk metadata.
_CHUNK_SLICE_MIN = 1024

# parse phases
_IDLE, _HEAD, _BODY, _CHUNKED = 0, 1, 2, 3


def _handler_ended(w: ResponseWriter, exc: BaseException | None) -> None:
    """How a request's handler ended, heard inside its task's last step (RequestTask's hook). A
    return that left the response unfinished is a handler's bug: logged, answered 500 (aborted if
    it had started). A client gone ends nothing more, a cancellation aborts an unfinished response,
    any other failure is logged and answered as that bug is: never a traceback to the client."""
    if exc is None:
        if w.finished or w.disconnected:
            return
        log.error("handler returned without finishing the response to %r", w.req)
    elif isinstance(exc, ClientGone):
        return
    elif isinstance(exc, asyncio.CancelledError):
        if not w.finished:
            w.abort()
        return
    else:
        log.error("handler failed on %r", w.req, exc_info=exc)
        if w.disconnected or w.finished:
            return
    if w.started:
        w.abort()
        return
    w.keep_alive = False
    w.send_error(InternalError("Internal server error."))


class _Stop(Exception):
    """Raised in on_message_complete of a non-keep-alive request: nothing after it is parsed."""


class Handler(Protocol):
    """What a server serves. ``attach(server)``, when defined, is called by HTTPServer.__init__."""

    def on_headers(self, req: Request) -> FlexInferError | None: ...

    async def handle(self, req: Request, resp: ResponseWriter) -> None: ...


class HttpProtocol(Closing, asyncio.Protocol):
    """One client connection (see the module docstring)."""

    __slots__ = (
        "_active",
        "_body_len",
        "_body_limit",
        "_body_parts",
        "_cb_exc",
        "_chunk_mark",
        "_chunk_min",
        "_chunk_slice_min",
        "_continue",
        "_feed_len",
        "_handler",
        "_head_limit",
        "_headers",
        "_length",
        "_lost",
        "_max_hdr_bytes",
        "_max_headers",
        "_max_url",
        "_parser",
        "_peer",
        "_pending",
        "_phase",
        "_plain_body",
        "_queue",
        "_raw",
        "_req",
        "_server",
        "_settings",
        "_stats",
        "_tail",
        "_transport",
        "_url",
        "_url_len",
        "_version",
        "_write_wait",
        "flow",
        "loop",
    )

    def __init__(self, server: HTTPServer) -> None:
        Closing.__init__(self)
        s = server.settings
        self._server = server
        self._settings = s
        self._handler = server.handler
        self._stats = server.stats
        self.loop = asyncio.get_running_loop()
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
        self._plain_body = False  # the body being read is a plain request's: ours, not the parser's
        self._raw = 0
        self._feed_len = 0
        self._tail = b""  # the last bytes of a head that continues in the next read
        # the version the request line of a head that came in one slice plainly names (None: the
        # parser says; its get_http_version formats a new string per call)
        self._version: str | None = None
        self._length = 0  # Content-Length of the body being read
        self._chunk_min = 0  # framing bytes of the chunks read so far (size digits, CRLFs)
        self._chunk_mark = 0  # body bytes at the end of the last chunk
        self._body_len = 0  # body bytes of the request being read
        self._body_limit = 0  # its body limit
        self._body_parts: list[bytes] = []  # its body pieces (joined at the message's end, _message_done)
        self._continue = False  # its 100 Continue is owed, once the responses before it are out
        self._req: Request | None = None
        self._active: ResponseWriter | None = None
        self._queue: deque[Request] = deque()
        self._pending: bytearray | None = None
        self._lost = False
        self._write_wait = False
        self._cb_exc: BaseException | None = None
        self._reset_message()

    def _reset_message(self) -> None:
        self._url = b""
        self._url_len = 0
        self._headers: list[tuple[bytes, bytes]] = []

    # ---- what its ResponseWriter uses (request.Connection; also response_done, abort_connection)
    @property
    def transport(self) -> asyncio.Transport:
        return self._transport

    @property
    def draining(self) -> bool:
        return self._server.draining

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
        self.deadline = self.loop.time() + self._settings.header_timeout
        self._dl_kind = DL_FRESH

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self.deadline = 0.0
        self.flow.connection_lost()
        self._server._unregister(self)
        self._drop_queued()
        w = self._active
        if w is not None:
            w.client_lost()

    def _drop_queued(self) -> None:
        self._queue.clear()
        self._pending = None
        self._body_parts.clear()  # a body refused part-way (413) is never joined: free it now

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
    @cython.annotation_typing(False)  # the cpdef of protocol.pxd
    def _feed(self, data: bytes) -> None:
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
                    i, version = request_head(data, pos)
                    if i != -1:
                        end = i
                        if phase == _IDLE and version == "1.1":
                            took = self._take_plain(data, pos, i)
                            if took != -1:  # a whole request, read without the parser
                                if took >= n or self._closing or self._lost:
                                    return
                                pos = took
                                continue
                    if phase == _IDLE:  # a message begins in this slice (or empty lines come first)
                        self._version = version
                else:
                    end = i
            elif phase == _BODY:
                if self._req is not None:
                    end = min(n, pos + self._length - self._body_len)
                if self._plain_body:  # a plain request's body: its bytes are ours, not the parser's
                    self._plain_piece(data if pos == 0 and end == n else data[pos:end])
                    if end >= n or self._closing or self._lost:
                        return
                    pos = end
                    continue
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

    @cython.annotation_typing(False)  # the cpdef of protocol.pxd
    def _take_plain(self, data: bytes, pos: int, end: int) -> int:
        """Take the request at ``data[pos:]``, whose head ends at ``end``, without the parser when
        it is plainly written (headscan's ``request_fields``: HTTP/1.1, a known method, an
        origin-form target, plain field lines), passes every limit and head rule and is framed by a
        Content-Length (or nothing; what of the body is not in ``data`` is read as it comes); its
        Connection header, if any, is ``close`` or ``keep-alive``. Answers where it ends; -1, having changed nothing,
        for any other request, which the parser then reads from the same bytes (and refuses where
        a limit or rule is broken: the errors stay the parser path's). What a taken request goes
        through after its head is the parser path's, in the same order: the handler's on_headers
        (a refusal or a failure is answered the same way), then the start or the queue."""
        fields = request_fields(data, pos, end)
        if fields is None:
            return -1
        method, url, raw = fields
        if len(url) > self._max_url or len(raw) > self._max_headers or len(self._queue) >= PIPELINE_MAX:
            return -1
        try:
            verb = request_line("1.1", method, url)
            headers, ctype, length, expect, conn = read_headers(raw, "1.1", self._max_hdr_bytes)
            limit = self._admit(ctype, length)
        except Rejected:
            return -1
        stop = end + length
        if length < 0 or expect:
            return -1
        keep_alive = plain_connection(conn)
        if keep_alive < 0:
            return -1
        req = self._new_request(verb, url, "1.1", headers, ctype, keep_alive == 1)
        self._phase = _HEAD  # where a refusal leaves the connection on the parser path too
        try:
            err = self._handler.on_headers(req)
        except Exception as exc:
            log.error("request callback failed", exc_info=exc)
            self._reject("internal_error")
            return min(stop, len(data))
        if err is not None:
            self._reject(None, err)
            return min(stop, len(data))
        if stop > len(data):  # the rest of the body comes in later reads (a client that writes
            # the head and the body apart, as httpx does): read it as it comes (_plain_piece)
            self._req = req
            self._arm_body(length, limit, False)
            self._plain_body = True
            if end < len(data):
                self._plain_piece(data[end:])
            return len(data)
        if length:
            req.body = data[end:stop]
        self._message_done(req)
        return stop

    @cython.annotation_typing(False)  # the cpdef of protocol.pxd
    def _plain_piece(self, piece: bytes) -> None:
        """Body bytes of the plain request being read (``_take_plain``; never past its length):
        kept, and the request handed on once the last one is in."""
        self._body_parts.append(piece)
        self._body_len += len(piece)
        if self._body_len >= self._length:
            self._plain_body = False
            self._message_done(self._req)

    @cython.annotation_typing(False)  # the cpdef of protocol.pxd
    def _message_done(self, req: Request | None) -> bool:
        """THE end of a request's message, parsed or plain: its body pieces joined, the connection
        back to idle, the request started or queued; False when it ends the connection (no
        keep-alive). (None: a message end with no request recorded, which no parser path makes;
        only the reset is done.)"""
        parts = self._body_parts
        if parts:
            if req is not None:
                req.body = parts[0] if len(parts) == 1 else b"".join(parts)
            parts.clear()
        self._req = None
        self._phase = _IDLE
        self._feed_len = 0
        self._continue = False  # (a body that arrived behind another request's response)
        if req is None:  # pragma: no cover - defensive
            return True
        if self._active is None:
            self._start(req)
        else:
            self._queue.append(req)
        if not req.keep_alive:
            self._closing = True
            return False
        return True

    def _split_head_end(self, data: bytes) -> int:
        """Where a head whose blank line began in the previous read ends in ``data`` (-1: it did not)."""
        tail = self._tail
        j = (tail + data[:3]).find(b"\r\n\r\n")
        return -1 if j == -1 else j + 4 - len(tail)

    def _chunk_room(self) -> int:
        """Bytes of chunk metadata (extensions, trailers) this request may still send."""
        body = self._body_len if self._req is not None else 0
        return self._settings.max_chunk_extension + _CHUNK_LINE_SLACK - (self._raw - body - self._chunk_min)

    @cython.annotation_typing(False)  # the cpdef of protocol.pxd
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
            if isinstance(ctx, Rejected):
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
            raise self._cb_failed(Rejected("pipeline_overflow"))
        self._phase = _HEAD
        self._raw = self._feed_len
        self._tail = b""
        self._reset_message()
        if self._active is None:
            self.deadline = self.loop.time() + self._settings.header_timeout
            self._dl_kind = DL_HEADER

    def on_url(self, piece: bytes) -> None:
        n = self._url_len + len(piece)
        if n > self._max_url:
            raise self._cb_failed(Rejected("uri_too_long"))
        self._url_len = n
        self._url = self._url + piece if self._url else piece

    def on_header(self, name: bytes, value: bytes) -> None:
        # record only; names and values are checked in one local loop at headers-complete, the
        # byte size as bytes arrive (_feed) and exactly at headers-complete. Trailer fields land
        # in a fresh list after headers-complete and are dropped.
        headers = self._headers
        headers.append((name, value))
        if len(headers) > self._max_headers:
            raise self._cb_failed(Rejected("too_many_headers"))

    def on_headers_complete(self) -> None:
        p = self._parser
        version = self._version
        if version is None:
            version = p.get_http_version()
        else:
            self._version = None
        url = self._url
        try:
            method = request_line(version, p.get_method(), url)
            raw = self._headers
            self._headers = []  # trailer fields land in this fresh list and are dropped
            headers, ctype, length, expect, conn = read_headers(raw, version, self._max_hdr_bytes)
            limit = self._admit(ctype, length)
        except Rejected as exc:
            self._cb_failed(exc)
            raise
        keep_alive = self._parser.should_keep_alive()
        if keep_alive and version == "1.0" and not keeps_alive_10(conn):
            keep_alive = False
        req = self._new_request(method, url, version, headers, ctype, keep_alive)
        try:
            err = self._handler.on_headers(req)
        except Exception as exc:
            self._cb_failed(exc)
            raise
        if err is not None:
            raise self._cb_failed(Rejected(None, err))
        self._req = req
        if length:
            self._arm_body(length, limit, expect and version == "1.1")
        else:
            self._phase = _BODY

    @cython.annotation_typing(False)  # the cpdef of protocol.pxd
    def _admit(self, ctype: bytes, length: int) -> int:
        """The body limit of a request with media type ``ctype`` (checked against a declared
        Content-Length here, against the bytes as they arrive in on_body); no request while draining."""
        s = self._settings
        limit = s.max_body_multipart if ctype == b"multipart/form-data" else s.max_body_json
        if length > limit:
            raise Rejected("body_too_large")
        if self._server.draining:
            raise Rejected("shutting_down")
        return limit

    @cython.annotation_typing(False)  # the cpdef of protocol.pxd
    def _new_request(self, method: str, url: bytes, version: str, headers: list[tuple[bytes, bytes]],
                     ctype: bytes, keep_alive: bool) -> Request:
        path, _, query = url.partition(b"?")
        return Request(method, url, path.decode("ascii"), query.decode("ascii") if query else "", version,
                       headers, keep_alive, self._peer, ctype)

    @cython.annotation_typing(False)  # the cpdef of protocol.pxd
    def _arm_body(self, length: int, limit: int, expect: bool) -> None:
        """Read a body: chunked (``length`` -1) or ``length`` bytes, at most ``limit``; the body
        deadline; ``100 Continue`` now, or once the responses before this request are out."""
        self._phase = _CHUNKED if length < 0 else _BODY
        self._raw = 0
        self._length = length if length > 0 else 0
        self._chunk_min = self._chunk_mark = 0
        self._body_len = 0
        self._body_limit = limit
        if self._active is None:
            self.deadline = self.loop.time() + self._settings.body_timeout
            self._dl_kind = DL_BODY
        if expect:
            if self._active is None:
                self._transport.write(CONTINUE_100)
            else:
                self._continue = True

    def on_body(self, piece: bytes) -> None:
        # (the parser calls on_body only inside a message whose headers passed: _arm_body ran)
        n = self._body_len + len(piece)
        if n > self._body_limit:
            raise self._cb_failed(Rejected("body_too_large"))
        self._body_len = n
        self._body_parts.append(piece)

    def on_chunk_complete(self) -> None:
        # credit the chunk's own framing (size digits, two CRLFs; for the last chunk "0", CRLF and
        # the blank line): what is left of the raw bytes is chunk extensions and trailer fields
        size = self._body_len - self._chunk_mark
        self._chunk_mark = self._body_len
        self._chunk_min += max(1, (size.bit_length() + 3) >> 2) + 4

    def on_message_complete(self) -> None:
        if self._phase == _CHUNKED and self._chunk_room() < 0:
            # the slice may hold bytes of the next request too, but slices inside a chunked body
            # are cut to the room left (_feed): only a request that already spent nearly all of it
            # can be refused by them
            raise self._cb_failed(Rejected("chunk_extension_too_large"))
        if not self._message_done(self._req):
            raise self._cb_failed(_Stop())

    # ---- handling ---------------------------------------------------------------------------
    def _start(self, req: Request) -> None:
        w = ResponseWriter(self, req)
        self._active = w
        self.deadline = 0.0
        self._stats.requests_total += 1
        # a RequestTask, not an asyncio.Task: the same steps and cancellation without CPython
        # 3.11's registration of every Task in a WeakSet, run as Python (task.py says what differs)
        # the handler's own coroutine; how it ends comes to _handler_ended (task.py: the hook)
        w.task = RequestTask(self._handler.handle(req, w), self.loop, _TASK_NAME, _handler_ended, w)

    def response_done(self, w: ResponseWriter) -> None:
        """The active response is complete: go on with the next request, or close."""
        if self._active is w:
            self._active = None
        if self._lost:
            return
        if not w.keep_alive:
            self._closing = True
            self._close_gracefully()
            return
        if self.flow.write_paused and (self._queue or not self._closing):
            # The client does not read its responses: answer and read nothing more until it does
            # (resume_writing), or drop it at the stall deadline. Bounds what a pipelining client
            # that never reads can make us buffer.
            self._write_wait = True
            self.flow.pause_reading()
            self.deadline = self.loop.time() + self._settings.keepalive_timeout
            self._dl_kind = DL_WRITE
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
        if self._continue:
            self._continue = False
            self._transport.write(CONTINUE_100)
        now = self.loop.time()
        phase = self._phase
        if phase == _IDLE:
            self.deadline = now + self._settings.keepalive_timeout
            self._dl_kind = DL_KEEPALIVE
        elif phase == _HEAD:
            self.deadline = now + self._settings.header_timeout
            self._dl_kind = DL_HEADER
        else:
            self.deadline = now + self._settings.body_timeout
            self._dl_kind = DL_BODY
        pending = self._pending
        if pending:
            self._pending = None
            self.flow.resume_reading()
            self._feed(bytes(pending))
        else:
            self.flow.resume_reading()

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
            w.client_lost()  # on_disconnect callbacks first: the handler sees its client gone
            task = w.task
            if task is not None and not task.done():
                task.cancel()
        if not self._lost:
            self._closing = True
            self._transport.abort()

