"""Listening, the event loop, signals, graceful drain and the server tick.

Owns: :class:`HTTPServer` (one listener, its connections, the 1 Hz tick that refreshes the cached
Date header and fires connection deadlines), :class:`ServerStats` and :func:`run` (uvloop when
importable, SIGTERM/SIGINT -> drain -> exit 0; ``workers > 1`` or sidecars: forked worker processes,
each with its own SO_REUSEPORT listener, under the supervisor of :mod:`flexinfer.http.workers`, whose
``WorkerSlot``, ``Sidecar`` and ``current_worker`` are re-exported here).
Must not: parse HTTP (protocol.py does), know models or routes, or keep a timer per request.

Deadlines: each tick looks one tick ahead and files the connections due before the next tick in
slots of ``DEADLINE_SLOT`` seconds, one ``call_at`` timer per slot (not per connection); a slot
re-checks each connection's deadline when it fires (a deadline moved meanwhile is left to a later
tick) and acts on at most ``DEADLINE_BATCH`` connections per loop turn, so a deadline passes within
about a slot of its time and 2,000 slow connections due together never close in one turn
(slowloris: row F4 of the reliability plan).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import signal
import socket
from collections import deque
from collections.abc import Awaitable, Callable, Sequence

from flexinfer.http.protocol import Handler, HttpProtocol
from flexinfer.http.responses import refresh_date
from flexinfer.http.workers import Sidecar, WorkerSlot, current_worker, supervise
from flexinfer.settings import HTTPSettings

__all__ = ["HTTPServer", "ServerStats", "Sidecar", "WorkerSlot", "current_worker", "run"]

#: Seconds past ``drain_timeout`` a child may take to exit after its signal before it gets SIGKILL.
KILL_GRACE = 5.0

log = logging.getLogger("flexinfer.http")

#: Listen backlog (the kernel caps it at net.core.somaxconn).
BACKLOG = 4096
#: Width of a deadline slot (seconds): how late past its time a deadline may be acted on.
DEADLINE_SLOT = 0.01
#: Connections whose deadline passed acted on per loop turn; the rest in the following turns.
DEADLINE_BATCH = 64


class ServerStats:
    """Plain counters, read by the proxy's Prometheus collector at scrape time."""

    __slots__ = ("connections_active", "connections_total", "rejections", "requests_total")

    def __init__(self) -> None:
        self.connections_active = 0
        self.connections_total = 0
        self.requests_total = 0
        #: reason -> count; the reasons are the keys of ``responses.CORE_ERRORS`` plus
        #: ``pipeline_overflow`` (too many requests parsed ahead: served, then closed).
        self.rejections: dict[str, int] = {}


