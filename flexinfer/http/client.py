"""The upstream (backend) side: per-backend keep-alive pools and the httptools response parser.

Owns: :class:`UpstreamPool` / :class:`Pools` (connect with a timeout, LIFO reuse, idle expiry below
the backends' keep-alive, at most one retry of a reused connection that failed before any response
byte), canonical serialization of requests (request line, end-to-end headers, Host and
Content-Length added here; hop-by-hop headers dropped; never raw client bytes), strict parsing of
responses (garbage, CL+TE, duplicate CL, oversize head, unrequested 101 -> ``reason="protocol"``),
response-start and stream-idle timeouts (no total timeout), and :meth:`UpstreamResponse.relay`,
which hands each upstream piece straight to the client writer from ``data_received`` and pauses the
upstream socket while the client is slow.
Must not: know models or routes, retry anything else, or reuse a connection that saw an error or an
unfinished exchange.
"""

from __future__ import annotations

import asyncio
import re
from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING, cast

import httptools

from flexinfer.http.flow import ClientGone
from flexinfer.settings import UpstreamSettings

if TYPE_CHECKING:
    from flexinfer.http.protocol import ResponseWriter

__all__ = [
    "HOP_BY_HOP",
    "Pools",
    "UpstreamConnectError",
    "UpstreamError",
    "UpstreamPool",
    "UpstreamResponse",
    "UpstreamTimeout",
    "serialize_request",
]

#: Dropped from forwarded requests (plus every header named in ``Connection``).
HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"proxy-connection", b"te", b"trailer",
                        b"transfer-encoding", b"upgrade"})
# set by the client itself (Host, Content-Length) or meaningless once the body is buffered (Expect)
_CLIENT_SET = frozenset({b"host", b"content-length", b"expect"})
_NO_BODY_METHODS = frozenset({"GET", "HEAD", "DELETE", "OPTIONS", "TRACE"})
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9a-zA-Z]+")
_TARGET = re.compile(rb"[!-~]+")
_valid_names: set[bytes] = set()


class UpstreamError(Exception):
    """The backend failed. ``reason`` is a metric label; ``sent`` tells whether any request byte
    reached the socket (never replay the request then)."""

    def __init__(self, message: str, *, reason: str, sent: bool) -> None:
        super().__init__(message)
        self.reason = reason
        self.sent = sent


class UpstreamConnectError(UpstreamError):
    """Could not connect (refused, unreachable, connect timeout): nothing was sent, safe to try
    another replica. ``reason`` is ``connect_refused`` or ``connect_timeout``."""

    def __init__(self, message: str, *, reason: str = "connect_refused") -> None:
        super().__init__(message, reason=reason, sent=False)


class UpstreamTimeout(UpstreamError):
    """``response_timeout`` (no response head in time) or ``idle_timeout`` (silence inside a body)."""


class _ReuseFailed(Exception):
    """A reused connection closed before any response byte (keep-alive race): may retry once."""

    def __init__(self, error: UpstreamError) -> None:
        self.error = error


class _NotSent(Exception):
    """The connection was gone before the request was written."""


class _ProtocolViolation(Exception):
    pass


class _ExtraMessage(Exception):
    pass


def serialize_request(method: str, path: str, headers: list[tuple[bytes, bytes]], body: bytes,
                      host_line: bytes) -> bytes:
    """Canonical request head: request line, end-to-end headers (names lower-cased), Host, then
    Content-Length (always with a body, and for methods that carry one). ValueError on a method,
    target, name or value that would break the framing."""
    try:
        mb = method.encode("ascii")
        pb = path.encode("ascii")
    except UnicodeEncodeError:
        raise ValueError("method and path must be ASCII") from None
    if not _TOKEN.fullmatch(mb) or not _TARGET.fullmatch(pb):
        raise ValueError("invalid method or request target")
    named: set[bytes] | None = None
    for name, value in headers:
        if name.lower() == b"connection":
            if named is None:
                named = set()
            named.update(tok.strip().lower() for tok in value.split(b","))
    parts = [mb, b" ", pb, b" HTTP/1.1\r\n"]
    lines = 1
    for name, value in headers:
        lname = name.lower()
        if lname in HOP_BY_HOP or lname in _CLIENT_SET or (named is not None and lname in named):
            continue
        if lname not in _valid_names:
            if not _TOKEN.fullmatch(lname):
                raise ValueError(f"invalid header name {name[:64]!r}")
            if len(_valid_names) < 4096:
                _valid_names.add(lname)
        parts += (lname, b": ", value, b"\r\n")
        lines += 1
    parts.append(host_line)
    lines += 1
    if body or method not in _NO_BODY_METHODS:
        parts.append(b"content-length: %d\r\n" % len(body))
        lines += 1
    parts.append(b"\r\n")
    lines += 1
    head = b"".join(parts)
    if head.count(b"\n") != lines or head.count(b"\r") != lines or b"\x00" in head:
        raise ValueError("header value contains CR, LF or NUL")
    return head


