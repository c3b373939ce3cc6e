"""The parent of ``run(..., workers=N)``: a plain supervisor of forked children.

Owns: :class:`WorkerSlot` and :func:`current_worker` (which slot this process serves),
:class:`Sidecar` (an extra child the parent keeps alive, such as the kube inventory owner) and
:func:`supervise`, the parent's loop: fork the sidecars, then the workers (slots ``0..N-1``); restart
a child that exits while the parent is not shutting down in the same slot, after a backoff
(:data:`BACKOFF_FIRST` doubling to :data:`BACKOFF_CAP`, back to the first once a child lived
:data:`BACKOFF_RESET_AFTER`), logged once per restart with the exit status; on SIGTERM/SIGINT
forward the signal to the workers, wait for them, then SIGTERM the sidecars and wait for those; a
child still alive ``kill_after`` seconds after its signal gets SIGKILL. The exit code is 0 when every
child's last exit was 0.

The parent runs no event loop and no thread: it sleeps in ``select()`` on a self-pipe that the
signal handlers (SIGCHLD, SIGTERM, SIGINT) wake through :func:`signal.set_wakeup_fd`, and does
everything else (reaping, forwarding, restarting, killing) in that loop, never in a handler.
Signals are blocked across ``fork()`` so a child never runs the parent's handlers. On Linux a child
asks for SIGTERM when the parent dies (``PR_SET_PDEATHSIG``): a supervisor killed with SIGKILL does
not leave orphans serving on.

Must not: know HTTP, sockets or models (the caller passes what a child runs), or restart anything
once shutdown began.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["BACKOFF_CAP", "BACKOFF_FIRST", "BACKOFF_RESET_AFTER", "Sidecar", "WorkerSlot", "current_worker",
           "describe_exit", "supervise"]

log = logging.getLogger("flexinfer.http")

BACKOFF_FIRST = 0.1  # s before the first restart of a slot
BACKOFF_CAP = 5.0  # the delay doubles per restart up to this
BACKOFF_RESET_AFTER = 30.0  # a child that lived this long starts again from BACKOFF_FIRST

_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_HANDLED: set[int | signal.Signals] = {signal.SIGTERM, signal.SIGINT, signal.SIGCHLD}


@dataclass(frozen=True, slots=True)
class WorkerSlot:
    """The worker slot a process serves: ``index`` in ``0..count-1``, stable across restarts."""

    index: int
    count: int
    restarts: int  # restarts of this slot before this process


@dataclass(frozen=True)
class Sidecar:
    """An extra child of the supervisor: ``target()`` runs in a forked process, its return value is
    the exit code. Started before the workers, stopped (SIGTERM) after them, restarted like a worker
    when it exits unexpectedly. It starts with SIGINT ignored (a terminal's Ctrl-C reaches the whole
    process group; the sidecar hears of shutdown from the parent, in order) and SIGTERM at default."""

    name: str
    target: Callable[[], int]


_current: WorkerSlot | None = None
_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> None:  # pragma: no cover - runs in the child
    """SIGTERM to this process when ``parent`` exits (Linux); exit now if it already did."""
    if sys.platform.startswith("linux"):
        import ctypes  # here, in the worker: a single-process server never loads it (its RSS)

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)


def current_worker() -> WorkerSlot | None:
    """The slot of this worker process; None in single-process mode, in the parent and in sidecars."""
    return _current


def describe_exit(code: int) -> str:
    """``os.waitstatus_to_exitcode`` value -> words for a log line."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = str(-code)
        return f"was killed by signal {name}"
    return f"exited with status {code}"


@dataclass(slots=True, eq=False)
class _Child:
    name: str  # "worker 0", "sidecar kube-inventory"
    body: Callable[[], int]
    slot: int | None  # the worker index; None for a sidecar
    pid: int = 0  # 0: not running
    started: float = 0.0
    restarts: int = 0
    delay: float = BACKOFF_FIRST
    start_at: float | None = 0.0  # when to (re)start it; None: not scheduled
    code: int = 0  # the last exit code
    kill_at: float | None = None  # SIGKILL deadline once signalled at shutdown