class HTTPServer:
    """One listener and its connections."""

    def __init__(self, handler: Handler, settings: HTTPSettings, *, host: str = "127.0.0.1",
                 port: int = 0, reuse_port: bool = False, sock: socket.socket | None = None) -> None:
        self.handler = handler
        self.settings = settings
        self.host = host
        self.port = port
        self.draining = False
        self.stats = ServerStats()
        self._reuse_port = reuse_port
        self._sock = sock
        self._server: asyncio.AbstractServer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._connections: set[HttpProtocol] = set()
        self._tick_handle: asyncio.TimerHandle | None = None
        #: deadline slot (int(deadline / DEADLINE_SLOT)) -> connections due in it, and its timer
        self._slots: dict[int, list[HttpProtocol]] = {}
        self._slot_timers: dict[int, asyncio.TimerHandle] = {}
        #: connections of fired slots not yet looked at, and the handle of the next look
        self._due: deque[HttpProtocol] = deque()
        self._due_handle: asyncio.Handle | None = None
        self._empty: asyncio.Event | None = None
        shortest = min(settings.header_timeout, settings.body_timeout, settings.keepalive_timeout)
        #: Deadline resolution: 1 s in production, finer when timeouts are scaled down in tests.
        self.tick_interval = min(1.0, max(0.01, shortest / 4))
        attach = getattr(handler, "attach", None)
        if callable(attach):
            attach(self)

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._loop = loop

        def factory() -> HttpProtocol:
            return HttpProtocol(self)

        if self._sock is not None:
            self._server = await loop.create_server(factory, sock=self._sock, backlog=BACKLOG)
        else:
            self._server = await loop.create_server(
                factory, self.host, self.port, reuse_port=self._reuse_port or None, backlog=BACKLOG)
        sockets = getattr(self._server, "sockets", None) or ()
        if sockets:
            self.port = sockets[0].getsockname()[1]
        refresh_date()
        self._tick_handle = loop.call_later(self.tick_interval, self._tick)

    # ---- connections ------------------------------------------------------------------------
    def _register(self, conn: HttpProtocol) -> None:
        self._connections.add(conn)
        self.stats.connections_active += 1
        self.stats.connections_total += 1

    def _unregister(self, conn: HttpProtocol) -> None:
        if conn in self._connections:
            self._connections.discard(conn)
            self.stats.connections_active -= 1
        if self._empty is not None and not self._connections:
            self._empty.set()

    def _tick(self) -> None:
        refresh_date()
        loop = self._loop
        assert loop is not None
        horizon = loop.time() + self.tick_interval
        slots = self._slots
        for c in self._connections:
            d = c.deadline
            if 0.0 < d <= horizon:
                key = int(d / DEADLINE_SLOT)
                slot = slots.get(key)
                if slot is None:
                    slots[key] = [c]
                    self._slot_timers[key] = loop.call_at((key + 1) * DEADLINE_SLOT, self._fire_slot, key)
                else:
                    slot.append(c)
        self._tick_handle = loop.call_later(self.tick_interval, self._tick)

    def _fire_slot(self, key: int) -> None:
        """A slot's time passed: its connections join the backlog acted on ``DEADLINE_BATCH`` per turn."""
        self._slot_timers.pop(key, None)
        slot = self._slots.pop(key, None)
        if slot:
            self._due.extend(slot)
            if self._due_handle is None:
                self._fire_due()

    def _fire_due(self) -> None:
        self._due_handle = None
        loop = self._loop
        assert loop is not None
        soon = loop.time() + DEADLINE_SLOT  # (a timer may fire a hair early: within a slot counts)
        due = self._due
        for _ in range(min(DEADLINE_BATCH, len(due))):
            conn = due.popleft()
            if 0.0 < conn.deadline <= soon:
                try:
                    conn.on_deadline()
                except Exception:
                    log.exception("deadline handling failed")
        if due:
            self._due_handle = loop.call_soon(self._fire_due)

    # ---- shutdown ---------------------------------------------------------------------------
    async def drain_and_close(self, timeout: float) -> None:
        """Stop accepting, close idle connections, let in-flight responses finish until
        ``timeout``, then abort what is left. Requests arriving meanwhile get 503 + close."""
        if self._server is None:
            return
        self.draining = True
        self._server.close()
        self._empty = asyncio.Event()
        for conn in list(self._connections):
            conn.shutdown_idle()
        loop = asyncio.get_running_loop()
        end = loop.time() + max(0.0, timeout)
        # polled: draining happens once per process life, and "busy" changes without events
        while any(c.busy for c in self._connections) and loop.time() < end:
            await asyncio.sleep(min(0.02, max(0.0, end - loop.time())))
        busy = [c for c in self._connections if c.busy]
        if busy:
            log.warning("drain timeout: aborting %d busy connection(s)", len(busy))
        for conn in list(self._connections):
            if conn.busy:
                conn.shutdown_now()
            else:
                conn.shutdown_idle()  # already answered and lingering: close now
        if self._connections:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._empty.wait(), 1.0)
        if self._tick_handle is not None:
            self._tick_handle.cancel()
            self._tick_handle = None
        for handle in self._slot_timers.values():
            handle.cancel()
        self._slot_timers.clear()
        self._slots.clear()
        if self._due_handle is not None:
            self._due_handle.cancel()
            self._due_handle = None
        self._due.clear()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._server.wait_closed(), 1.0)
        # let the handlers' tasks see their cancellation / disconnect
        await asyncio.sleep(0)

    @property
    def connections(self) -> int:
        return len(self._connections)


# ---- process entry -------------------------------------------------------------------------