class UpstreamResponse:
    """A response head from a backend, and its body as it arrives."""

    __slots__ = ("_buffered", "_client_gone", "_conn", "_eof", "_error", "_high", "_loop", "_pieces",
                 "_relayed", "_sink", "_sink_error", "_waiter", "chunked", "content_length", "headers",
                 "status")

    def __init__(self, conn: _Conn, status: int, headers: list[tuple[bytes, bytes]],
                 content_length: int | None, chunked: bool) -> None:
        self.status = status
        self.headers = headers
        self.content_length = content_length
        self.chunked = chunked
        self._conn: _Conn | None = conn
        self._loop = conn.loop
        self._high = conn.pool._settings.read_buffer_high
        self._pieces: deque[bytes] = deque()
        self._buffered = 0
        self._eof = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._sink: ResponseWriter | None = None
        self._sink_error: BaseException | None = None
        self._relayed = 0
        self._client_gone = False

    def __repr__(self) -> str:
        return f"<UpstreamResponse {self.status} cl={self.content_length} chunked={self.chunked}>"

    # ---- fed by the connection ----------------------------------------------------------------
    def _wake(self) -> None:
        w = self._waiter
        if w is not None:
            self._waiter = None
            if not w.done():
                w.set_result(None)

    def _on_piece(self, piece: bytes) -> None:
        sink = self._sink
        if sink is not None:
            try:
                sink.write(piece)
            except Exception as exc:  # e.g. more bytes than the Content-Length the caller declared
                self._sink_error = exc
                self.close()
                self._wake()
                return
            self._relayed += len(piece)
            if sink._flow.write_paused:
                conn = self._conn
                if conn is not None:
                    conn.pause_reading()
            return
        self._pieces.append(piece)
        self._buffered += len(piece)
        if self._buffered > self._high:
            conn = self._conn
            if conn is not None:
                conn.pause_reading()
        self._wake()

    def _on_complete(self) -> None:
        self._eof = True
        self._conn = None
        self._wake()

    def _on_error(self, exc: BaseException) -> None:
        if self._eof or self._error is not None:
            return
        self._error = exc
        self._conn = None
        self._wake()

    # ---- consumer API -------------------------------------------------------------------------
    async def read(self) -> bytes:
        """The next piece of the (de-chunked) body as it arrived; ``b""`` at the end."""
        while True:
            pieces = self._pieces
            if pieces:
                piece = pieces.popleft()
                self._buffered -= len(piece)
                conn = self._conn
                if conn is not None and conn.paused and self._buffered <= self._high // 2:
                    conn.resume_reading()
                return piece
            if self._error is not None:
                raise self._error
            if self._eof:
                return b""
            if self._sink is not None:
                raise RuntimeError("relay() is consuming this response")
            waiter = self._waiter = self._loop.create_future()
            await waiter

    async def read_all(self, limit: int) -> bytes:
        """The whole body; UpstreamError(reason="protocol") past ``limit`` bytes."""
        parts: list[bytes] = []
        total = 0
        while True:
            piece = await self.read()
            if not piece:
                return b"".join(parts)
            total += len(piece)
            if total > limit:
                self.close()
                raise UpstreamError(f"response body over {limit} bytes", reason="protocol", sent=True)
            parts.append(piece)

    async def relay(self, writer: ResponseWriter) -> int:
        """Copy the body to ``writer`` piece by piece, then ``writer.end()``; returns bytes relayed.

        Pieces go from the upstream protocol's ``data_received`` straight to ``writer.write`` (no
        await per piece). While the client's write buffer is over its high-water mark the upstream
        socket is paused. UpstreamError: the upstream failed (the writer is left as it is, so the
        caller can add an SSE error event and abort). ClientGone: the client went away (the
        upstream connection is closed at once)."""
        if not writer.started:
            raise RuntimeError("start() the response before relay()")
        if self._sink is not None:
            raise RuntimeError("relay() already running")
        n = 0
        pieces = self._pieces
        while pieces:
            piece = pieces.popleft()
            writer.write(piece)
            n += len(piece)
        self._buffered = 0
        if self._error is not None:
            raise self._error
        if writer.disconnected:
            self.close()
            raise ClientGone()
        if self._eof:
            writer.end()
            return n
        conn = self._conn
        assert conn is not None
        flow = writer._flow
        self._relayed = n
        self._sink = writer
        writer.on_disconnect(self._on_client_gone)
        flow.set_listener(self._on_client_resumed)
        try:
            if flow.write_paused:
                conn.pause_reading()
            else:
                conn.resume_reading()
            while not self._eof:
                if self._client_gone:
                    raise ClientGone()
                if self._sink_error is not None:
                    raise self._sink_error
                if self._error is not None:
                    raise self._error
                waiter = self._waiter = self._loop.create_future()
                await waiter
        except BaseException:
            self.close()
            raise
        finally:
            self._sink = None
            flow.set_listener(None)
        writer.end()
        return self._relayed

    def _on_client_gone(self) -> None:
        self._client_gone = True
        self.close()
        self._wake()

    def _on_client_resumed(self) -> None:
        conn = self._conn
        if conn is not None and conn.paused:
            conn.resume_reading()

    def close(self) -> None:
        """Abandon the response: an unfinished connection is closed, never reused."""
        self._pieces.clear()
        self._buffered = 0
        conn = self._conn
        self._conn = None
        if conn is not None:
            conn.abandon()
        if not self._eof and self._error is None:
            self._error = UpstreamError("response abandoned", reason="closed", sent=True)