class _Supervisor:
    def __init__(self, children: list[_Child], count: int, *, kill_after: float,
                 on_worker_exit: Callable[[int], None] | None, after_fork: Callable[[], None] | None) -> None:
        self.children = children
        self.count = count
        self.kill_after = kill_after
        self.on_worker_exit = on_worker_exit
        self.after_fork = after_fork
        self.pending: list[int] = []  # signals received, handled by the loop
        self.stopping = False
        self.sidecars_signalled = False
        self._rfd = self._wfd = -1
        self._pid = os.getpid()

    # -- the loop --------------------------------------------------------------------------------
    def run(self) -> int:
        self._rfd, self._wfd = os.pipe()
        os.set_blocking(self._rfd, False)
        os.set_blocking(self._wfd, False)
        old_fd = signal.set_wakeup_fd(self._wfd, warn_on_full_buffer=False)
        old = {sig: signal.signal(sig, self._on_signal) for sig in _HANDLED}
        try:
            while True:
                self._reap()
                now = time.monotonic()
                if self.pending:
                    self._forward(now)
                if self.stopping:
                    self._shutdown_step(now)
                    if not any(c.pid for c in self.children):
                        break
                else:
                    for c in self.children:  # list order: sidecars first
                        if c.pid == 0 and c.start_at is not None and c.start_at <= now:
                            self._start(c)
                self._sleep(self._next_deadline(time.monotonic()))
            return 0 if all(c.code == 0 for c in self.children) else 1
        finally:
            for c in self.children:  # only after an error in the loop itself
                if c.pid:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(c.pid, signal.SIGKILL)
                    with contextlib.suppress(ChildProcessError):
                        os.waitpid(c.pid, 0)
            for sig, handler in old.items():
                signal.signal(sig, handler)
            signal.set_wakeup_fd(old_fd)
            os.close(self._rfd)
            os.close(self._wfd)

    def _on_signal(self, signum: int, _frame: object) -> None:
        if signum != signal.SIGCHLD:
            self.pending.append(signum)
        # the wakeup fd already woke the loop; everything else happens there

    def _sleep(self, deadline: float | None) -> None:
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        select.select([self._rfd], [], [], timeout)
        with contextlib.suppress(BlockingIOError):
            while os.read(self._rfd, 4096):
                pass

    def _next_deadline(self, now: float) -> float | None:
        if self.pending:
            return now
        times: list[float] = []
        for c in self.children:
            if self.stopping:
                if c.pid and c.kill_at is not None:
                    times.append(c.kill_at)
            elif c.pid == 0 and c.start_at is not None:
                times.append(c.start_at)
        return min(times) if times else None

    # -- children --------------------------------------------------------------------------------
    def _start(self, c: _Child) -> None:
        for stream in (sys.stdout, sys.stderr):  # a child must not write the parent's buffered text again
            with contextlib.suppress(Exception):
                stream.flush()
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, _HANDLED)
        try:
            pid = os.fork()
            if pid == 0:  # pragma: no cover - runs in the child
                self._child(c, mask)
            c.pid, c.started, c.start_at, c.kill_at = pid, time.monotonic(), None, None
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        log.info("%s started (pid %d)", c.name, pid)

    def _child(self, c: _Child, mask: set[int | signal.Signals]) -> None:  # pragma: no cover - runs in the child
        global _current
        code = 1
        try:
            signal.set_wakeup_fd(-1)
            os.close(self._rfd)
            os.close(self._wfd)
            for sig in _HANDLED:
                signal.signal(sig, signal.SIG_DFL)
            if c.slot is None:
                signal.signal(signal.SIGINT, signal.SIG_IGN)
            _die_with_parent(self._pid)
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            if self.after_fork is not None:
                self.after_fork()
            _current = WorkerSlot(c.slot, self.count, c.restarts) if c.slot is not None else None
            code = c.body()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:
            log.exception("%s failed", c.name)
            code = 1
        finally:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            os._exit(code)

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            c = next((c for c in self.children if c.pid == pid), None)
            if c is None:
                continue  # not ours (a grandchild reparented here cannot be: we are no subreaper)
            c.pid = 0
            c.code = os.waitstatus_to_exitcode(status)
            if self.stopping:
                continue
            now = time.monotonic()
            if now - c.started >= BACKOFF_RESET_AFTER:
                c.delay = BACKOFF_FIRST
            delay = c.delay
            c.delay = min(BACKOFF_CAP, c.delay * 2)
            c.restarts += 1
            c.start_at = now + delay
            log.warning("%s (pid %d) %s; restarting in %.1fs (restart %d)", c.name, pid, describe_exit(c.code),
                        delay, c.restarts)
            if c.slot is not None and self.on_worker_exit is not None:
                try:
                    self.on_worker_exit(c.slot)
                except Exception:
                    log.exception("on_worker_exit(%d) failed", c.slot)

    # -- shutdown --------------------------------------------------------------------------------
    def _forward(self, now: float) -> None:
        signals, self.pending = self.pending, []
        if not self.stopping:
            self.stopping = True
            for c in self.children:
                c.start_at = None  # no restarts from now on
        for signum in signals:
            for c in self.children:
                if c.slot is not None and c.pid:
                    self._signal(c, signum, now)

    def _signal(self, c: _Child, signum: int, now: float) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(c.pid, signum)
        if c.kill_at is None:
            c.kill_at = now + self.kill_after

    def _shutdown_step(self, now: float) -> None:
        for c in self.children:
            if c.pid and c.kill_at is not None and now >= c.kill_at:
                log.warning("%s (pid %d) did not exit %.1fs after its signal: SIGKILL", c.name, c.pid,
                            self.kill_after)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(c.pid, signal.SIGKILL)
                c.kill_at = None
        if not self.sidecars_signalled and not any(c.pid for c in self.children if c.slot is not None):
            self.sidecars_signalled = True  # the workers are gone: now the sidecars
            for c in self.children:
                if c.slot is None and c.pid:
                    self._signal(c, signal.SIGTERM, now)


def supervise(worker: Callable[[], int], count: int, *, sidecars: Sequence[Sidecar] = (),
              on_worker_exit: Callable[[int], None] | None = None, kill_after: float = 35.0,
              after_fork: Callable[[], None] | None = None) -> int:
    """Run ``count`` worker slots (each a forked ``worker()``, which reads its slot with
    :func:`current_worker`) and the ``sidecars`` until SIGTERM/SIGINT; returns the exit code.

    ``on_worker_exit(index)`` runs in this (the parent) process after a worker died unexpectedly,
    before its slot is restarted. ``after_fork()`` runs first in every child (close what only the
    parent should hold). Must be called from the main thread of a process with no other threads.
    """
    children = [_Child(f"sidecar {s.name}", s.target, None) for s in sidecars]
    children += [_Child(f"worker {i}", worker, i) for i in range(count)]
    return _Supervisor(children, count, kill_after=kill_after, on_worker_exit=on_worker_exit,
                       after_fork=after_fork).run()
