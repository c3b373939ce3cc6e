"""The message side of the upstream (backend) client: error types, canonical request serialization
and :class:`UpstreamResponse`, a response head with its body as it arrives.

Owns: :func:`serialize_request` (request line, end-to-end headers, Host and Content-Length added
here; hop-by-hop headers and those named in ``Connection`` dropped; never raw client bytes; names,
methods and targets checked once and remembered in bounded caches), the :class:`UpstreamError`
tree, and the consumer side of a response body: ``read``, ``read_all`` and
:meth:`UpstreamResponse.relay`, which hands the body pieces of each upstream read straight to the
client writer from the connection's ``data_received`` (one writer call per read: ``write`` for a
lone piece, else ``writelines``, the terminating chunk included when the read completes the body,
also when that read carries no body bytes)
and pauses the upstream socket while the client is slow; :meth:`UpstreamResponse.start_relay` starts
that relay from the head callback already, so the first body bytes leave in the read of the head;
an optional ``tap`` (a :class:`BodyTap`) sees each read's body bytes before they are relayed and may
replace them, and learns that the body is complete before the write that ends the response.
Must not: open, pool or time out connections, or parse bytes (client.py does, and feeds a response
through its connection-side methods ``on_body`` / ``on_read_end`` / ``on_complete`` / ``on_error``).
It knows its connection only as a :class:`BodySource` (pause, resume, abandon) and imports nothing
of client.py: the dependency is one-way. Import these names from ``flexinfer.http.client``, which
re-exports them.
"""

from __future__ import annotations

import asyncio
import re
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

try:
    import cython
except ImportError:  # no Cython here: its decorators do nothing in pure Python
    from flexinfer import _nocython as cython  # type: ignore[no-redef]

from flexinfer._speedups import head_block, head_lines_ok
from flexinfer.http.flow import ClientGone, FlowControl

if TYPE_CHECKING:
    from flexinfer.http.request import ResponseWriter

__all__ = [
    "HOP_BY_HOP",
    "BodySource",
    "BodyTap",
    "UpstreamConnectError",
    "UpstreamError",
    "UpstreamResponse",
    "UpstreamTimeout",
    "serialize_request",
]

#: Dropped from forwarded requests (plus every header named in ``Connection``).
HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"proxy-connection", b"te", b"trailer",
                        b"transfer-encoding", b"upgrade"})
# set by the client itself (Host, Content-Length) or meaningless once the body is buffered (Expect)
_CLIENT_SET = frozenset({b"host", b"content-length", b"expect"})
#: head_block's rules for a request head: left out (True), or the loop's to decide (Connection
#: names more headers to leave out)
_RULES = {**dict.fromkeys(HOP_BY_HOP | _CLIENT_SET, True), b"connection": False}
_NO_BODY_METHODS = frozenset({"GET", "HEAD", "DELETE", "OPTIONS", "TRACE"})
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9a-zA-Z]+")
_TARGET = re.compile(rb"[!-~]+")
#: raw header name -> the lower-case name to send, _DROP (hop-by-hop or set by the client) or
#: _BAD (not a token); bounded like the caches below
_names: dict[bytes, bytes] = {}
_DROP = b"\x00drop"
_BAD = b"\x00bad"
#: methods and request targets already checked, str -> ASCII bytes (bounded like _valid_names)
_valid_methods: dict[str, bytes] = {}
_valid_targets: dict[str, bytes] = {}
_VALID_MAX = 4096


@cython.annotation_typing(False)  # the cpdef of upstream.pxd
def _checked(value: str, cache: dict[str, bytes], pattern: re.Pattern[bytes]) -> bytes:
    """``value`` as ASCII bytes once it fully matches ``pattern`` (ValueError otherwise), cached."""
    raw = cache.get(value)
    if raw is not None:
        return raw
    try:
        raw = value.encode("ascii")
    except UnicodeEncodeError:
        raise ValueError("method and path must be ASCII") from None
    if not pattern.fullmatch(raw):
        raise ValueError("invalid method or request target")
    if len(cache) < _VALID_MAX:
        cache[value] = raw
    return raw


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