def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency, asyncio is the fallback
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def _serve(make_handler: Callable[[], Handler], settings: HTTPSettings, host: str, port: int,
           reuse_port: bool, on_start: Callable[[HTTPServer], Awaitable[None]] | None,
           on_stop: Callable[[HTTPServer], Awaitable[None]] | None) -> int:
    async def main() -> int:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        server = HTTPServer(make_handler(), settings, host=host, port=port, reuse_port=reuse_port)
        try:
            await server.start()
        except OSError as exc:  # the port is taken, the address is not ours: one line, no traceback
            log.error("cannot listen on %s:%d: %s", host, port, _why(exc))
            return 2
        code = 0
        try:
            if on_start is not None:
                await on_start(server)
            await stop.wait()
        except Exception:
            log.exception("server failed")
            code = 1
        finally:
            await server.drain_and_close(settings.drain_timeout)
            if on_stop is not None:
                try:
                    await on_stop(server)
                except Exception:
                    log.exception("on_stop failed")
                    code = 1
        return code

    try:
        with asyncio.Runner(loop_factory=_new_loop) as runner:
            return runner.run(main())
    except Exception:
        log.exception("server failed to start")
        return 1


def _why(exc: OSError) -> str:
    """An OSError of a bind as the words a user can act on (uvloop's message repeats the address)."""
    if exc.errno == errno.EADDRINUSE:
        return "the address is already in use (another process listens there; choose another --port)"
    if exc.errno == errno.EACCES:
        return "permission denied (ports below 1024 need privileges)"
    if exc.errno == errno.EADDRNOTAVAIL:
        return "the address is not one of this machine's"
    return exc.strerror or str(exc)


def _reserve_port(host: str, port: int = 0) -> socket.socket:
    """A bound (not listening) SO_REUSEPORT socket on ``port`` (0: an ephemeral one) that the workers
    then share: held by the supervisor, it keeps the port ours across worker restarts, and its bind
    fails at once (OSError) where a worker's would (a port another process listens on)."""
    family, type_, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    s = socket.socket(family, type_, proto)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        s.bind(addr)
    except OSError:
        s.close()
        raise
    return s


def run(make_handler: Callable[[], Handler], settings: HTTPSettings, *, host: str, port: int,
        workers: int = 1, on_start: Callable[[HTTPServer], Awaitable[None]] | None = None,
        on_stop: Callable[[HTTPServer], Awaitable[None]] | None = None,
        on_worker_exit: Callable[[int], None] | None = None, sidecars: Sequence[Sidecar] = ()) -> int:
    """Serve until SIGTERM/SIGINT, then drain (``settings.drain_timeout``). Returns the exit code.

    ``workers > 1``, or any ``sidecars``, makes this process a supervisor
    (:func:`flexinfer.http.workers.supervise`): it forks the sidecars, then one process per worker
    slot; each worker builds its own handler and listens on the same port with SO_REUSEPORT (the
    kernel spreads connections) and reads its slot with :func:`current_worker`. A child that dies is
    restarted in its slot with backoff (``on_worker_exit(index)`` runs here first for a worker); the
    others keep serving. SIGTERM/SIGINT is forwarded to the workers, then the sidecars get SIGTERM;
    a child still alive ``drain_timeout + KILL_GRACE`` after its signal gets SIGKILL. Returns 0 when
    every child's last exit was 0. With ``port=0`` the parent reserves one port for all, restarted
    workers included; a port that cannot be bound ends the supervisor (status 2) before any fork. ``workers=1`` without sidecars serves in this process (no supervisor).
    """
    if workers <= 1 and not sidecars:
        return _serve(make_handler, settings, host, port, False, on_start, on_stop)

    try:  # before any fork: a taken port is one error line, not workers restarted forever
        reserved = _reserve_port(host, port)
    except OSError as exc:
        log.error("cannot listen on %s:%d: %s", host, port, _why(exc))
        return 2
    port = reserved.getsockname()[1]

    def worker() -> int:  # pragma: no cover - runs in the child
        return _serve(make_handler, settings, host, port, True, on_start, on_stop)

    try:
        return supervise(worker, max(1, workers), sidecars=sidecars, on_worker_exit=on_worker_exit,
                         kill_after=settings.drain_timeout + KILL_GRACE,
                         after_fork=reserved.close)
    finally:
        reserved.close()
