"""The connection side of the upstream (backend) client: per-backend keep-alive pools and the
httptools response parser.

Owns: :class:`UpstreamPool` / :class:`Pools` (connect with a timeout, over TLS for a pool given an
SSL context (``Pools.get_linked``, flexinfer.http.tls; plain pools keyed and dialled as before), LIFO reuse, idle expiry below
the backends' keep-alive, a pending EOF/RST/byte check (one poll(2)) before reusing a connection that
idled ``pool_check_after`` or longer — a keep-alive close comes after seconds of idleness, and one that
arrived before the loop's last poll has already removed the connection — and
at most one retry of a reused connection that failed before any response byte, only for GET, HEAD
and OPTIONS: a request whose bytes were written is never written again otherwise, because the
engine may already be running it; that refusal is an ``UpstreamError`` with ``reason="not_replayed"``),
one exchange at a time per connection (:class:`_Conn`; a plainly written head that came whole is read
without httptools, and its Content-Length or chunked body by ``_speedups.LengthBody`` or
``ChunkedBody``, one call per read, instead of httptools' callback per chunk), strict
parsing of responses
(garbage, CL+TE, duplicate CL, oversize head, unrequested 101 -> ``reason="protocol"``) and the
response-start and stream-idle timeouts (no total timeout; deadlines are floats watched by one lazy
timer per connection that is re-armed only when it fires early, so a request on a reused
connection usually schedules no timer at all). The message side (errors, serialization,
:class:`UpstreamResponse` and ``relay()``) lives in upstream.py and is re-exported here, as the
contract names this module.
Must not: know models or routes, retry anything else, or reuse a connection that saw an error or an
unfinished exchange.
"""

from __future__ import annotations

import asyncio
import select
import ssl
from collections.abc import Callable, Iterator
from time import monotonic
from typing import TYPE_CHECKING, cast

import httptools

try:
    import cython
except ImportError:  # no Cython here: its decorators do nothing in pure Python
    from flexinfer import _nocython as cython  # type: ignore[no-redef]

from flexinfer._speedups import ChunkedBody, FramingError, LengthBody, head_end, response_head
from flexinfer.http.flow import JOIN_BELOW
from flexinfer.http.head import plain_connection
from flexinfer.http.upstream import (
    HOP_BY_HOP,
    UpstreamConnectError,
    UpstreamError,
    UpstreamResponse,
    UpstreamTimeout,
    serialize_request,
)
from flexinfer.settings import UpstreamSettings

if TYPE_CHECKING:
    from flexinfer._speedups import BodyFrame  # (a C type the build cimports: client.pxd)
    from flexinfer.http.tls import Link

__all__ = [
    "HOP_BY_HOP",
    "Pools",
    "UpstreamConnectError",
    "UpstreamError",
    "UpstreamPool",
    "UpstreamResponse",
    "UpstreamTimeout",
]


#: Methods whose request may be written again after a reused connection failed before the answer.
_REPLAYABLE = frozenset({"GET", "HEAD", "OPTIONS"})
#: a Content-Length this long or longer is left to the parser (which refuses one past 2**64 - 1)
_CL_MAX = 10**18


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


def _rx_clock() -> float:
    """The stamp of an upstream read (``_Conn.last_rx``): CLOCK_MONOTONIC seconds, the clock of
    asyncio's and uvloop's ``loop.time()`` (uvloop's in whole milliseconds of the coarse clock, so
    the two differ by a clock tick at most), read in C in the build (client.pxd; a ``loop.time()``
    call and a float object per read otherwise). The stream-idle check compares a stamp with this
    clock only (``_Conn._on_timer``) and arms the loop's timer with what is left."""
    if cython.compiled:
        return _monotonic_c()  # type: ignore[name-defined,no-any-return]  # noqa: F821 (client.pxd)
    return monotonic()


@cython.annotation_typing(False)  # the cpdef of client.pxd
def _framing(headers: list[tuple[bytes, bytes]]) -> tuple[int | None, bool]:
    """A final response's body framing from its (lower-cased) headers: its Content-Length (None
    if absent) and whether it is chunked; :class:`_ProtocolViolation` for a framing the proxy does
    not relay (a bad or repeated Content-Length, another coding, both headers)."""
    cl: int | None = None
    chunked = False
    name: bytes  # (typed: the build calls bytes' strip without a lookup by name)
    value: bytes
    for name, value in headers:
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
    return cl, chunked