class _Conn(asyncio.Protocol):
    """One upstream connection: one exchange at a time."""

    __slots__ = (
        "broken", "checked_out", "close_delimited", "expect_response", "hdr_bytes", "head_only",
        "head_raw", "headers", "idle_since", "in_head", "interim", "keep_alive", "last_rx", "loop",
        "lost", "msg_done", "parser", "paused", "pool", "resp", "reused", "rx", "timer", "transport",
        "waiter",
    )

    def __init__(self, pool: UpstreamPool, loop: asyncio.AbstractEventLoop) -> None:
        self.pool = pool
        self.loop = loop
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.parser = httptools.HttpResponseParser(self)
        self.lost = False
        self.broken = False
        self.reused = False
        self.checked_out = False
        self.paused = False
        self.idle_since = 0.0
        self.last_rx = 0.0
        self.waiter: asyncio.Future[UpstreamResponse] | None = None
        self.resp: UpstreamResponse | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.expect_response = False
        self.rx = 0
        self.head_raw = 0
        self.in_head = False
        self.interim = False
        self.head_only = False
        self.msg_done = False
        self.keep_alive = False
        self.close_delimited = False
        self.headers: list[tuple[bytes, bytes]] = []
        self.hdr_bytes = 0

    # ---- asyncio callbacks ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._cancel_timer()
        self.pool._forget(self)
        if not self.expect_response:
            return
        self.expect_response = False
        resp = self.resp
        if (resp is not None and self.close_delimited and not self.msg_done and exc is None
                and self.waiter is None):
            self.msg_done = True
            self.resp = None
            resp._on_complete()  # a close-delimited body ends at EOF
            return
        err = UpstreamError("upstream reset the connection" if exc is not None
                            else "upstream closed the connection",
                            reason="reset" if exc is not None else "closed", sent=True)
        self._deliver(err, allow_retry=True)

    def data_received(self, data: bytes) -> None:
        if not self.expect_response:
            # unsolicited bytes (extra data after a response, or from an idle pooled connection)
            self.broken = True
            self.transport.abort()
            return
        n = len(data)
        self.rx += n
        self.last_rx = self.loop.time()
        if self.in_head:
            self.head_raw += n
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            ctx = exc.__context__
            if isinstance(ctx, _ProtocolViolation):
                self._fail_protocol(str(ctx))
                return
            if not self.msg_done:
                self._fail_protocol("response handling failed")
                return
            self.broken = True  # a second message after a complete response: never reuse
        except httptools.HttpParserUpgrade:
            self._fail_protocol("unrequested protocol switch")
            return
        except httptools.HttpParserError as exc:
            if not self.msg_done:
                self._fail_protocol(f"malformed response: {exc}")
                return
            self.broken = True  # bytes after a complete response: drop them, never reuse
        if self.msg_done:
            self._finish()
        elif self.in_head and self.head_raw > self.pool._settings.max_response_header_bytes:
            self._fail_protocol("response head too large")

    # ---- parser callbacks -------------------------------------------------------------------
    def on_message_begin(self) -> None:
        if self.msg_done:
            raise _ExtraMessage()
        self.in_head = True
        self.headers = []
        self.hdr_bytes = 0

    def on_header(self, name: bytes, value: bytes) -> None:
        self.hdr_bytes += len(name) + len(value) + 4
        if self.hdr_bytes > self.pool._settings.max_response_header_bytes:
            raise _ProtocolViolation("response head too large")
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        p = self.parser
        status = p.get_status_code()
        if status == 101 or p.should_upgrade():
            raise _ProtocolViolation("unrequested protocol switch")
        if status < 200:
            self.interim = True  # 100 / 103: skipped, the final response follows
            return
        cl: int | None = None
        chunked = False
        for name, value in self.headers:
            if name == b"content-length":
                if cl is not None or not value.strip().isdigit():
                    raise _ProtocolViolation("invalid Content-Length")
                cl = int(value)
            elif name == b"transfer-encoding":
                if chunked or value.strip().lower() != b"chunked":
                    raise _ProtocolViolation("unsupported Transfer-Encoding")
                chunked = True
        if cl is not None and chunked:
            raise _ProtocolViolation("Content-Length with Transfer-Encoding")
        self.in_head = False
        self.keep_alive = p.should_keep_alive()
        no_body = self.head_only or status == 204 or status == 304
        self.close_delimited = not no_body and cl is None and not chunked
        if self.close_delimited:
            self.keep_alive = False
        resp = UpstreamResponse(self, status, self.headers, cl, chunked)
        self.resp = resp
        self._cancel_timer()
        waiter = self.waiter
        self.waiter = None
        if self.head_only:
            self.broken = True  # the parser would wait for a body that never comes
            self.msg_done = True
            resp._on_complete()
        elif not no_body and cl != 0:
            idle = self.pool._settings.stream_idle_timeout
            if idle > 0:
                self.timer = self.loop.call_later(idle, self._idle_check)
        if waiter is not None and not waiter.done():
            waiter.set_result(resp)

    def on_body(self, piece: bytes) -> None:
        resp = self.resp
        if resp is not None and not self.msg_done:
            resp._on_piece(piece)

    def on_message_complete(self) -> None:
        if self.interim:
            self.interim = False
            return
        if self.msg_done:
            return
        self.msg_done = True
        resp = self.resp
        if resp is not None:
            resp._on_complete()

    # ---- exchange -----------------------------------------------------------------------------
    async def exchange(self, head: bytes, body: bytes, timeout: float,
                       head_only: bool) -> UpstreamResponse:
        if self.lost or self.transport.is_closing():
            raise _NotSent()
        loop = self.loop
        waiter: asyncio.Future[UpstreamResponse] = loop.create_future()
        self.waiter = waiter
        self.resp = None
        self.rx = 0
        self.head_raw = 0
        self.in_head = True
        self.interim = False
        self.msg_done = False
        self.head_only = head_only
        self.close_delimited = False
        self.keep_alive = False
        self.expect_response = True
        if body:
            self.transport.writelines((head, body))
        else:
            self.transport.write(head)
        if timeout > 0:
            self.timer = loop.call_later(timeout, self._response_timeout)
        try:
            return await waiter
        except asyncio.CancelledError:
            self.abandon()
            raise

    def _deliver(self, err: UpstreamError, *, allow_retry: bool = False) -> None:
        """Hand an error to whoever waits: the head waiter or the response body."""
        waiter = self.waiter
        self.waiter = None
        resp = self.resp
        self.resp = None
        if waiter is not None and not waiter.done():
            if allow_retry and self.reused and self.rx == 0:
                waiter.set_exception(_ReuseFailed(err))
            else:
                waiter.set_exception(err)
        elif resp is not None:
            resp._on_error(err)

    def _fail(self, err: UpstreamError) -> None:
        self.broken = True
        self.expect_response = False
        self._cancel_timer()
        self._deliver(err)
        if not self.lost:
            self.transport.abort()
        self.pool._forget(self)

    def _fail_protocol(self, message: str) -> None:
        self._fail(UpstreamError(message, reason="protocol", sent=True))

    def _response_timeout(self) -> None:
        self.timer = None
        if self.waiter is not None and not self.waiter.done():
            self._fail(UpstreamTimeout("no response from upstream in time", reason="response_timeout",
                                       sent=True))

    def _idle_check(self) -> None:
        self.timer = None
        if not self.expect_response or self.msg_done or self.lost:
            return
        idle = self.pool._settings.stream_idle_timeout
        remaining = self.last_rx + idle - self.loop.time()
        if remaining > 0:
            self.timer = self.loop.call_later(remaining, self._idle_check)
            return
        self._fail(UpstreamTimeout("upstream stream idle too long", reason="idle_timeout", sent=True))

    def _cancel_timer(self) -> None:
        t = self.timer
        if t is not None:
            self.timer = None
            t.cancel()

    def _finish(self) -> None:
        """The response is complete: back to the pool, or closed."""
        self.expect_response = False
        self.waiter = None
        self.resp = None
        self._cancel_timer()
        if (self.broken or not self.keep_alive or self.lost
                or self.transport.get_write_buffer_size() > 0):  # request body still unsent
            self.broken = True
            if not self.lost:
                self.transport.close()
            self.pool._forget(self)
        else:
            self.pool._checkin(self)

    def abandon(self) -> None:
        """The consumer gave up: close at once, never reuse."""
        self.broken = True
        self.expect_response = False
        self.waiter = None
        self.resp = None
        self._cancel_timer()
        if not self.lost:
            self.transport.abort()
        self.pool._forget(self)

    def pause_reading(self) -> None:
        if not self.paused and not self.lost:
            self.paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.paused and not self.lost:
            self.paused = False
            self.transport.resume_reading()


