"""The workers' side of ``proxy --kube --workers N``: the inventory mirrored from the machine's one
inventory owner (:mod:`flexinfer.runtime.kubeowner`), and the wire protocol between the two.

Owns:

- the **protocol** over a Unix stream socket: frames of a 4-byte big-endian length + an orjson
  object with a type ``t``. Owner -> worker: ``index`` (the whole name index: every view and the client
  names each canonical view claims; sent on connect and whenever models or names came or went),
  ``views`` (changed views whose names did not change: ``Index.with_views``), ``woke`` (the answer to
  a wake: ``error`` None or the runtime's reason). Worker -> owner: ``demand`` (a model saw a
  request), ``wake`` (start a model; answered by ``woke`` with the same ``id``), ``depth`` (requests
  this worker holds for a model, sent when it changes). :func:`view_to_dict`/:func:`view_from_dict`
  are the explicit codec of :class:`~flexinfer.runtime.base.ModelView` (its ``metadata`` is a
  read-only mapping of JSON values).
- :class:`RemoteKubeInventory`, the worker's Inventory + Scaler: ``resolve`` is one dict lookup in
  the mirrored index; ``record_demand`` sends at most one ``demand`` per model per ``demand_every``
  (1 s); ``wake`` sends the worker's queue depth, then the wake, and waits for the answer (a failed
  wake raises :class:`RemoteWakeError` with the owner's message, which the activator hands to every
  waiter); while a model has waiters the depth is looked at every ``queue_refresh`` and sent when it
  changed, so the owner's GPUGroup queue annotations count the waiters of every worker. When the
  owner goes away the worker keeps serving its last index, reconnects with backoff, sends its
  depths and unanswered wakes again (and a wake whose answer it ignores for every model it still
  holds requests for, so the new owner re-arms a GPUGroup queue and clears it later) and takes the
  fresh snapshot of the new owner. ``start()``
  waits up to ``sync_wait`` for the first snapshot.

Must not: import a Kubernetes client or talk to the API (only the owner does), or do I/O on the
request path beyond one buffered write of a few bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import os
import struct
import time
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any

import orjson

from flexinfer.k8s.backoff import Backoff
from flexinfer.runtime.base import NO_LOAD, Endpoint, LoadView, ModelView
from flexinfer.runtime.kubeviews import EMPTY_INDEX, Index

log = logging.getLogger("flexinfer.kube.remote")

HEADER = struct.Struct("!I")
MAX_FRAME = 256 * 1024 * 1024  # a frame longer than this is a broken peer, not an inventory

Message = dict[str, Any]


class RemoteWakeError(RuntimeError):
    """The owner could not wake a model; the message is the runtime's reason."""


# -- the codec ---------------------------------------------------------------------------------------

def view_to_dict(v: ModelView) -> dict[str, Any]:
    # an endpoint is [host, port], or [host, port, role] when its role is not "both" (older peers read both)
    eps = [[e.host, e.port] if e.role == "both" else [e.host, e.port, e.role] for e in v.endpoints]
    return {"name": v.name, "endpoints": eps, "ready": v.ready,
            "served_name": v.served_name, "aliases": list(v.aliases), "routing": v.routing,
            "scheduler": v.scheduler, "cold_start_timeout": v.cold_start_timeout, "context_window": v.context_window,
            "rewrite_model": v.rewrite_model, "owned_by": v.owned_by, "created": v.created,
            "metadata": dict(v.metadata)}


def view_from_dict(d: Mapping[str, Any]) -> ModelView:
    return ModelView(name=d["name"], endpoints=tuple(Endpoint(*e) for e in d["endpoints"]),
                     ready=d["ready"], served_name=d["served_name"], aliases=tuple(d["aliases"]),
                     routing=d["routing"], scheduler=d.get("scheduler"), cold_start_timeout=d["cold_start_timeout"],
                     context_window=d["context_window"], rewrite_model=d["rewrite_model"],
                     owned_by=d["owned_by"], created=d["created"], metadata=MappingProxyType(d["metadata"]))


def index_message(index: Index) -> Message:
    """The whole index: views and the client names each view claims (name, is adapter)."""
    return {"t": "index", "views": [view_to_dict(v) for v in index.ordered],
            "names": {n: [[a, adapter] for a, adapter in claims] for n, claims in index.names_of.items() if claims}}


