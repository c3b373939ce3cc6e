"""The per-request objects of the server side: :class:`Request` (what the handler reads) and
:class:`ResponseWriter` (how it answers: whole responses, streams, errors, drain, disconnects).

Owns: response heads (status line from the prebuilt table, the cached Date, the caller's headers
minus the framing ones the core owns, framing, Connection), chunked framing of body pieces, the
Content-Length bookkeeping of streamed bodies, the on_disconnect callbacks and the cancelling of
the handler's task when the client goes away.

Syscalls: a head leaves together with the first body bytes written after it. A Content-Length head
waits for them (or end()); a streamed head (chunked or close-delimited) waits at most until the
end of the current event-loop iteration (``call_soon``), so a stream's head is never held across a
wait. :meth:`ResponseWriter.writelines` sends pieces that are ready together (and, with ``end``,
the terminating chunk) in one transport call.
Must not: parse requests, hold the state of a body being read, or decide what comes next on the
connection (protocol.py does). The writer knows its connection only as a :class:`Connection`
(``transport``, ``flow``, ``loop``, ``draining``; it reports back through ``response_done`` /
``abort_connection``); the connection uses the writer's connection side (``keep_alive``, ``task``,
``client_lost()``) besides what handlers use. Nothing here imports protocol.py, which re-exports
both classes.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

try:
    import cython
except ImportError:  # no Cython here: its decorators do nothing in pure Python
    from flexinfer import _nocython as cython  # type: ignore[no-redef]

from flexinfer._speedups import frame_chunk, head_block, head_lines_ok
from flexinfer.errors import FlexInferError
from flexinfer.http.flow import JOIN_BELOW, ClientGone, FlowControl
from flexinfer.http.responses import (
    CHUNKED,
    CONNECTION_CLOSE,
    CONNECTION_KEEP_ALIVE,
    DATE,
    LAST_CHUNK,
    status_line,
)

if TYPE_CHECKING:
    from flexinfer.http.task import RequestTask

__all__ = ["Connection", "Request", "ResponseWriter"]

log = logging.getLogger("flexinfer.http")

#: flow.JOIN_BELOW as a C integer in the build (request.pxd): the comparison per relayed read is C
_JOIN_BELOW = JOIN_BELOW
# headers the core adds to responses itself; dropped from the handler's list
_FRAMING = frozenset({b"content-length", b"transfer-encoding", b"connection", b"keep-alive", b"date"})
_FRAMING_RULES = dict.fromkeys(_FRAMING, True)  # head_block: left out of a response head


def _framed(prefix: bytes, data: bytes) -> bytes:
    """``prefix`` and the chunk carrying ``data``: :func:`flexinfer._speedups.frame_chunk`, called in
    C in the build (request.pxd cimports chunkframe_c's), once per relayed read of a chunked stream."""
    if cython.compiled:
        return _frame_chunk_c(prefix, data)  # type: ignore[name-defined,no-any-return]  # noqa: F821 (request.pxd)
    return frame_chunk(prefix, data)


class Connection(Protocol):
    """What a :class:`ResponseWriter` uses of its connection (``HttpProtocol`` implements it)."""

    @property
    def transport(self) -> asyncio.Transport: ...
    @property
    def flow(self) -> FlowControl: ...
    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...
    @property
    def draining(self) -> bool:
        """The server drains: the response closes the connection."""
    def response_done(self, w: ResponseWriter) -> None:
        """``w`` is complete: go on with the next request, or close (as ``w.keep_alive`` says)."""
    def abort_connection(self) -> None:
        """Close at once, unfinished response included (no terminating chunk)."""


class Request:
    """One request as the handler sees it (see docs/http-core-contract.md)."""

    __slots__ = ("body", "content_type", "ctx", "headers", "keep_alive", "method", "path", "peer", "query",
                 "target", "version")

    def __init__(self, method: str, target: bytes, path: str, query: str, version: str,
                 headers: list[tuple[bytes, bytes]], keep_alive: bool, peer: str,
                 content_type: bytes) -> None:
        self.method = method
        self.target = target
        self.path = path
        self.query = query
        self.version = version
        self.headers = headers
        self.body = b""
        self.keep_alive = keep_alive
        self.peer = peer
        self.content_type = content_type
        self.ctx: object | None = None

    @cython.annotation_typing(False)  # the cpdef of request.pxd
    def get(self, name: bytes, default: bytes | None = None) -> bytes | None:
        """First value of header ``name`` (lower-case), else ``default``."""
        for k, v in self.headers:
            if k == name:
                return v
        return default

    def __repr__(self) -> str:
        return f"<Request {self.method} {self.target[:200]!r} from {self.peer}>"


class ResponseWriter:
    """Writes one response; responses of a connection leave in request order."""

    __slots__ = ("_callbacks", "_cancel_task", "_chunked", "_close_delimited", "_head_only", "_pending_head",
                 "_proto", "_remaining", "_transport", "_v10", "client_abort", "disconnected", "finished", "flow",
                 "keep_alive", "req", "sent", "started", "status", "task")

    def __init__(self, proto: Connection, req: Request) -> None:
        self._proto = proto
        self.req = req  # the request this answers (the connection's log names it)
        self._transport = proto.transport
        #: the connection's flow control (an upstream relay pauses on it)
        self.flow = proto.flow
        #: connection side: whether the connection goes on after this response (the core clears it
        #: to close after an internal error; a draining server or a 1.0 stream clears it too)
        self.keep_alive = req.keep_alive
        self._v10 = req.version == "1.0"
        self._head_only = req.method == "HEAD"
        self._chunked = False
        self._close_delimited = False
        self._remaining: int | None = None
        # the head waits for the first body piece so both leave in one send (one syscall less per
        # response); a streamed head is flushed at the end of the loop iteration at the latest
        self._pending_head: bytes | None = None
        self._callbacks: list[Callable[[], None]] | None = None
        self._cancel_task = False
        #: connection side: the task running the handler (set by the connection)
        self.task: RequestTask | None = None
        self.started = False
        self.finished = False
        self.disconnected = False
        #: what the access log reads: the status sent (0: none), the body bytes handed to the
        #: transport (framing and head excluded), and whether the client left before the end
        self.status = 0
        self.sent = 0
        self.client_abort = False

    # ---- head -------------------------------------------------------------------------------
    @cython.annotation_typing(False)  # the cpdef of request.pxd
    def _build_head(self, status: int, headers: list[tuple[bytes, bytes]] | tuple[()],
                    framing: bytes) -> bytes:
        ka = self.keep_alive and not self._proto.draining
        self.keep_alive = ka
        conn = CONNECTION_CLOSE if not ka else CONNECTION_KEEP_ALIVE if self._v10 else b""
        lead = (status_line(status), DATE[0])
        tail = (framing, conn, b"\r\n")
        lines = 3 + (framing != b"") + (conn != b"")
        # one pass in C for the common case (lower-case names, clean values); None: the loop below
        head = head_block(lead, headers, _FRAMING_RULES, tail, lines)
        if head is not None:
            return head
        parts = list(lead)
        for name, value in headers:
            # (a lower-case name, the common case, needs no lower() copy)
            if name in _FRAMING or (not name.islower() and name.lower() in _FRAMING):
                continue
            parts += (name, b": ", value, b"\r\n")
            lines += 1
        parts += tail
        head = b"".join(parts)
        # one CRLF per line and no NUL: a CR, LF or NUL in a name or value cannot slip through
        if not head_lines_ok(head, lines):
            raise ValueError("response header name or value contains CR, LF or NUL")
        return head

    # ---- whole responses --------------------------------------------------------------------
    def send(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        """The whole response at once, framed with Content-Length."""
        if self.finished or self.disconnected:
            self.started = self.finished = True
            return
        if self.started:
            raise RuntimeError("response already started")
        if status < 200:
            raise ValueError("interim (1xx) responses are not supported")
        no_body = status == 204 or status == 304
        head = self._build_head(status, headers, b"" if no_body else b"content-length: %d\r\n" % len(body))
        self.started = self.finished = True
        self.status = status
        if no_body or self._head_only or not body:
            self.flow.write(head)
        elif len(body) < _JOIN_BELOW:
            self.sent = len(body)
            self.flow.write(head + body)
        else:
            self.sent = len(body)
            self._transport.writelines((head, body))
        self._proto.response_done(self)

    def send_error(self, err: FlexInferError,
                   headers: list[tuple[bytes, bytes]] | tuple[()] = ()) -> None:
        """An OpenAI-shaped error response (x-should-retry, Retry-After as the error says) plus
        ``headers``. ``err.headers`` are not added here: callers pass them (or not) in ``headers``."""
        hdrs: list[tuple[bytes, bytes]] = [(b"content-type", b"application/json")]
        own = {b"content-type"}
        if err.should_retry is not None:
            hdrs.append((b"x-should-retry", b"true" if err.should_retry else b"false"))
            own.add(b"x-should-retry")
        if err.retry_after is not None:
            hdrs.append((b"retry-after", b"%d" % max(1, math.ceil(err.retry_after))))
            own.add(b"retry-after")
        # err.headers are the caller's to pass (as in the contract); the ones set above win
        hdrs.extend(h for h in headers if h[0].lower() not in own)
        self.send(err.status, hdrs, err.body())

    # ---- streaming --------------------------------------------------------------------------
    @cython.annotation_typing(False)  # the cpdef of request.pxd
    def start(self, status: int, headers: list[tuple[bytes, bytes]],
              content_length: int | None = None) -> None:
        """Send the head. ``content_length`` None: chunked (1.1) or close-delimited (1.0)."""
        if self.finished or self.disconnected:
            self.started = True
            return
        if self.started:
            raise RuntimeError("response already started")
        if status < 200:
            raise ValueError("interim (1xx) responses are not supported")
        if status == 204 or status == 304:
            framing = b""
            self._remaining = 0
        elif content_length is not None:
            if content_length < 0:
                raise ValueError("negative content_length")
            framing = b"content-length: %d\r\n" % content_length
            self._remaining = content_length
        elif self._v10:
            framing = b""
            self.keep_alive = False
            self._close_delimited = True
        else:
            framing = CHUNKED
            self._chunked = True
        head = self._build_head(status, headers, framing)
        self.started = True
        self.status = status
        if self._head_only or self._remaining == 0:
            self.flow.write(head)
            return
        self._pending_head = head
        if self._remaining is None:  # streamed: never held across a wait
            self._proto.loop.call_soon(self._flush_head)

    def _flush_head(self) -> None:
        head = self._pending_head
        if head is not None and self._remaining is None and not self.disconnected:
            self._pending_head = None
            self.flow.write(head)

    def write(self, data: bytes) -> None:
        """One body piece, framed and handed to the transport at once (no coalescing)."""
        if not self.started:
            raise RuntimeError("write() before start()")
        if self.finished or self.disconnected or not data or self._head_only:
            return
        if self._chunked:
            n = len(data)
            self.sent += n
            head = self._pending_head
            if head is not None:
                self._pending_head = None
                if n < _JOIN_BELOW:
                    self.flow.write(_framed(head, data))
                else:
                    self._transport.writelines((head, b"%x\r\n" % n, data, b"\r\n"))
            elif n < _JOIN_BELOW:
                self.flow.write(_framed(b"", data))  # once per relayed read of a stream
            else:
                self._transport.writelines((b"%x\r\n" % n, data, b"\r\n"))
            return
        rem = self._remaining
        if rem is not None:
            if len(data) > rem:
                raise ValueError("body longer than the declared Content-Length")
            self._remaining = rem - len(data)
        self.sent += len(data)
        head = self._pending_head
        if head is not None:
            self._pending_head = None
            if len(data) < _JOIN_BELOW:
                self.flow.write(head + data)
            else:
                self._transport.writelines((head, data))
            return
        self.flow.write(data)

    def writelines(self, pieces: Sequence[bytes], *, end: bool = False) -> None:
        """Body pieces that are ready together: framed as one chunk and handed to the transport in
        one call. ``end=True`` finishes the response in the same call; this is the one place that
        finishes a response (:meth:`end` is ``writelines((), end=True)``)."""
        if self.finished:
            return
        if not self.started:
            raise RuntimeError("write() before start()")
        if self.disconnected or self._head_only:  # nothing (more) goes on the wire
            if end:
                self.finished = True
                if not self.disconnected:
                    self._proto.response_done(self)
            return
        total = 0
        for piece in pieces:
            total += len(piece)
        rem = self._remaining
        if rem is not None:
            if total > rem:
                raise ValueError("body longer than the declared Content-Length")
            rem = self._remaining = rem - total
        self.sent += total
        parts: list[bytes] = []
        head = self._pending_head
        if head is not None:
            self._pending_head = None
            parts.append(head)
        if total:
            if self._chunked:
                parts.append(b"%x\r\n" % total)
                parts += pieces
                parts.append(b"\r\n")
            else:
                parts += pieces
        if end:
            self.finished = True
            if self._chunked:
                parts.append(LAST_CHUNK)
        if parts:
            if total < _JOIN_BELOW:
                self.flow.write(parts[0] if len(parts) == 1 else b"".join(parts))
            else:
                self._transport.writelines(parts)
        if end:
            if rem:  # fewer bytes than declared: the only honest ending is a close
                self._proto.abort_connection()
            else:
                self._proto.response_done(self)

    def end(self) -> None:
        """Finish the response (terminating chunk); the connection goes on with the next request."""
        if self.finished:
            return
        if not self.started:
            raise RuntimeError("end() before start()")
        self.writelines((), end=True)

    def abort(self) -> None:
        """Close the connection without the terminating chunk (mid-stream failure)."""
        if self.finished and self.started:
            return
        self.started = self.finished = True
        if not self.disconnected:
            self._flush_head()  # a streamed head leaves (as it always did); a Content-Length one never
            self._proto.abort_connection()

    async def drain(self) -> None:
        """Wait while the connection's write buffer is over its high-water mark."""
        if self.disconnected:
            raise ClientGone()
        await self.flow.drain()

    def on_disconnect(self, cb: Callable[[], None]) -> None:
        """``cb()`` once if the client goes away before end() (at once if it already has)."""
        if self.disconnected:
            if not self.finished:
                cb()
            return
        if self.finished:
            return
        if self._callbacks is None:
            self._callbacks = [cb]
        else:
            self._callbacks.append(cb)

    def cancel_on_disconnect(self) -> None:
        """Cancel the task running the handler once if the client goes away before end() (at once
        if it already has), before any on_disconnect callback runs."""
        if self.disconnected:
            if not self.finished:
                self._cancel_handler()
            return
        self._cancel_task = True

    def _cancel_handler(self) -> None:
        task = self.task
        if task is not None and not task.done():
            task.cancel()

    def client_lost(self) -> None:
        """Connection side: the client went away (the cancel, then the on_disconnect callbacks, once)."""
        if self.disconnected:
            return
        self.disconnected = True
        cbs = self._callbacks
        self._callbacks = None
        if self.finished:
            return
        self.client_abort = True
        if self._cancel_task:
            self._cancel_handler()
        if not cbs:
            return
        for cb in cbs:
            try:
                cb()
            except Exception:
                log.exception("on_disconnect callback failed")