@cython.annotation_typing(False)  # the cpdef of upstream.pxd
def serialize_request(method: str, path: str, headers: list[tuple[bytes, bytes]], body: bytes,
                      host_line: bytes) -> bytes:
    """Canonical request head: request line, end-to-end headers (names lower-cased), Host, then
    Content-Length (always with a body, and for methods that carry one). ValueError on a method,
    target, name or value that would break the framing."""
    mb = _checked(method, _valid_methods, _TOKEN)
    pb = _checked(path, _valid_targets, _TARGET)
    lead = (mb, b" ", pb, b" HTTP/1.1\r\n")
    if body or method not in _NO_BODY_METHODS:
        tail: tuple[bytes, ...] = (host_line, b"content-length: %d\r\n\r\n" % len(body))
        lines = 4
    else:
        tail = (host_line, b"\r\n")
        lines = 3
    # one pass in C for the common case (lower-case token names, clean values, no Connection);
    # None: the loop below decides (and raises what it finds)
    head = head_block(lead, headers, _RULES, tail, lines)
    if head is not None:
        return head
    parts = list(lead)
    names = _names
    odd: list[tuple[bytes, bytes, bytes]] | None = None  # Connection headers and invalid names: rare
    for name, value in headers:
        lname = names.get(name)
        if lname is None:
            lname = _classify(name)
        if lname is _DROP or lname is _BAD:
            if lname is _BAD or name.lower() == b"connection":
                if odd is None:
                    odd = []
                odd.append((lname, name, value))
            continue
        parts += (lname, b": ", value, b"\r\n")
    if odd is not None:
        parts = _apply_connection(parts, odd)
    lines += len(parts) // 4 - 1
    parts += tail
    head = b"".join(parts)
    if not head_lines_ok(head, lines):
        raise ValueError("header value contains CR, LF or NUL")
    return head


def _classify(name: bytes) -> bytes:
    """The lower-case name to send, _DROP or _BAD; remembered (bounded)."""
    lname = name.lower()
    if lname in HOP_BY_HOP or lname in _CLIENT_SET:
        out = _DROP
    elif _TOKEN.fullmatch(lname):
        out = lname
    else:
        out = _BAD
    if len(_names) < _VALID_MAX:
        _names[name] = out
    return out


def _apply_connection(parts: list[bytes], odd: list[tuple[bytes, bytes, bytes]]) -> list[bytes]:
    """Drop the headers named in Connection from ``parts`` (request line + 4 parts per header);
    ValueError for an invalid name that Connection does not name."""
    named = {tok.strip().lower() for kind, _, value in odd if kind is _DROP for tok in value.split(b",")}
    for kind, name, _ in odd:
        if kind is _BAD and name.lower() not in named:
            raise ValueError(f"invalid header name {name[:64]!r}")
    if not named:
        return parts
    kept = parts[:4]
    for i in range(4, len(parts), 4):
        if parts[i] not in named:
            kept += parts[i:i + 4]
    return kept


