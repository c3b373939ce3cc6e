"""Flow control of one client connection, both directions.

Owns: whether the transport's reading is paused (pipelined bytes over the limit), whether writing is
paused (the transport's write buffer passed its high-water mark), the waiters of ``drain()`` and the
one "writing resumed" listener through which an upstream relay resumes its upstream socket, the
transport's ``write`` bound once (``write``: how the connection's response writer sends), and
:data:`JOIN_BELOW`, the one size rule of the HTTP core's writers.
Must not: parse, frame or buffer data itself; it only flips transport switches and wakes waiters.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

__all__ = ["JOIN_BELOW", "ClientGone", "FlowControl"]

#: Below this many bytes a body piece is copied into one write with what goes before it (a response
#: head or a chunk's framing: request.ResponseWriter; an upstream request's head: client.UpstreamPool);
#: from it on, the pieces go to the transport as they are (writelines), not copied.
JOIN_BELOW = 16 * 1024


class ClientGone(Exception):
    """The client disconnected (connection lost or EOF) before the response was finished."""


class FlowControl:
    """Pause/resume switches of one transport and the waiters of :meth:`drain`."""

    __slots__ = ("_drain_waiter", "_listener", "_transport", "closed", "read_paused", "write", "write_paused")

    def __init__(self, transport: asyncio.Transport, write_high: int) -> None:
        self._transport = transport
        #: the transport's ``write``, bound once per connection: the writer calls it per relayed
        #: read, and a call through the bound method skips the lookup by name of each
        #: ``transport.write(...)`` (about 110 instructions a call in the build, by callgrind)
        self.write: Callable[[bytes], None] = transport.write
        self.read_paused = False
        self.write_paused = False
        self.closed = False
        self._drain_waiter: asyncio.Future[None] | None = None
        self._listener: Callable[[], None] | None = None
        transport.set_write_buffer_limits(high=write_high)

    # ---- reading -----------------------------------------------------------------------------
    def pause_reading(self) -> None:
        if not self.read_paused and not self.closed:
            self.read_paused = True
            self._transport.pause_reading()

    def resume_reading(self) -> None:
        if self.read_paused and not self.closed:
            self.read_paused = False
            self._transport.resume_reading()

    # ---- writing (called by the protocol's pause_writing / resume_writing) --------------------
    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        if self._drain_waiter is not None:
            self._wake_drain()
        listener = self._listener
        if listener is not None:
            listener()

    def set_listener(self, listener: Callable[[], None] | None) -> None:
        """The callback run each time writing resumes (one at a time: the current relay)."""
        self._listener = listener

    async def drain(self) -> None:
        """Wait while the write buffer is over the high-water mark; ClientGone once disconnected."""
        if self.closed:
            raise ClientGone()
        if not self.write_paused:
            return
        waiter = self._drain_waiter
        if waiter is None:
            waiter = self._drain_waiter = asyncio.get_running_loop().create_future()
        await asyncio.shield(waiter)
        if self.closed:
            raise ClientGone()

    def connection_lost(self) -> None:
        """The transport is gone: wake every drain waiter (they raise ClientGone)."""
        self.closed = True
        self.write_paused = False
        if self._drain_waiter is not None:
            self._wake_drain()
        self._listener = None

    def _wake_drain(self) -> None:
        """Release whoever waits in :meth:`drain` (called only while someone does: the common path
        stays one attribute test)."""
        waiter = self._drain_waiter
        self._drain_waiter = None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
