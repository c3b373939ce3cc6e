"""The reconcile machinery shared by every kind: work queues, the writer, and Kubernetes Events.

Owns:

- ``WorkQueue``: level-based reconciles keyed by object. Triggers coalesce (a key is queued once,
  at its earliest due time); one key is never reconciled twice at the same time; a reconcile's
  answer (``Result.requeue_after``) schedules the next one; a failure backs off exponentially per
  key (:class:`~flexinfer.k8s.backoff.Backoff`, no jitter; a longer ``KubeAPIError.retry_after``
  wins). ``run_now`` runs a reconcile inline (kopf change handlers use it to turn an unusable spec
  into ``PermanentError``); a failed one is queued for retry as well. Each reconcile
  is counted and timed in the queue's ``OperatorMetrics`` when it has one (``kind`` = the queue's
  name).
- ``Writer``: the only place that writes: ``ensure`` (create, adopt on 409 AlreadyExists, or patch
  only what differs, see ``diff``), ``delete``, ``patch_status`` (managed status fields only),
  finalizer add/remove guarded by the resourceVersion (409 on a race, then a fresh reconcile).
  Every answer is reported to the ``Store`` overlay.
- ``EventRecorder``: core/v1 Events for transitions, posted in the background, best effort.

Must not: know any kind's rules (those are pure functions in the per-kind modules).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import os
import time
from collections.abc import Awaitable, Callable, Hashable, Mapping
from datetime import UTC, datetime
from typing import Any

from flexinfer.api.common import format_time
from flexinfer.k8s.backoff import Backoff
from flexinfer.k8s.errors import KubeAPIError
from flexinfer.operator.api_resources import EVENT, Kind
from flexinfer.operator.diff import merge_patch, strip_none
from flexinfer.operator.kubeapi import KubeClient
from flexinfer.operator.metrics import OperatorMetrics
from flexinfer.operator.results import Event, Result
from flexinfer.operator.store import Store, rv_of

log = logging.getLogger("flexinfer.operator")


ReconcileFn = Callable[[Any], Awaitable[Result]]


class WorkQueue:
    """Coalescing, per-key serial, delayed work queue (see the module docstring)."""

    def __init__(self, name: str, fn: ReconcileFn, *, workers: int = 8, retry_base_s: float = 1.0,
                 retry_max_s: float = 60.0, clock: Callable[[], float] = time.monotonic,
                 metrics: OperatorMetrics | None = None) -> None:
        self.name = name
        self.metrics = metrics
        self.fn = fn
        self.workers = workers
        self.backoff = Backoff(retry_base_s, retry_max_s, jitter=(1.0, 1.0))  # the count is per key
        self.clock = clock
        self._due: dict[Hashable, float] = {}
        self._heap: list[tuple[float, int, Hashable]] = []
        self._seq = itertools.count()
        self._locks: dict[Hashable, asyncio.Lock] = {}
        self._running: set[Hashable] = set()
        self._deferred: set[Hashable] = set()
        self._failures: dict[Hashable, int] = {}
        self._wakeup = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.reconciles = 0
        self.errors = 0

    # ---- triggers ---------------------------------------------------------------------------------

    def trigger(self, key: Hashable, delay: float = 0.0) -> None:
        """Reconcile ``key`` in ``delay`` seconds (or earlier if it is already due earlier)."""
        due = self.clock() + max(0.0, delay)
        cur = self._due.get(key)
        if cur is not None and cur <= due:
            return
        self._due[key] = due
        heapq.heappush(self._heap, (due, next(self._seq), key))
        self._wakeup.set()

    def pending(self, key: Hashable) -> float | None:
        """Seconds until ``key`` is due (None when not queued)."""
        due = self._due.get(key)
        return None if due is None else max(0.0, due - self.clock())

    def depth(self) -> int:
        """Keys due now and not running (``flexinfer_operator_queue_depth``; delayed keys are not counted)."""
        now = self.clock()
        return sum(1 for k, d in self._due.items() if d <= now and k not in self._running)

    def _observe(self, result: str, t0: float) -> None:
        if self.metrics is not None:
            self.metrics.reconciled(self.name, result, time.perf_counter() - t0)

    @staticmethod
    def _outcome(result: Result) -> str:
        return "permanent" if result.permanent else ("requeue" if result.requeue_after is not None else "ok")

    @property
    def busy(self) -> bool:
        """Something is running or due now."""
        now = self.clock()
        return bool(self._running) or any(d <= now for d in self._due.values())

    def _lock(self, key: Hashable) -> asyncio.Lock:
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        return lock

    def _release(self, key: Hashable) -> None:
        lock = self._locks.get(key)
        if lock is not None and not lock.locked() and key not in self._due:
            del self._locks[key]

    # ---- running ----------------------------------------------------------------------------------

    async def run_now(self, key: Hashable) -> Result:
        """Reconcile ``key`` now, inline; exceptions propagate. Queued work for it is replaced."""
        self._due.pop(key, None)
        async with self._lock(key):
            self.reconciles += 1
            t0 = time.perf_counter()
            try:
                result = await self.fn(key)
            except Exception as e:
                self._observe("error", t0)
                # The queue retries it too: the caller's own retry is not guaranteed (kopf forgets a
                # failed handler until the object's next event when its progress patch fails, F19).
                self._retry_later(key, e)
                raise
            self._observe(self._outcome(result), t0)
        self._failures.pop(key, None)
        if result.requeue_after is not None:
            self.trigger(key, result.requeue_after)
        self._release(key)
        return result

    def _retry_later(self, key: Hashable, e: Exception) -> float:
        """Count a failed reconcile of ``key`` and queue its retry after the per-key backoff."""
        self.errors += 1
        n = self._failures[key] = self._failures.get(key, 0) + 1
        delay = self.backoff.delay(n, e.retry_after if isinstance(e, KubeAPIError) else None)
        self.trigger(key, delay)
        return delay

    async def _process(self, key: Hashable) -> None:
        self._running.add(key)
        t0 = time.perf_counter()
        try:
            async with self._lock(key):
                self.reconciles += 1
                t0 = time.perf_counter()
                result = await self.fn(key)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self._observe("error", t0)
            delay = self._retry_later(key, e)
            if isinstance(e, KubeAPIError):
                log.info("%s %s: %s; retry in %.1fs", self.name, key, e, delay)
            else:
                log.exception("%s %s: reconcile failed; retry in %.1fs", self.name, key, delay)
        else:
            self._observe(self._outcome(result), t0)
            self._failures.pop(key, None)
            if result.requeue_after is not None:
                self.trigger(key, result.requeue_after)
        finally:
            self._running.discard(key)
            if key in self._deferred:
                self._deferred.discard(key)
                self.trigger(key)
            self._release(key)

    async def _next(self) -> Hashable:
        while True:
            now = self.clock()
            while self._heap:
                due, _, key = self._heap[0]
                if self._due.get(key) != due:
                    heapq.heappop(self._heap)  # superseded entry
                    continue
                if due > now:
                    break
                heapq.heappop(self._heap)
                del self._due[key]
                if key in self._running:
                    self._deferred.add(key)
                    continue
                return key
            timeout = self._heap[0][0] - now if self._heap else None
            self._wakeup.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), timeout)

    async def _worker(self) -> None:
        while True:
            key = await self._next()
            await self._process(key)

    def start(self) -> None:
        if not self._tasks:
            self._tasks = [asyncio.create_task(self._worker(), name=f"{self.name}-worker-{i}")
                           for i in range(self.workers)]

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._tasks = []


# ---- events ---------------------------------------------------------------------------------------


class EventRecorder:
    """Posts core/v1 Events in the background (bounded queue; dropped, never blocking, on overload)."""

    def __init__(self, kube: KubeClient | None, component: str = "flexinfer-operator", maxsize: int = 2000) -> None:
        self.kube = kube
        self.component = component
        self.instance = os.environ.get("HOSTNAME") or "flexinfer-operator"
        self._queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize)
        self._task: asyncio.Task[None] | None = None
        self.posted = 0
        self.dropped = 0

    def record(self, obj: Mapping[str, Any], event: Event) -> None:
        md = obj.get("metadata") or {}
        now = format_time(datetime.now(tz=UTC))
        ns = md.get("namespace") or "default"
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{md.get('name')}.", "namespace": ns},
            "involvedObject": {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"),
                               "name": md.get("name"), "namespace": ns, "uid": md.get("uid")},
            "type": event.type, "reason": event.reason, "message": event.message[:1024],
            "source": {"component": self.component}, "reportingComponent": self.component,
            "reportingInstance": self.instance, "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        }
        log.info("event %s/%s %s %s: %s", ns, md.get("name"), event.type, event.reason, event.message)
        try:
            self._queue.put_nowait(body)
        except asyncio.QueueFull:
            self.dropped += 1

    async def _run(self) -> None:
        while True:
            body = await self._queue.get()
            if self.kube is None:
                continue
            try:
                await self.kube.create(EVENT, body["metadata"]["namespace"], body)
                self.posted += 1
            except KubeAPIError as e:
                self.dropped += 1
                log.warning("event for %s not posted: %s", body["involvedObject"]["name"], e)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="flexinfer-events")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None


# ---- the writer -----------------------------------------------------------------------------------


def _ns_name(obj: Mapping[str, Any]) -> tuple[str | None, str]:
    md = obj.get("metadata") or {}
    return md.get("namespace"), str(md.get("name"))


class Writer:
    """Every write of the reconcilers (see the module docstring)."""

    def __init__(self, kube: KubeClient, store: Store) -> None:
        self.kube = kube
        self.store = store

    async def ensure(self, kind: Kind, desired: Mapping[str, Any], *, owned: tuple[tuple[str, ...], ...] = (),
                     immutable: tuple[str, ...] = ()) -> tuple[bool, Mapping[str, Any]]:
        """Create ``desired`` or patch the fields of it that differ. Returns (wrote, object).

        ``immutable`` names top-level ``spec`` keys that cannot change (a Deployment's selector): when
        one differs, the object is deleted and created again on the next reconcile.
        """
        ns, name = _ns_name(desired)
        observed = self.store.get(kind, ns, name)
        if observed is None:
            try:
                created = await self.kube.create(kind, ns, strip_none(desired))
            except KubeAPIError as e:
                if not e.conflict:
                    raise
                observed = await self.kube.get(kind, ns, name)  # adopt what is there
                if observed is None:
                    raise
                self.store.wrote(kind, None, observed)
            else:
                self.store.wrote(kind, None, created)
                return True, created
        spec_d, spec_o = desired.get("spec") or {}, observed.get("spec") or {}
        for key in immutable:
            if key in spec_d and spec_d[key] != spec_o.get(key):
                await self.delete(kind, observed)
                raise KubeAPIError(409, f"{kind.kind} {ns}/{name}: spec.{key} changed; recreating",
                                   reason="Immutable")
        patch = merge_patch(desired, observed, owned)
        patch.pop("apiVersion", None)
        patch.pop("kind", None)
        if not patch:
            return False, observed
        after = await self.kube.patch(kind, ns, name, patch)
        if after is None:
            self.store.deleted(kind, ns, name, observed)
            raise KubeAPIError(404, f"{kind.kind} {ns}/{name} disappeared while patching", reason="NotFound")
        self.store.wrote(kind, observed, after)
        return True, after

    async def create_if_missing(self, kind: Kind, desired: Mapping[str, Any]) -> tuple[bool, Mapping[str, Any]]:
        """Create ``desired`` unless an object of that name exists (PVCs, Jobs: immutable specs)."""
        ns, name = _ns_name(desired)
        observed = self.store.get(kind, ns, name)
        if observed is not None:
            return False, observed
        try:
            created = await self.kube.create(kind, ns, strip_none(desired))
        except KubeAPIError as e:
            if not e.conflict:
                raise
            got = await self.kube.get(kind, ns, name)
            if got is None:
                raise
            self.store.wrote(kind, None, got)
            return False, got
        self.store.wrote(kind, None, created)
        return True, created

    async def delete(self, kind: Kind, obj: Mapping[str, Any]) -> bool:
        ns, name = _ns_name(obj)
        gone = await self.kube.delete(kind, ns, name)
        self.store.deleted(kind, ns, name, obj)
        return gone

    async def patch_status(self, kind: Kind, obj: Mapping[str, Any], desired: Mapping[str, Any],
                           owned: tuple[tuple[str, ...], ...] = ()) -> Mapping[str, Any] | None:
        """Merge-patch ``status`` with the managed fields of ``desired`` that differ; None when equal."""
        patch = merge_patch({"status": dict(desired)}, {"status": obj.get("status") or {}},
                            tuple(("status", *p) for p in owned))
        if not patch:
            return None
        ns, name = _ns_name(obj)
        after = await self.kube.patch(kind, ns, name, patch, sub="status")
        if after is not None:
            self.store.wrote(kind, obj, after)
        return after

    async def patch(self, kind: Kind, obj: Mapping[str, Any], patch: Mapping[str, Any], *,
                    guard: bool = False) -> Mapping[str, Any] | None:
        """Merge-patch the main object; ``guard`` adds the resourceVersion precondition (409 on a race)."""
        ns, name = _ns_name(obj)
        body = dict(patch)
        if guard:
            md = dict(body.get("metadata") or {})
            md["resourceVersion"] = rv_of(obj)
            body["metadata"] = md
        after = await self.kube.patch(kind, ns, name, body)
        if after is not None:
            self.store.wrote(kind, obj, after)
        return after

    async def add_finalizer(self, kind: Kind, obj: Mapping[str, Any], finalizer: str) -> Mapping[str, Any]:
        fins = list((obj.get("metadata") or {}).get("finalizers") or [])
        if finalizer in fins:
            return obj
        after = await self.patch(kind, obj, {"metadata": {"finalizers": [*fins, finalizer]}}, guard=True)
        if after is None:
            raise KubeAPIError(404, "object disappeared while adding the finalizer", reason="NotFound")
        return after

    async def remove_finalizer(self, kind: Kind, obj: Mapping[str, Any], finalizer: str) -> None:
        fins = list((obj.get("metadata") or {}).get("finalizers") or [])
        if finalizer not in fins:
            return
        await self.patch(kind, obj, {"metadata": {"finalizers": [f for f in fins if f != finalizer]}}, guard=True)