class BodySource(Protocol):
    """What an :class:`UpstreamResponse` uses of the connection its body arrives on (client.py's
    connection implements it)."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...
    @property
    def paused(self) -> bool:
        """Reading is paused (the body is consumed slower than it arrives)."""
    def pause_reading(self) -> None: ...
    def resume_reading(self) -> None: ...
    def abandon(self) -> None:
        """The consumer gave up: close at once, never reuse."""


class BodyTap:
    """The observer of a relayed body (``UpstreamResponse.tap``): :meth:`observe` gets the body
    bytes of each upstream read as one buffer, before they are written, and returns None (write
    them as they are) or the pieces to write instead. This base observes nothing; the proxy's usage
    tap (:class:`flexinfer.proxy.usage.UsageTap`) is one. A class and not any callable so that the
    build calls it as a C method once per upstream read (upstream.pxd: a ``cpdef`` on a typed slot).
    One buffer and not a list of pieces: a stream's read is one piece (the chunked decoder's
    payload), and a list made for it cost about 250 instructions per read."""

    __slots__ = ()

    @cython.annotation_typing(False)  # the cpdef of upstream.pxd
    def observe(self, buf: bytes, end: bool) -> list[bytes] | None:
        """The body bytes of one upstream read, not empty (``end``: the body ends with them)."""
        return None

    def complete(self) -> None:
        """The whole body is in and observed, and its last bytes are about to be written: called
        before the write that ends the client's response (once or more; act once). Not called for
        a body that fails or is abandoned."""


class UpstreamResponse:
    """A response head from a backend, and its body as it arrives."""

    __slots__ = ("_attached", "_batch", "_buffered", "_client_gone", "_conn", "_done_arg", "_done_cb", "_eof", "_error",
                 "_high", "_loop", "_pieces", "_relayed", "_sink", "_sink_error", "_waiter", "chunked",
                 "content_length", "headers", "status", "tap")

    def __init__(self, conn: BodySource, status: int, headers: list[tuple[bytes, bytes]],
                 content_length: int | None, chunked: bool, read_buffer_high: int) -> None:
        self.status = status
        self.headers = headers
        self.content_length = content_length
        self.chunked = chunked
        self._conn: BodySource | None = conn
        self._loop = conn.loop
        self._high = read_buffer_high  # buffered body bytes before reading pauses
        self._pieces: deque[bytes] = deque()
        self._buffered = 0
        self._eof = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._sink: ResponseWriter | None = None
        self._attached = False  # start_relay() set the sink; relay() not yet called
        self._batch: list[bytes] | None = None  # pieces of the current upstream read, for the sink
        self._sink_error: BaseException | None = None
        self._relayed = 0
        self._client_gone = False
        self._done_cb: Callable[[Any], None] | None = None
        self._done_arg: Any = None
        #: optional observer of the relayed body: ``tap.observe(buf, end)`` with the body bytes of each
        #: upstream read, before the write (``end``: the body ends with them); it returns None or the
        #: pieces to write instead (the proxy's usage tap strips one event this way); None (the
        #: default) costs one check per read
        self.tap: BodyTap | None = None

    def __repr__(self) -> str:
        return f"<UpstreamResponse {self.status} cl={self.content_length} chunked={self.chunked}>"

    # ---- connection side: fed by the connection the body arrives on ---------------------------
    def _wake(self) -> None:
        w = self._waiter
        if w is not None:
            self._waiter = None
            if not w.done():
                w.set_result(None)

    def on_body(self, piece: bytes) -> None:
        """A body piece: buffered for read() while nobody relays, else collected for the sink and
        handed over by :meth:`on_read_end` once the upstream read that carried it is parsed."""
        if self._sink is None:
            self._pieces.append(piece)
            self._buffered += len(piece)
            if self._buffered > self._high:
                conn = self._conn
                if conn is not None:
                    conn.pause_reading()
            self._wake()
            return
        batch = self._batch
        if batch is None:
            self._batch = [piece]
        else:
            batch.append(piece)

    def on_read_end(self, piece: bytes = b"") -> None:
        """One upstream read is parsed: hand its body bytes to the sink in one call; when the read
        completed the body, the response is ended in the same call. ``piece``: body bytes of the
        read not given to :meth:`on_body` (the chunked decoder's payload: one call per read)."""
        batch = self._batch
        if batch is not None:  # pieces on_body collected for the sink (httptools' body callbacks)
            self._batch = None
            if piece:
                batch.append(piece)
            piece = batch[0] if len(batch) == 1 else b"".join(batch)
        elif not piece and (not self._eof or self._sink is None or self._sink_error is not None):
            return
        # (an empty piece past here: the read completed the body with no body bytes, a chunked body's
        # last chunk alone as uvicorn writes it, seen with llama-cpp-python's server; the client's
        # response ends in this read too, below, not a loop turn later in the task's _end_relay)
        sink = self._sink
        if sink is None:  # nobody relays (a batch is only collected while somebody does): for read()
            self.on_body(piece)
            return
        end = self._eof
        out = None
        if self.tap is not None:  # once per read (C method calls in the build)
            if piece:
                out = self._feed(piece, end)
            if end:
                self._tap_complete()
        try:
            if out is None and not end:
                sink.write(piece)  # the common case of a stream: one read, one client write
                self._relayed += len(piece)
            else:
                if out is None:
                    out = [piece]
                if out or end:
                    sink.writelines(out, end=end)
                for piece in out:
                    self._relayed += len(piece)
        except Exception as exc:  # e.g. more bytes than the Content-Length the caller declared
            self._sink_error = exc
            self.close()
            self._wake()
            return
        if not end and sink.flow.write_paused:
            conn = self._conn
            if conn is not None:
                conn.pause_reading()

    def on_complete(self) -> None:
        """The whole body has arrived (the when_complete callback runs here)."""
        self._eof = True
        self._conn = None
        cb = self._done_cb
        if cb is not None:  # before the relay's last write: the caller's bookkeeping is done first
            self._done_cb = None
            cb(self._done_arg)
        self._wake()

    def when_complete(self, cb: Callable[[Any], None], arg: Any) -> None:
        """Call ``cb(arg)`` once, as soon as the whole body has arrived from the backend (at once if
        it already has), before the relay hands the last bytes to the client. Not called when the
        body fails; :meth:`complete_notified` tells the caller whether it ran."""
        if self._eof:
            cb(arg)
        else:
            self._done_cb = cb
            self._done_arg = arg

    @property
    def complete_notified(self) -> bool:
        """True once the ``when_complete`` callback has run (or the body was complete when it was set)."""
        return self._eof and self._done_cb is None

    def on_error(self, exc: BaseException) -> None:
        """The body failed: read() and relay() raise ``exc``."""
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
        """Copy the body to ``writer`` as it arrives, then end it; returns bytes relayed.

        The pieces buffered before the call, then those of each upstream read, go to the writer in
        one call (``write`` for a lone piece, else ``writelines``) from the upstream protocol's
        ``data_received`` (no await per piece, no piece held for a later read); the call that
        carries the body's last bytes ends the response too. While the client's write buffer is over its high-water mark the upstream
        socket is paused. UpstreamError: the upstream failed (the writer is left as it is, so the
        caller can add an SSE error event and abort). ClientGone: the client went away (the
        upstream connection is closed at once)."""
        if self._sink is writer and self._attached:  # start_relay() ran at the head: only the wait is left
            self._attached = False
            return await self._relay_rest(writer, writer.flow, None)
        if not writer.started:
            raise RuntimeError("start() the response before relay()")
        if self._sink is not None:
            raise RuntimeError("relay() already running")
        buffered = list(self._pieces)
        self._pieces.clear()
        self._buffered = 0
        if self.tap is not None and buffered:  # the pieces read before the relay: one buffer for the tap
            out = self._feed(b"".join(buffered), self._eof and self._error is None)
            if out is not None:
                buffered = out
        n = 0
        for piece in buffered:
            n += len(piece)
        if self._error is not None:
            if buffered:
                writer.writelines(buffered)
            raise self._error
        if writer.disconnected:
            self.close()
            raise ClientGone()
        if self._eof:
            self._tap_complete()
            writer.writelines(buffered, end=True)
            return n
        if buffered:
            writer.writelines(buffered)
        conn = self._conn
        assert conn is not None
        flow = writer.flow
        self._relayed = n
        self._sink = writer
        writer.on_disconnect(self._on_client_gone)
        flow.set_listener(self._on_client_resumed)
        return await self._relay_rest(writer, flow, conn)

    @cython.annotation_typing(False)  # the cpdef of upstream.pxd
    def relay_done(self, writer: ResponseWriter) -> int:
        """:meth:`relay` without a coroutine where nothing is left to wait for: :meth:`start_relay`
        ran at the head and the whole body is in (a plain response's usual case: its body came in
        the read of its head). The bytes relayed, the writer ended; -1 (nothing done): ``await
        relay()`` as always. Raises what :meth:`relay` would."""
        if self._sink is not writer or not self._attached or not self._eof:
            return -1
        self._attached = False
        return self._end_relay(writer, writer.flow)

    def start_relay(self, writer: ResponseWriter) -> bool:
        """Start relaying to the started ``writer`` at once, from the head callback
        (``UpstreamPool.request(on_head=...)``), so the body pieces of the read that carried the head
        reach the client in that same read, with no loop turn in between; :meth:`relay` (called
        next, as always) then only waits for the end. False (nothing done): not a fresh response
        (a body piece, its end or an error is already in), or the writer is not started or gone."""
        if (self._sink is not None or self._pieces or self._eof or self._error is not None
                or self._conn is None or not writer.started or writer.disconnected):
            return False
        flow: FlowControl = writer.flow
        self._relayed = 0
        self._sink = writer
        self._attached = True
        writer.on_disconnect(self._on_client_gone)
        flow.set_listener(self._on_client_resumed)
        if flow.write_paused:
            self._conn.pause_reading()
        else:
            self._conn.resume_reading()
        return True

    async def _relay_rest(self, writer: ResponseWriter, flow: FlowControl, conn: BodySource | None) -> int:
        """relay() once the sink is set: wait for the end (or the failure), then end the writer."""
        try:
            if conn is not None:
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
            self._sink = None
            flow.set_listener(None)
            self.close()
            raise
        return self._end_relay(writer, flow)

    @cython.annotation_typing(False)  # the cpdef of upstream.pxd
    def _end_relay(self, writer: ResponseWriter, flow: FlowControl) -> int:
        """The end of a relay whose body is all in (:meth:`_relay_rest` after its wait,
        :meth:`relay_done` at once): the sink let go, then the writer ended, or what a write of
        the relay refused raised (the response closed)."""
        self._sink = None
        flow.set_listener(None)
        err = self._sink_error
        if err is not None:
            self.close()
            raise err
        if not writer.finished:  # (a read that completed the body ended the writer, the tap told first)
            self._tap_complete()
            writer.end()
        return self._relayed

    @cython.annotation_typing(False)  # the cpdef of upstream.pxd
    def _feed(self, buf: bytes, end: bool) -> list[bytes] | None:
        """Hand a read's body bytes about to be relayed to the tap: its answer (None: write them as
        they are). A tap that fails is dropped (the relay goes on with the bytes as they are)."""
        tap = self.tap
        try:
            return tap.observe(buf, end)  # type: ignore[union-attr]
        except Exception:
            self.tap = None
            return None

    def _tap_complete(self) -> None:
        """Tell the tap the body is complete, before the write that ends the response (a tap that
        fails is dropped, as in :meth:`_feed`)."""
        tap = self.tap
        if tap is not None:
            try:
                tap.complete()
            except Exception:
                self.tap = None

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