def views_message(views: Iterable[ModelView]) -> Message:
    return {"t": "views", "views": [view_to_dict(v) for v in views]}


def index_from_message(msg: Mapping[str, Any]) -> Index:
    """The inverse of :func:`index_message`: the same ``by_name`` as the owner's ``Index.build``."""
    views = {v.name: v for v in map(view_from_dict, msg["views"])}
    by_name: dict[str, ModelView] = dict(views)
    names_of: dict[str, tuple[tuple[str, bool], ...]] = {n: () for n in views}
    for n, claims in msg["names"].items():
        v = views[n]
        names_of[n] = tuple((a, bool(adapter)) for a, adapter in claims)
        for a, adapter in names_of[n]:
            by_name[a] = dataclasses.replace(v, rewrite_model=False) if adapter else v
    return Index(views, by_name, names_of)


def encode(msg: Message) -> bytes:
    body = orjson.dumps(msg)
    return HEADER.pack(len(body)) + body


async def read_message(reader: asyncio.StreamReader) -> Message:
    """One frame; raises ``asyncio.IncompleteReadError`` at the end of the stream, ValueError on garbage."""
    (n,) = HEADER.unpack(await reader.readexactly(HEADER.size))
    if n > MAX_FRAME:
        raise ValueError(f"frame of {n} bytes")
    msg = orjson.loads(await reader.readexactly(n))
    if not isinstance(msg, dict) or not isinstance(msg.get("t"), str):
        raise ValueError("not a message")
    return msg


# -- the worker side -----------------------------------------------------------------------------------