class UpstreamPool:
    """Keep-alive pool for one backend (host, port)."""

    def __init__(self, host: str, port: int, settings: UpstreamSettings) -> None:
        self.host = host
        self.port = port
        self._settings = settings
        self._idle: list[_Conn] = []
        self.active = 0
        hp = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self._name = hp
        self._host_line = b"host: " + hp.encode("idna") + b"\r\n"
        self._sweep_handle: asyncio.TimerHandle | None = None
        self._closed = False

    @property
    def idle(self) -> int:
        return len(self._idle)

    def __repr__(self) -> str:
        return f"<UpstreamPool {self._name} idle={self.idle} active={self.active}>"

    async def request(self, method: str, path: str, headers: list[tuple[bytes, bytes]], body: bytes,
                      *, response_timeout: float | None = None) -> UpstreamResponse:
        """Send one request and return once the response head is in."""
        head = serialize_request(method, path, headers, body, self._host_line)
        if body and len(body) < 16 * 1024:
            head, body = head + body, b""
        loop = asyncio.get_running_loop()
        timeout = self._settings.response_timeout if response_timeout is None else response_timeout
        head_only = method == "HEAD"
        retried = False
        conn = self._take_idle(loop)
        if conn is None:
            conn = await self._connect(loop, sent=False)
        while True:
            try:
                return await conn.exchange(head, body, timeout, head_only)
            except _NotSent:
                conn = self._take_idle(loop) or await self._connect(loop, sent=retried)
            except _ReuseFailed as exc:
                if retried:
                    raise exc.error from None
                retried = True
                conn = await self._connect(loop, sent=True)

    def _take_idle(self, loop: asyncio.AbstractEventLoop) -> _Conn | None:
        idle = self._idle
        if not idle:
            return None
        now = loop.time()
        limit = self._settings.pool_idle_timeout
        while idle:
            conn = idle.pop()
            if conn.lost or conn.transport.is_closing():
                continue
            if now - conn.idle_since >= limit:
                # the newest is stale, so are all the older ones
                conn.transport.close()
                for old in idle:
                    old.transport.close()
                idle.clear()
                return None
            conn.checked_out = True
            self.active += 1
            return conn
        return None

    async def _connect(self, loop: asyncio.AbstractEventLoop, *, sent: bool) -> _Conn:
        if self._closed:
            raise UpstreamError("pool closed", reason="closed", sent=sent)
        try:
            async with asyncio.timeout(self._settings.connect_timeout):
                _, proto = await loop.create_connection(lambda: _Conn(self, loop), self.host, self.port)
        except TimeoutError:
            err: UpstreamError = UpstreamConnectError(f"connect to {self._name} timed out",
                                                      reason="connect_timeout")
        except OSError as exc:
            err = UpstreamConnectError(f"connect to {self._name} failed: {exc.strerror or exc}",
                                       reason="connect_refused")
        else:
            conn = proto
            conn.checked_out = True
            self.active += 1
            return conn
        if sent:  # this is the retry after a reused connection failed: bytes already left once
            err = UpstreamError(str(err), reason=err.reason, sent=True)
        raise err

    def _checkin(self, conn: _Conn) -> None:
        if conn.checked_out:
            conn.checked_out = False
            self.active -= 1
        conn.reused = True
        if self._closed or len(self._idle) >= self._settings.pool_max_idle:
            conn.transport.close()
            return
        conn.resume_reading()
        conn.idle_since = conn.loop.time()
        self._idle.append(conn)
        if self._sweep_handle is None:
            self._sweep_handle = conn.loop.call_later(self._settings.pool_idle_timeout, self._sweep)

    def _forget(self, conn: _Conn) -> None:
        if conn.checked_out:
            conn.checked_out = False
            self.active -= 1
        elif conn in self._idle:
            self._idle.remove(conn)

    def _sweep(self) -> None:
        self._sweep_handle = None
        idle = self._idle
        if not idle:
            return
        loop = idle[0].loop
        now = loop.time()
        limit = self._settings.pool_idle_timeout
        while idle and now - idle[0].idle_since >= limit:
            idle.pop(0).transport.close()
        if idle:
            delay = max(0.01, idle[0].idle_since + limit - now)
            self._sweep_handle = loop.call_later(delay, self._sweep)

    async def close(self) -> None:
        """Close idle connections now; busy ones close when their exchange ends."""
        self._closed = True
        if self._sweep_handle is not None:
            self._sweep_handle.cancel()
            self._sweep_handle = None
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.transport.close()
        await asyncio.sleep(0)


class Pools:
    """(host, port) -> UpstreamPool."""

    def __init__(self, settings: UpstreamSettings) -> None:
        self._settings = settings
        self._pools: dict[tuple[str, int], UpstreamPool] = {}

    def get(self, host: str, port: int) -> UpstreamPool:
        pool = self._pools.get((host, port))
        if pool is None:
            pool = self._pools[(host, port)] = UpstreamPool(host, port, self._settings)
        return pool

    def __iter__(self) -> Iterator[UpstreamPool]:
        return iter(list(self._pools.values()))

    async def close_all(self) -> None:
        pools = list(self._pools.values())
        self._pools.clear()
        for pool in pools:
            await pool.close()