class _Compiled:
    """An empty first base, so that the compiled build can make :class:`_Conn` an extension type
    (client.pxd) while it stays an ``asyncio.Protocol`` (a Python class) for asyncio and mypy."""

    __slots__ = ()


class _Conn(_Compiled, asyncio.Protocol):
    """One upstream connection: one exchange at a time. The :class:`~flexinfer.http.upstream.BodySource`
    of the responses it parses (``loop``, ``paused``, ``pause_reading``, ``resume_reading``,
    ``abandon``); it feeds them through their connection-side ``on_*`` methods only."""

    __slots__ = (
        "_time",
        "broken",
        "checked_out",
        "close_delimited",
        "cut",
        "expect_response",
        "framing",
        "hdr_bytes",
        "head_due",
        "head_only",
        "head_raw",
        "headers",
        "idle_since",
        "idle_watch",
        "in_head",
        "interim",
        "keep_alive",
        "last_rx",
        "loop",
        "lost",
        "msg_done",
        "on_head",
        "parser",
        "paused",
        "poller",
        "pool",
        "resp",
        "reused",
        "timer",
        "timer_at",
        "transport",
        "waiter",
    )

    def __init__(self, pool: UpstreamPool, loop: asyncio.AbstractEventLoop) -> None:
        self.pool = pool
        self.loop = loop
        # bound once (a call by name costs a lookup each time)
        self._time = loop.time
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
        #: the caller's head callback of the current exchange (see UpstreamPool.request)
        self.on_head: Callable[[UpstreamResponse], None] | None = None
        self.resp: UpstreamResponse | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.timer_at = 0.0  # when ``timer`` fires
        self.head_due = 0.0  # response-start deadline of the exchange (0: none)
        self.idle_watch = False  # a body is expected: silence longer than stream_idle_timeout fails it
        self.expect_response = False
        self.head_raw = 0  # bytes read of the exchange's response head (0: no byte of the response yet)
        self.in_head = False
        self.interim = False
        self.head_only = False
        self.msg_done = False
        self.keep_alive = False
        self.close_delimited = False
        self.headers: list[tuple[bytes, bytes]] = []
        self.hdr_bytes = 0
        self.poller: select.poll | None = None
        #: the body being read without httptools (chunked, or a Content-Length after a plain head),
        #: or None; in the build a BodyFrame slot: its feed per read is a C call (client.pxd)
        self.framing: BodyFrame | None = None
        self.cut = False  # httptools is being fed a head that ends the read it came in

    # ---- asyncio callbacks ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass
        sock = transport.get_extra_info("socket")
        if sock is not None:
            poller = select.poll()
            poller.register(sock.fileno(), select.POLLIN)
            self.poller = poller

    def pending_close(self) -> bool:
        """Whether the idle connection has something to read: a FIN, a RST or stray bytes the loop has
        not handled yet (one poll(2) with no wait). Such a connection is never reused."""
        poller = self.poller
        return poller is not None and bool(poller.poll(0))

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
            resp.on_complete()  # a close-delimited body ends at EOF
            return
        err = UpstreamError("upstream reset the connection" if exc is not None
                            else "upstream closed the connection",
                            reason="reset" if exc is not None else "closed", sent=True)
        self._deliver(err, allow_retry=True)

    def data_received(self, data: bytes) -> None:
        """One read. The read that starts a response head which arrived whole and is plainly
        written, with a Content-Length or chunked body, is read without httptools
        (:meth:`_take_head`): its body, from the rest of that read on, goes to a
        :class:`~flexinfer._speedups.LengthBody` or :class:`~flexinfer._speedups.ChunkedBody` (one
        call per read, its payload handed over as one piece). A chunked head that is not plain but
        arrives whole at the start of a read (``head_end``) is fed to httptools alone, and its body
        goes to the decoder likewise; any other response (a head in pieces, interim responses, bare
        LF line ends, another framing) is httptools' from end to end."""
        if not self.expect_response:
            # unsolicited bytes (extra data after a response, or from an idle pooled connection)
            self.broken = True
            self.transport.abort()
            return
        n = len(data)
        self.last_rx = _rx_clock()
        body = self.framing
        if body is None:
            failure: Exception | None = None
            if self.in_head:
                self.head_raw += n
                if self.head_raw == n and not self.head_only:  # the read that starts the head
                    end = self._take_head(data)
                    if end > 0:  # read without the parser: the rest of the read is the body's
                        data = data[end:] if end < n else b""
                        body = self.framing
                    else:
                        end = head_end(data)
                        if end > 0:
                            self.cut = True
                            try:
                                self.parser.feed_data(data if end == n else data[:end])
                            except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
                                failure = exc
                            self.cut = False
                            data = data[end:] if failure is None and end < n else b""
                            body = self.framing  # on_headers_complete made it: the rest is the decoder's
            if body is None or failure is not None:
                if data:
                    try:
                        self.parser.feed_data(data)
                    except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
                        failure = exc
                resp = self.resp
                if resp is not None:
                    resp.on_read_end()  # what this read carried goes to the client first, in one call
                if failure is not None and self._parse_failed(failure):
                    return
                if self.msg_done:
                    self._finish()
                elif self.in_head and self.head_raw > self.pool._head_max:
                    self._fail_protocol("response head too large")
                return
        # the body, without httptools: its payload to the response in one piece, the end as
        # httptools' on_message_complete would have it, then the same steps as above
        resp = self.resp
        try:
            payload = body.feed(data)
        except FramingError as exc:
            if resp is not None:
                resp.on_read_end()
            self._fail_protocol(f"malformed response: {exc}")
            return
        # (msg_done is False here: only the end of this body, below, sets it while the reader reads)
        if not body.done:
            if resp is not None:  # a stream's usual read: its payload and its end in one call
                resp.on_read_end(payload)
        else:
            if payload and resp is not None:
                resp.on_body(payload)
            self.framing = None
            if body.extra:
                self.broken = True  # bytes after a complete response: never reuse
            self.on_message_complete()
            if resp is not None:
                resp.on_read_end()
        if self.msg_done:
            self._finish()

    @cython.annotation_typing(False)  # the cpdef of client.pxd
    def _take_head(self, data: bytes) -> int:
        """Read the response head at the start of ``data`` without the parser when it came whole
        and is plainly written (headscan's ``response_head``: HTTP/1.1, a final status, plain field
        lines), with a Content-Length of at least one byte or a chunked body; its Connection
        header, if any, ``close`` or ``keep-alive``, no Upgrade; within the head limit and the
        framing rules (the parser path's :func:`_framing`). Answers where the head ends, having
        done what the parser path's on_headers_complete does; -1, having changed nothing, for any
        other head, which the parser then reads (and refuses where a rule is broken)."""
        got = response_head(data)
        if got is None:
            return -1
        end, status, headers = got
        size = 0
        conn: bytes | None = None
        name: bytes  # (typed: the build compares without lookups by name)
        value: bytes
        for name, value in headers:
            size += len(name) + len(value) + 4
            if name == b"connection":
                if conn is not None:
                    return -1  # two Connection fields: llhttp's reading of the tokens decides
                conn = value
            elif name == b"upgrade":
                return -1
        keep_alive = plain_connection(conn)
        if keep_alive < 0 or size > self.pool._head_max or status == 204 or status == 304:
            return -1
        try:
            cl, chunked = _framing(headers)
        except _ProtocolViolation:
            return -1
        if not chunked and (cl is None or cl == 0 or cl >= _CL_MAX):  # close-delimited, no body, huge: the parser's
            return -1
        self.headers = headers
        self.hdr_bytes = size
        self._head_in(status, cl, chunked, keep_alive == 1, True)
        return end

    def _parse_failed(self, exc: Exception) -> bool:
        """A parse failure: True when the exchange failed (False: bytes after a complete response,
        dropped, and the connection is never reused)."""
        if isinstance(exc, httptools.HttpParserCallbackError):
            ctx = exc.__context__
            if isinstance(ctx, _ProtocolViolation):
                self._fail_protocol(str(ctx))
                return True
            if not self.msg_done:
                self._fail_protocol("response handling failed")
                return True
        elif isinstance(exc, httptools.HttpParserUpgrade):
            self._fail_protocol("unrequested protocol switch")
            return True
        elif not self.msg_done:
            self._fail_protocol(f"malformed response: {exc}")
            return True
        self.broken = True  # a second message or bytes after a complete response: never reuse
        return False

    # ---- parser callbacks -------------------------------------------------------------------
    def on_message_begin(self) -> None:
        if self.msg_done:
            raise _ExtraMessage()
        self.in_head = True
        self.headers = []
        self.hdr_bytes = 0

    def on_header(self, name: bytes, value: bytes) -> None:
        self.hdr_bytes += len(name) + len(value) + 4
        if self.hdr_bytes > self.pool._head_max:
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
        cl, chunked = _framing(self.headers)
        # (cut: the head ends the bytes httptools got, so a chunked body is ours)
        self._head_in(status, cl, chunked, p.should_keep_alive(), self.cut and chunked)

    @cython.annotation_typing(False)  # the cpdef of client.pxd
    def _head_in(self, status: int, cl: int | None, chunked: bool, keep_alive: bool, own_body: bool) -> None:
        """A final response's head is in (read by the parser or by :meth:`_take_head`): the
        response, its body's reader when ``own_body`` (the body is read without httptools), the
        timers, and the caller's head callback and waiter."""
        self.in_head = False
        self.keep_alive = keep_alive
        no_body = self.head_only or status == 204 or status == 304
        self.close_delimited = not no_body and cl is None and not chunked
        if self.close_delimited:
            self.keep_alive = False
        resp = UpstreamResponse(self, status, self.headers, cl, chunked, self.pool._read_high)
        self.resp = resp
        if own_body and not no_body:
            if chunked:
                reader: BodyFrame = ChunkedBody(self.pool._head_max)
            else:
                reader = LengthBody(cl)  # type: ignore[arg-type]  # (not chunked: a Content-Length)
            self.framing = reader
            if self.cut:
                # httptools would wait inside this body: the next exchange gets a fresh parser (the
                # one running this callback finishes its feed, which ends with the head, and is dropped)
                self.parser = httptools.HttpResponseParser(self)
        self.head_due = 0.0
        waiter = self.waiter
        self.waiter = None
        if self.head_only:
            self.broken = True  # the parser would wait for a body that never comes
            self.msg_done = True
            resp.on_complete()
        elif not no_body and cl != 0:
            idle = self.pool._stream_idle
            if idle > 0:
                self.idle_watch = True
                self._arm(self.last_rx + idle)  # (the read clock as loop time: see _rx_clock)
        if waiter is not None and not waiter.done():
            on_head = self.on_head
            if on_head is not None:
                self.on_head = None
                try:
                    on_head(resp)
                except Exception as exc:  # the caller's own failure: raised where it awaits the head
                    resp.close()
                    waiter.set_exception(exc)
                    return
            waiter.set_result(resp)

    def on_body(self, piece: bytes) -> None:
        resp = self.resp
        if resp is not None and not self.msg_done:
            resp.on_body(piece)

    def on_message_complete(self) -> None:
        if self.interim:
            self.interim = False
            return
        if self.msg_done:
            return
        self.msg_done = True
        resp = self.resp
        if resp is not None:
            resp.on_complete()

    # ---- exchange -----------------------------------------------------------------------------
    @cython.annotation_typing(False)  # the cpdef of client.pxd
    def exchange(self, head: bytes, body: bytes, timeout: float, head_only: bool,
                 on_head: Callable[[UpstreamResponse], None] | None = None) -> asyncio.Future[UpstreamResponse]:
        """Send one request; the future resolves with the response once its head is in. A plain
        call, not a coroutine (one coroutine less per request): the caller awaits the future and
        calls :meth:`abandon` when it is cancelled meanwhile."""
        if self.lost or self.transport.is_closing():
            raise _NotSent()
        waiter: asyncio.Future[UpstreamResponse] = self.loop.create_future()
        self.waiter = waiter
        self.on_head = on_head
        self.resp = None
        self.head_raw = 0
        self.in_head = True
        self.interim = False
        self.msg_done = False
        self.head_only = head_only
        self.close_delimited = False
        self.keep_alive = False
        self.idle_watch = False
        self.expect_response = True
        if body:
            self.transport.writelines((head, body))
        else:
            self.transport.write(head)
        if timeout > 0:
            self.head_due = due = self._time() + timeout
            self._arm(due)
        else:
            self.head_due = 0.0
        return waiter

    def _deliver(self, err: UpstreamError, *, allow_retry: bool = False) -> None:
        """Hand an error to whoever waits: the head waiter or the response body."""
        waiter = self.waiter
        self.waiter = None
        self.on_head = None
        resp = self.resp
        self.resp = None
        if waiter is not None and not waiter.done():
            # head_raw counts from the response's first byte (the head comes first): 0, nothing arrived
            if allow_retry and self.reused and self.head_raw == 0:
                waiter.set_exception(_ReuseFailed(err))
            else:
                waiter.set_exception(err)
        elif resp is not None:
            resp.on_error(err)

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

    @cython.annotation_typing(False)  # the cpdef of client.pxd
    def _arm(self, due: float) -> None:
        """Make sure the timer fires at ``due`` or earlier (an earlier firing re-arms it)."""
        t = self.timer
        if t is not None:
            if self.timer_at <= due:
                return
            t.cancel()
        self.timer_at = due
        self.timer = self.loop.call_at(due, self._on_timer)

    def _on_timer(self) -> None:
        """The deadline of the current exchange, if any: failed when passed, else re-armed."""
        self.timer = None
        if not self.expect_response or self.lost:
            return
        now = self.loop.time()
        waiter = self.waiter
        if waiter is not None:  # waiting for the response head
            due = self.head_due
            if due <= 0.0 or waiter.done():
                return
            if now >= due:
                self._fail(UpstreamTimeout("no response from upstream in time", reason="response_timeout",
                                           sent=True))
                return
        elif self.idle_watch and not self.msg_done:
            left = self.last_rx + self.pool._stream_idle - _rx_clock()  # (the read clock's own terms)
            if left <= 0.0:
                self._fail(UpstreamTimeout("upstream stream idle too long", reason="idle_timeout", sent=True))
                return
            due = now + left
        else:
            return
        self._arm(due)

    def _cancel_timer(self) -> None:
        t = self.timer
        if t is not None:
            self.timer = None
            t.cancel()

    def _finish(self) -> None:
        """The response is complete: back to the pool (its timer, if any, stays: it finds nothing to
        do when it fires, or watches the next exchange), or closed."""
        self.expect_response = False
        self.waiter = None
        self.on_head = None
        self.resp = None
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
        self.on_head = None
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
    """Keep-alive pool for one backend (host, port); over TLS when ``ssl_context`` is given."""

    __slots__ = (
        "_check_after",
        "_closed",
        "_head_max",
        "_host_line",
        "_idle",
        "_max_idle",
        "_name",
        "_pool_idle",
        "_read_high",
        "_response_timeout",
        "_settings",
        "_sni",
        "_ssl",
        "_stream_idle",
        "_sweep_handle",
        "active",
        "host",
        "port",
    )

    def __init__(self, host: str, port: int, settings: UpstreamSettings,
                 ssl_context: ssl.SSLContext | None = None, server_hostname: str | None = None) -> None:
        self.host = host
        self.port = port
        self._settings = settings
        # the settings read per exchange, copied once (frozen): C fields in the build, where each read
        # of the settings object is a lookup by name (about 100 instructions)
        self._response_timeout = settings.response_timeout
        self._read_high = settings.read_buffer_high
        self._head_max = settings.max_response_header_bytes
        self._stream_idle = settings.stream_idle_timeout
        self._pool_idle = settings.pool_idle_timeout
        self._check_after = settings.pool_check_after
        self._max_idle = settings.pool_max_idle
        self._idle: list[_Conn] = []
        self.active = 0
        hp = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self._name = hp
        self._host_line = b"host: " + hp.encode("idna") + b"\r\n"
        self._sweep_handle: asyncio.TimerHandle | None = None
        self._closed = False
        self._ssl = ssl_context
        self._sni = (server_hostname or host) if ssl_context is not None else None
        if ssl_context is not None:
            self._name = "https://" + hp
            if port == 443:
                self._host_line = b"host: " + (f"[{host}]" if ":" in host else host).encode("idna") + b"\r\n"

    @property
    def idle(self) -> int:
        return len(self._idle)

    def __repr__(self) -> str:
        return f"<UpstreamPool {self._name} idle={self.idle} active={self.active}>"

    async def request(self, method: str, path: str, headers: list[tuple[bytes, bytes]], body: bytes,
                      *, response_timeout: float | None = None,
                      on_head: Callable[[UpstreamResponse], None] | None = None) -> UpstreamResponse:
        """Send one request and return once the response head is in.

        ``on_head(resp)``: called from the connection's read callback as soon as the (final) response
        head is parsed, before the body pieces of that same read and before the awaiting task
        resumes (a loop turn later): a relay can start there (``resp.start_relay``) so the client
        gets the head and the first body bytes in the turn they arrived. An exception it raises
        closes the response and is raised here."""
        head = serialize_request(method, path, headers, body, self._host_line)
        if body and len(body) < JOIN_BELOW:
            head, body = head + body, b""
        timeout = self._response_timeout if response_timeout is None else response_timeout
        head_only = method == "HEAD"
        retried = False
        # no asyncio.get_running_loop() when a pooled connection is there: before Python 3.12 it
        # costs a getpid() syscall per call
        conn: _Conn | None = self._take_idle()  # (typed: the build calls exchange in C)
        if conn is None:
            conn = await self._connect(asyncio.get_running_loop(), sent=False)
        while True:
            try:
                waiter = conn.exchange(head, body, timeout, head_only, on_head)
                try:
                    return await waiter
                except asyncio.CancelledError:
                    conn.abandon()
                    raise
            except _NotSent:
                conn = self._take_idle() or await self._connect(conn.loop, sent=retried)
            except _ReuseFailed as exc:
                if retried:
                    raise exc.error from None
                if method not in _REPLAYABLE:
                    raise UpstreamError(
                        f"{self._name} closed a reused connection after the request was written and "
                        f"before answering; a {method} is not sent twice", reason="not_replayed",
                        sent=True) from None
                retried = True
                conn = await self._connect(conn.loop, sent=True)

    def _take_idle(self) -> _Conn | None:
        idle = self._idle
        if not idle:
            return None
        now = idle[-1]._time()
        limit = self._pool_idle
        check_after = self._check_after
        while idle:
            conn: _Conn = idle.pop()
            if conn.lost or conn.transport.is_closing():
                continue
            idle_for = now - conn.idle_since
            if idle_for >= check_after and conn.pending_close():
                conn.broken = True
                conn.transport.abort()
                continue
            if idle_for >= limit:
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

    # (annotations off in the build: Cython 3.3 typed the coroutine's maker as returning a _Conn,
    # and gcc warned of the pointer it returns; a new connection is not per request)
    @cython.annotation_typing(False)
    async def _connect(self, loop: asyncio.AbstractEventLoop, *, sent: bool) -> _Conn:
        if self._closed:
            raise UpstreamError("pool closed", reason="closed", sent=sent)
        try:
            async with asyncio.timeout(self._settings.connect_timeout):
                _, proto = await loop.create_connection(lambda: _Conn(self, loop), self.host, self.port,
                                                        ssl=self._ssl, server_hostname=self._sni)
        except TimeoutError:
            err: UpstreamError = UpstreamConnectError(f"connect to {self._name} timed out",
                                                      reason="connect_timeout")
        except ssl.SSLError as exc:  # handshake: bad certificate, wrong name, no common protocol
            err = UpstreamConnectError(f"TLS handshake with {self._name} failed: "
                                       f"{getattr(exc, 'verify_message', None) or exc.reason or exc}",
                                       reason="tls_handshake")
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
        if self._closed or len(self._idle) >= self._max_idle:
            conn.transport.close()
            return
        conn.resume_reading()
        conn.idle_since = conn._time()
        self._idle.append(conn)
        if self._sweep_handle is None:
            self._sweep_handle = conn.loop.call_later(self._pool_idle, self._sweep)

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
        limit = self._pool_idle
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
    """(host, port) -> UpstreamPool; (host, port, link) -> a TLS and/or keyed pool."""

    def __init__(self, settings: UpstreamSettings) -> None:
        self._settings = settings
        self._pools: dict[tuple[str, int], UpstreamPool] = {}
        self._linked: dict[tuple[str, int, Link], UpstreamPool] = {}

    def get(self, host: str, port: int) -> UpstreamPool:
        pool = self._pools.get((host, port))
        if pool is None:
            pool = self._pools[(host, port)] = UpstreamPool(host, port, self._settings)
        return pool

    def get_linked(self, host: str, port: int, link: Link) -> UpstreamPool:
        """The pool of an endpoint with a :class:`~flexinfer.http.tls.Link` (https and/or a peer's
        key); raises ``UpstreamConnectError`` (``tls_config``) when its ``ca_file`` cannot be read."""
        key = (host, port, link)
        pool = self._linked.get(key)
        if pool is None:
            from flexinfer.http.tls import linked_pool  # once per pool: off the plain path

            pool = self._linked[key] = linked_pool(host, port, self._settings, link)
        return pool

    def __iter__(self) -> Iterator[UpstreamPool]:
        return iter([*self._pools.values(), *self._linked.values()])

    async def close_all(self) -> None:
        pools = [*self._pools.values(), *self._linked.values()]
        self._pools.clear()
        self._linked.clear()
        for pool in pools:
            await pool.close()