class RemoteKubeInventory:
    """Inventory + Scaler of one worker, mirrored from the inventory owner at ``path``.

    ``load`` is the worker's own load (its activator's queue depths); ``await start()`` in the
    worker's loop, ``await stop()`` at the end."""

    def __init__(self, path: str, *, load: LoadView = NO_LOAD, sync_wait: float = 12.0,
                 queue_refresh: float = 1.0, demand_every: float = 1.0, reconnect_base: float = 0.05,
                 reconnect_cap: float = 2.0) -> None:
        self.path = path
        self.load = load
        self.sync_wait = sync_wait
        self.queue_refresh = queue_refresh
        self.demand_every = demand_every
        self.snapshots = 0  # snapshots received (one per connection)
        self._backoff = Backoff(reconnect_base, reconnect_cap)
        self._index: Index = EMPTY_INDEX
        self._subscribers: list[Callable[[ModelView], None]] = []
        self._writer: asyncio.StreamWriter | None = None
        self._synced = asyncio.Event()
        self._demand_sent: dict[str, float] = {}
        self._wakes: dict[int, tuple[str, asyncio.Future[str | None]]] = {}
        self._wake_ids = 0
        self._depths: dict[str, int] = {}  # model -> depth last reported, while someone waits
        self._tracking = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    # -- Inventory ------------------------------------------------------------------------------------
    def resolve(self, name: str) -> ModelView | None:
        return self._index.by_name.get(name)

    def models(self) -> Iterable[ModelView]:
        return self._index.ordered

    def subscribe(self, callback: Callable[[ModelView], None]) -> None:
        self._subscribers.append(callback)

    @property
    def connected(self) -> bool:
        return self._writer is not None

    # -- lifecycle ------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Connect (retrying until the owner listens) and wait up to ``sync_wait`` for its snapshot."""
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._connection(), name="inventory owner connection"),
                       loop.create_task(self._watch_depths(), name="queue depth reports")]
        try:
            await asyncio.wait_for(self._synced.wait(), self.sync_wait)
        except TimeoutError:
            log.warning("no inventory from the owner after %gs (pid %d); serving none until it comes",
                        self.sync_wait, os.getpid())
            return
        log.info("kube inventory from the owner: %d models (pid %d)", len(self._index.views), os.getpid())

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        for _, fut in self._wakes.values():
            if not fut.done():
                fut.set_result("the proxy worker is stopping")

    # -- Scaler ---------------------------------------------------------------------------------------
    def record_demand(self, model: ModelView) -> None:
        """Cheap: at most one ``demand`` message per model per ``demand_every`` (the owner's runtime
        then decides whether it is time for a demand patch). Lost while the owner is away."""
        now = time.monotonic()
        if now - self._demand_sent.get(model.name, -math.inf) < self.demand_every:
            return
        if self._send({"t": "demand", "model": model.name}):
            self._demand_sent[model.name] = now

    async def wake(self, model: ModelView) -> None:
        """Report this worker's waiters, ask the owner to wake ``model``, wait for its answer (sent
        again after a reconnect until answered)."""
        self._track(model.name)
        self._wake_ids += 1
        wid = self._wake_ids
        fut: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        self._wakes[wid] = (model.name, fut)
        try:
            self._send({"t": "wake", "id": wid, "model": model.name})
            error = await fut
        finally:
            self._wakes.pop(wid, None)
        if error is not None:
            raise RemoteWakeError(error)

    # -- queue depth reports --------------------------------------------------------------------------
    def _depth(self, name: str) -> int:
        return self.load.queue_depth(name) or 0

    def _track(self, name: str) -> None:
        depth = self._depth(name)
        if self._depths.get(name) != depth:
            self._send({"t": "depth", "model": name, "n": depth})
        self._depths[name] = depth
        self._tracking.set()

    async def _watch_depths(self) -> None:
        """While a model has waiters here: its depth every ``queue_refresh``, sent when it changed."""
        while True:
            if not self._depths:
                self._tracking.clear()
                await self._tracking.wait()
            await asyncio.sleep(self.queue_refresh)
            for name, last in list(self._depths.items()):
                depth = self._depth(name)
                if depth != last:
                    self._send({"t": "depth", "model": name, "n": depth})
                if depth <= 0:
                    del self._depths[name]
                else:
                    self._depths[name] = depth

    # -- the connection -------------------------------------------------------------------------------
    def _send(self, msg: Message) -> bool:
        w = self._writer
        if w is None or w.is_closing():
            return False
        w.write(encode(msg))
        return True

    async def _connection(self) -> None:
        lost = False  # logged once per outage
        while True:
            try:
                reader, writer = await asyncio.open_unix_connection(self.path)
            except OSError:
                await asyncio.sleep(self._backoff.next())
                continue
            self._writer = writer
            # a new owner knows nothing of this worker yet: its depths, its unanswered wakes, and a wake
            # (answer ignored) for every model it still holds requests for, so that the new owner
            # queues a GPUGroup member again and clears the queue once nobody waits
            for name, depth in self._depths.items():
                self._send({"t": "depth", "model": name, "n": depth})
            pending: set[str] = set()
            for wid, (name, _) in self._wakes.items():
                self._send({"t": "wake", "id": wid, "model": name})
                pending.add(name)
            for name, depth in self._depths.items():
                if depth > 0 and name not in pending and self.snapshots:
                    self._send({"t": "wake", "id": 0, "model": name})
            why = "closed"
            try:
                while True:
                    self._apply(await read_message(reader))
                    if lost and self.snapshots and self._synced.is_set():
                        log.info("inventory owner back: %d models", len(self._index.views))
                        lost = False
                    self._backoff.reset()
            except asyncio.IncompleteReadError:
                pass
            except (OSError, ValueError) as exc:
                why = f"{type(exc).__name__}: {exc}"
            finally:
                self._writer = None
                writer.close()
                with contextlib.suppress(Exception):
                    await writer.wait_closed()
            if not lost:
                log.warning("inventory owner connection %s; serving the last inventory (%d models), reconnecting",
                            why, len(self._index.views))
                lost = True
            await asyncio.sleep(self._backoff.next())

    def _apply(self, msg: Message) -> None:
        t = msg["t"]
        if t == "index":
            old, new = self._index, index_from_message(msg)
            self._index = new
            self.snapshots += 1
            self._synced.set()
            self._notify([v for v in new.ordered if old.views.get(v.name) != v])
        elif t == "views":
            changed = [view_from_dict(d) for d in msg["views"]]
            self._index = self._index.with_views(changed)
            self._notify(changed)
        elif t == "woke":
            entry = self._wakes.get(msg["id"])
            if entry is not None and not entry[1].done():
                entry[1].set_result(msg.get("error"))
        else:
            log.debug("ignoring a %r message from the inventory owner", t)

    def _notify(self, changed: list[ModelView]) -> None:
        for v in changed:
            for cb in self._subscribers:
                try:
                    cb(v)
                except Exception:
                    log.exception("inventory subscriber failed for %s", v.name)
