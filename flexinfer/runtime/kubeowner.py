"""The inventory owner of ``proxy --kube --workers N``: the one process per machine that runs the
:class:`~flexinfer.runtime.kube.KubeRuntime` (watches, demand patches, GPUGroup queue annotations)
and hands its inventory to the workers.

Owns:

- :class:`InventoryOwner`: a Unix stream socket (in the parent's private 0700 directory, mode 0600)
  that serves the workers with the protocol of :mod:`flexinfer.runtime.kuberemote`: on connect the
  whole index, then each index swap as it happens (the runtime's ``on_index`` hook: the whole index
  when models or names came or went, removals included, else only the changed views). It binds only
  after the runtime's first lists (``start()`` waits up to ``sync_timeout``), so a worker's first
  snapshot is a synced one. A worker's ``demand`` becomes ``KubeRuntime.record_demand``, its
  ``wake`` a ``KubeRuntime.wake`` (one in flight per model, shared by every worker that asks)
  answered with ``None`` or the runtime's reason, its ``depth`` a row of :class:`OwnerLoad`.
- :class:`OwnerLoad`, the runtime's :class:`~flexinfer.runtime.base.LoadView` here: ``queue_depth``
  is the sum of the depths the connected workers reported (a worker's rows vanish with its
  connection), ``in_flight`` comes from an injected callable (the machine's shared in-flight counts;
  0 until wired).
- :func:`run_owner`, the sidecar's body: its own event loop, SIGTERM -> stop -> exit 0.

Must not: serve HTTP or know the proxy (it reads the workers' load only through what they send),
or block a watch on a slow worker (a worker whose unread output passes :data:`MAX_BUFFERED` is
disconnected; it reconnects and takes a fresh snapshot).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import signal
from collections.abc import Callable
from typing import Any

from flexinfer.runtime.base import ModelView
from flexinfer.runtime.kube import KubeRuntime, KubeTimings
from flexinfer.runtime.kuberemote import Message, encode, index_message, read_message, views_message
from flexinfer.runtime.kubeviews import Index

log = logging.getLogger("flexinfer.kube.owner")

MAX_BUFFERED = 64 * 1024 * 1024  # bytes queued for one worker before it is dropped


def _nothing_open(endpoint: str) -> int:
    return 0


class OwnerLoad:
    """Queue depths summed over the workers' reports; in-flight counts from ``in_flight(endpoint)``."""

    __slots__ = ("_in_flight", "depths")

    def __init__(self, in_flight: Callable[[str], int] | None = None) -> None:
        self._in_flight = in_flight or _nothing_open
        self.depths: dict[int, dict[str, int]] = {}  # connection -> model -> requests waiting there

    def in_flight(self, endpoint: str) -> int:
        return self._in_flight(endpoint)

    def queue_depth(self, model: str) -> int | None:
        return sum(d.get(model, 0) for d in self.depths.values())


class _Worker:
    __slots__ = ("cid", "writer")

    def __init__(self, cid: int, writer: asyncio.StreamWriter) -> None:
        self.cid = cid
        self.writer = writer

    def send(self, data: bytes) -> None:
        if self.writer.is_closing():
            return
        if self.writer.transport.get_write_buffer_size() > MAX_BUFFERED:
            log.warning("worker connection %d does not read its inventory; dropping it", self.cid)
            self.writer.transport.abort()
            return
        self.writer.write(data)


class InventoryOwner:
    """Serves ``runtime``'s inventory to the workers at ``path``; ``load`` is the runtime's LoadView."""

    def __init__(self, runtime: KubeRuntime, load: OwnerLoad, path: str) -> None:
        self.runtime = runtime
        self.load = load
        self.path = path
        self.workers: dict[int, _Worker] = {}
        self._ids = itertools.count(1)
        self._server: asyncio.AbstractServer | None = None
        self._wakes: dict[str, asyncio.Task[str | None]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        runtime.on_index(self._on_index)

    async def start(self) -> None:
        await self.runtime.start()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)  # the socket of an owner that died
        self._server = await asyncio.start_unix_server(self._serve, path=self.path)
        os.chmod(self.path, 0o600)
        log.info("inventory owner serving %d models on %s (pid %d)", len(self.runtime.index.views), self.path,
                 os.getpid())

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for w in list(self.workers.values()):
            w.writer.close()
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)
            self._server = None
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
        await self.runtime.stop()

    # -- to the workers -------------------------------------------------------------------------------
    def _on_index(self, index: Index, rebuilt: bool, changed: list[ModelView]) -> None:
        if not self.workers:
            return
        data = encode(index_message(index) if rebuilt else views_message(changed))
        for w in list(self.workers.values()):
            w.send(data)

    # -- from the workers -----------------------------------------------------------------------------
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        w = _Worker(next(self._ids), writer)
        self.workers[w.cid] = w
        self.load.depths[w.cid] = {}
        w.send(encode(index_message(self.runtime.index)))
        try:
            while True:
                self._dispatch(w, await read_message(reader))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except (OSError, ValueError) as exc:
            log.warning("worker connection %d: %s", w.cid, exc)
        finally:
            del self.workers[w.cid]
            del self.load.depths[w.cid]
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
            if task is not None:
                self._tasks.discard(task)

    def _dispatch(self, w: _Worker, msg: Message) -> None:
        t = msg["t"]
        if t == "demand":
            view = self.runtime.index.views.get(msg["model"])
            if view is not None:
                self.runtime.record_demand(view)
        elif t == "depth":
            depths = self.load.depths[w.cid]
            if msg["n"] > 0:
                depths[msg["model"]] = int(msg["n"])
            else:
                depths.pop(msg["model"], None)
        elif t == "wake":
            task = asyncio.get_running_loop().create_task(self._answer_wake(w, msg["id"], msg["model"]))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        else:
            log.debug("ignoring a %r message from worker connection %d", t, w.cid)

    async def _answer_wake(self, w: _Worker, wid: int, name: str) -> None:
        task = self._wakes.get(name)
        if task is None:
            task = self._wakes[name] = asyncio.get_running_loop().create_task(self._wake(name))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        error = await asyncio.shield(task)
        w.send(encode({"t": "woke", "id": wid, "error": error}))

    async def _wake(self, name: str) -> str | None:
        try:
            view = self.runtime.index.views.get(name) or ModelView(name=name)  # gone: wake says so
            await self.runtime.wake(view)
            return None
        except Exception as exc:
            return str(exc) or type(exc).__name__
        finally:
            self._wakes.pop(name, None)


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def run_owner(path: str, namespace: str, *, all_namespaces: bool = False, timings: KubeTimings = KubeTimings(),
              in_flight: Callable[[str], int] | None = None, api_client: Any = None) -> int:
    """The inventory owner process: serve until SIGTERM, then stop (queue annotations cleared) and
    return 0 (1 when it failed)."""
    async def main() -> int:
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        load = OwnerLoad(in_flight)
        runtime = KubeRuntime(namespace, all_namespaces=all_namespaces, api_client=api_client, timings=timings,
                              load=load)
        owner = InventoryOwner(runtime, load, path)
        code = 0
        try:
            await owner.start()
            await stop.wait()
        except Exception:
            log.exception("inventory owner failed")
            code = 1
        finally:
            await owner.stop()
        return code

    try:
        with asyncio.Runner(loop_factory=_new_loop) as runner:
            return runner.run(main())
    except Exception:
        log.exception("inventory owner failed to start")
        return 1
