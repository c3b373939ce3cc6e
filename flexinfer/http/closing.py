"""How a client connection ends: the core's rejections, the graceful close with its linger, the
abort, and what a passed deadline does.

Owns: :class:`Closing`, the base of ``HttpProtocol`` that holds this state (``_closing``,
``_rejected``, the deferred final response, the linger byte count, ``deadline`` and its kind):
:meth:`Closing._reject` answers a broken rule once (OpenAI JSON, ``Connection: close``, one
counter, after the responses before it) and never calls the handler; :meth:`Closing._close_gracefully`
sends FIN after the buffered bytes and keeps reading and dropping for a short while (so the
kernel does not answer unread client bytes with a RST that destroys the response in flight);
:meth:`Closing.abort_connection` closes at once; :meth:`Closing.on_deadline` acts on the kind of
the deadline that passed (the server's tick calls it; no timer per request).
Must not: parse, read the handler's answers or decide which request comes next (protocol.py does);
the rest of the connection's state it reads is declared below and owned by ``HttpProtocol``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from flexinfer.errors import FlexInferError
from flexinfer.http.flow import FlowControl
from flexinfer.http.responses import DATE, error_response_parts, rejection_parts

if TYPE_CHECKING:
    from flexinfer.http.request import ResponseWriter
    from flexinfer.http.server import ServerStats
    from flexinfer.settings import HTTPSettings

__all__ = ["DL_BODY", "DL_FRESH", "DL_HEADER", "DL_KEEPALIVE", "DL_LINGER", "DL_WRITE", "LINGER_BYTES",
           "LINGER_SECONDS", "Closing"]

log = logging.getLogger("flexinfer.http")

#: After a rejection: how long and how much we keep reading (and dropping) so that the kernel does
#: not answer the client's unread bytes with a RST that would destroy our response in flight.
LINGER_SECONDS = 2.0
LINGER_BYTES = 1024 * 1024
# deadline kinds
DL_FRESH, DL_KEEPALIVE, DL_HEADER, DL_BODY, DL_LINGER, DL_WRITE = 1, 2, 3, 4, 5, 6


class Closing:
    """The ending half of one client connection (see the module docstring)."""

    __slots__ = ("_closing", "_dl_kind", "_final", "_lingered", "_rejected", "deadline")

    # owned and set by HttpProtocol, read here
    _active: ResponseWriter | None
    _lost: bool
    _settings: HTTPSettings
    _stats: ServerStats
    _transport: asyncio.Transport
    flow: FlowControl
    loop: asyncio.AbstractEventLoop

    def __init__(self) -> None:
        self._final: tuple[bytes, bytes] | None = None  # a rejection waiting for the responses before it
        self._closing = False
        self._rejected = False
        self._lingered = 0  # bytes read and dropped while lingering
        self.deadline = 0.0
        self._dl_kind = 0

    def _drop_queued(self) -> None:
        """Forget the requests queued and the bytes kept behind the active one (HttpProtocol's)."""
        raise NotImplementedError

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
        self._drop_queued()
        if tr.can_write_eof():
            try:
                tr.write_eof()
            except (OSError, RuntimeError):
                tr.close()
                return
            self.flow.resume_reading()
            self.deadline = self.loop.time() + min(LINGER_SECONDS, self._settings.header_timeout)
            self._dl_kind = DL_LINGER
        else:
            tr.close()

    def abort_connection(self) -> None:
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
        if kind == DL_HEADER:
            self._reject("header_timeout")
        elif kind == DL_BODY:
            self._reject("body_timeout")
        elif kind in (DL_LINGER, DL_WRITE):
            self._closing = True
            self._transport.abort()
        else:  # fresh or idle keep-alive connection: close quietly
            self._closing = True
            self._transport.close()
