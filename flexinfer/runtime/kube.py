"""The ``kube`` runtime: models are custom resources in a cluster; the proxy watches and signals demand.

Owns, for the ``proxy --kube`` command:

- the **inventory**: resumable watches (:mod:`flexinfer.k8s.reflector`) of Model (v1alpha2),
  ModelDeployment (v1alpha1), LoRAAdapter, GPUGroup, Services and EndpointSlices in the proxy's
  namespace (or all) and of Nodes labelled ``flexinfer.ai/spot-terminating``; each event updates the
  local state (:mod:`flexinfer.runtime.kubeviews`), rebuilds only the affected models' views and swaps
  in a new immutable index. ``resolve`` is one dict lookup; no request ever calls the API. A view that
  turns ready (the resource Ready *and* a ready endpoint) is published to subscribers, which is what
  releases the activator's waiters: readiness comes from watch events, never from polling.
- the **scaler**: demand is ``status.lastActiveTime`` on a Model (merge patch on the status
  subresource), ``status.lastAccessTime`` on a ModelDeployment, single-flight per model, retried with
  backoff on 409/429/5xx; ``record_demand`` only schedules it, at most once per ``demand_interval``
  (60 s) and every ``heartbeat_interval`` (30 s) while a request to the model is open. ``wake`` also
  sets ``spec.replicas=1`` on a ModelDeployment at zero, or, for a GPUGroup member, writes the group's
  ``flexinfer.ai/queue.<m>``/``queue-since.<m>`` annotations (depth kept current) and clears them
  once the member is active and ready (or nobody waits any more).

Must not: be imported by the proxy package (only ``cmd/proxy.py`` wires it, lazily); call the API
on the request path (``record_demand`` is a few comparisons and maybe a task); poll for readiness.
Authentication runs before ``record_demand``/``wake`` in the pipeline, so anonymous traffic wakes
nothing.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import aiohttp
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client.exceptions import ApiException

from flexinfer import labels
from flexinfer.api import GROUP, format_time
from flexinfer.api.gpugroup import GPU_GROUP as GPU_GROUP_KIND
from flexinfer.api.lora import LORA_ADAPTER as LORA_KIND
from flexinfer.api.model import MODEL as MODEL_KIND
from flexinfer.api.modeldeployment import MODEL_DEPLOYMENT as MODEL_DEPLOYMENT_KIND
from flexinfer.api.schema import KindDef
from flexinfer.k8s.backoff import Backoff
from flexinfer.k8s.client import new_api_client
from flexinfer.k8s.errors import KubeAPIError
from flexinfer.k8s.reflector import ResourceWatch
from flexinfer.runtime.base import NO_LOAD, LoadView, ModelView
from flexinfer.runtime.kubeviews import (
    EMPTY_INDEX,
    GPU_GROUP,
    LORA,
    MODEL,
    MODEL_DEPLOYMENT,
    NODE,
    SERVICE,
    SLICE,
    Claims,
    ClusterState,
    Index,
    Key,
    NsName,
)

log = logging.getLogger("flexinfer.kube")

MERGE_PATCH = "application/merge-patch+json"


class WakeError(RuntimeError):
    """A model cannot be woken; the message says why (it reaches every waiting client)."""


@dataclass(frozen=True, slots=True)
class KubeTimings:
    """Intervals of the kube runtime (defaults follow the original proxy; tests shrink them)."""

    demand_interval: float = 60.0  # at most one demand patch per model per this, after the first
    heartbeat_interval: float = 30.0  # ... and one per this while a request to the model is open
    heartbeat_tick: float = 5.0  # how often open requests are looked at
    queue_refresh: float = 1.0  # GPUGroup queue depth is rewritten at most this often
    patch_attempts: int = 5  # tries per patch (409, 429, 5xx and transport errors are retried)
    patch_backoff: float = 0.2  # first retry delay (doubling, jittered)
    patch_backoff_cap: float = 2.0
    failure_cooldown: float = 5.0  # after a failed demand patch, record_demand waits this long
    request_timeout: float = 10.0  # per API request (watches: connect timeout)
    watch_backoff: float = 0.5  # first delay after a watch failure (doubling, jittered)
    watch_backoff_cap: float = 30.0
    watch_timeout: float = 300.0  # server-side watch timeout (x1..2, spread like client-go)
    watch_min_stream: float = 1.0  # a stream shorter than this without news counts as a failure
    sync_timeout: float = 10.0  # start() waits this long for the first lists


@dataclass(slots=True)
class _Demand:
    last: float = -math.inf  # monotonic time of the last successful demand patch
    retry_at: float = -math.inf  # record_demand does not retry a failed patch before this
    task: asyncio.Task[None] | None = None


@dataclass(slots=True)
class _GroupWait:
    view_name: str
    ns: str
    name: str  # the ModelDeployment
    group: NsName
    since: str
    depth: int
    written_at: float
    deadline: float
    task: asyncio.Task[None] | None = None


class KubeRuntime:
    """Inventory + Scaler backed by the Kubernetes API. ``await start()`` in the serving loop."""

    def __init__(self, namespace: str, *, all_namespaces: bool = False, api_client: Any = None,
                 timings: KubeTimings = KubeTimings(), watch_nodes: bool = True,
                 clock: Callable[[], float] = time.monotonic, load: LoadView = NO_LOAD) -> None:
        self.namespace = namespace
        self.all_namespaces = all_namespaces
        self.timings = timings
        self.watch_nodes = watch_nodes
        self.clock = clock
        self.state = ClusterState(namespace, all_namespaces)
        self.load = load  # the proxy's open requests per endpoint and queue depth per model
        self.watches: dict[str, ResourceWatch] = {}
        self._api = api_client
        self._own_api = api_client is None
        self._index: Index = EMPTY_INDEX
        self._entries: dict[Key, tuple[ModelView, Claims]] = {}
        self._keys: dict[str, Key] = {}  # view name -> resource
        self._subscribers: list[Callable[[ModelView], None]] = []
        self._index_listeners: list[Callable[[Index, bool, list[ModelView]], None]] = []
        self._demand: dict[str, _Demand] = {}
        self._group_waits: dict[str, _GroupWait] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._changed = asyncio.Event()

    # -- Inventory ----------------------------------------------------------------------------------
    def resolve(self, name: str) -> ModelView | None:
        return self._index.by_name.get(name)

    def models(self) -> Iterable[ModelView]:
        return self._index.ordered

    def subscribe(self, callback: Callable[[ModelView], None]) -> None:
        self._subscribers.append(callback)

    @property
    def index(self) -> Index:
        """The current name index (immutable; replaced on every change)."""
        return self._index

    def on_index(self, callback: Callable[[Index, bool, list[ModelView]], None]) -> None:
        """Call ``callback(index, rebuilt, changed)`` after every swap of the index, before the
        subscribers hear of ``changed``: ``rebuilt`` when models or their names came or went (the
        index was built anew), else ``index`` is the old one with the ``changed`` views replaced
        (``Index.with_views``). The inventory owner mirrors the index to the workers with it."""
        self._index_listeners.append(callback)

    # -- lifecycle ----------------------------------------------------------------------------------
    async def start(self) -> None:
        """Start the watches and wait (up to ``sync_timeout``) for their first lists; a watch refused
        with 401/403/404 (no RBAC, CRD not installed) is not waited for and keeps retrying slowly."""
        if self._api is None:
            self._api = await new_api_client()
        co = k8s.CustomObjectsApi(self._api)
        core = k8s.CoreV1Api(self._api)
        disc = k8s.DiscoveryV1Api(self._api)
        ns = self.namespace
        for kind, kd in ((MODEL, MODEL_KIND), (MODEL_DEPLOYMENT, MODEL_DEPLOYMENT_KIND), (LORA, LORA_KIND),
                         (GPU_GROUP, GPU_GROUP_KIND)):
            if self.all_namespaces:
                self._watch(kind, co.list_cluster_custom_object, (GROUP, kd.version, kd.plural))
            else:
                self._watch(kind, co.list_namespaced_custom_object, (GROUP, kd.version, ns, kd.plural))
        if self.all_namespaces:
            self._watch(SERVICE, core.list_service_for_all_namespaces, ())
            self._watch(SLICE, disc.list_endpoint_slice_for_all_namespaces, ())
        else:
            self._watch(SERVICE, core.list_namespaced_service, (ns,))
            self._watch(SLICE, disc.list_namespaced_endpoint_slice, (ns,))
        if self.watch_nodes:
            self._watch(NODE, core.list_node, (), label_selector=labels.SPOT_TERMINATING)
        for w in self.watches.values():
            self._spawn(w.run(), f"watch {w.name}")
        self._spawn(self._heartbeat(), "demand heartbeat")
        waits = [asyncio.ensure_future(w.settled.wait()) for w in self.watches.values()]
        _done, pending = await asyncio.wait(waits, timeout=self.timings.sync_timeout)
        for p in pending:
            p.cancel()
        late = [f"{w.name} ({w.last_error or 'no answer'})" for w in self.watches.values() if not w.synced.is_set()]
        if late:
            log.warning("not listed yet (retrying in the background): %s", "; ".join(late))
        log.info("kube inventory: %d models in %s", len(self._index.views),
                 "all namespaces" if self.all_namespaces else f"namespace {ns}")

    async def stop(self) -> None:
        """Stop watches and timers (queue annotations are cleared first), close the client."""
        waits = [w.task for w in self._group_waits.values() if w.task is not None]
        for t in waits:
            t.cancel()
        if waits:
            await asyncio.gather(*waits, return_exceptions=True)
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._own_api and self._api is not None:
            await self._api.close()
            self._api = None

    def _watch(self, kind: str, fn: Any, args: tuple[Any, ...], **kwargs: Any) -> None:
        t = self.timings
        self.watches[kind] = ResourceWatch(
            kind, fn, args, kwargs,
            on_sync=lambda items: self._on_sync(kind, items),
            on_event=lambda typ, obj: self._on_event(kind, typ, obj),
            backoff=Backoff(t.watch_backoff, t.watch_backoff_cap), watch_timeout=t.watch_timeout,
            request_timeout=t.request_timeout, min_stream=t.watch_min_stream)

    def _spawn(self, coro: Coroutine[Any, Any, Any], what: str) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro, name=what)
        self._tasks.add(task)

        def done(t: asyncio.Task[Any]) -> None:
            self._tasks.discard(t)
            if not t.cancelled() and t.exception() is not None:
                log.warning("%s failed: %s", what, t.exception())

        task.add_done_callback(done)
        return task

    # -- inventory updates ----------------------------------------------------------------------------
    def _on_sync(self, kind: str, items: list[dict[str, Any]]) -> None:
        try:
            self.state.replace(kind, items)
            self._rebuild(None)
        except Exception:  # a bug here must not stop the watch (it would replay the list forever)
            log.exception("applying the list of %s failed", kind)

    def _on_event(self, kind: str, typ: str, obj: dict[str, Any]) -> None:
        try:
            self._rebuild(self.state.apply(kind, typ, obj))
        except Exception:  # ... nor replay one bad event forever
            log.exception("applying a %s event of %s failed", typ, kind)

    def _rebuild(self, affected: set[Key] | None) -> None:
        """Recompute the views of ``affected`` models (None: all), swap the index, notify changes."""
        keys = set(self.state.model_keys()) | set(self._entries) if affected is None else affected
        changed: list[ModelView] = []
        reindex = False
        for key in keys:
            new = self.state.build(key)
            old = self._entries.get(key)
            if new is None:
                if old is not None:
                    del self._entries[key]
                    if self._keys.get(old[0].name) == key:
                        del self._keys[old[0].name]
                    reindex = True
                continue
            if old is None or old[1] != new[1] or old[0].name != new[0].name:
                reindex = True
                if old is not None and old[0].name != new[0].name and self._keys.get(old[0].name) == key:
                    del self._keys[old[0].name]
            if old is None or old[0] != new[0]:
                changed.append(new[0])
            self._entries[key] = new
            self._keys[new[0].name] = key
        if reindex:
            self._index = Index.build(self._entries.values())
        elif changed:
            self._index = self._index.with_views(changed)
        if reindex or changed:
            for listener in self._index_listeners:
                try:
                    listener(self._index, reindex, changed)
                except Exception:  # a listener must not break the watch
                    log.exception("inventory index listener failed")
        for v in changed:
            for cb in self._subscribers:
                try:
                    cb(v)
                except Exception:  # a subscriber must not break the watch
                    log.exception("inventory subscriber failed for %s", v.name)
        self._changed.set()  # GPUGroup waits look again
        self._changed = asyncio.Event()

    # -- Scaler: demand -------------------------------------------------------------------------------
    def record_demand(self, model: ModelView) -> None:
        """Cheap: maybe schedule a demand patch (never awaited here)."""
        d = self._demand.get(model.name)
        if d is None:
            d = self._demand[model.name] = _Demand()
        if d.task is not None:
            return
        now = self.clock()
        if now - d.last < self.timings.demand_interval or now < d.retry_at:
            return
        d.task = self._spawn(self._signal(model.name, d), f"demand {model.name}")

    async def _signal(self, name: str, d: _Demand) -> None:
        try:
            key = self._keys.get(name)
            if key is None:
                raise WakeError(f"model {name!r} is no longer in the cluster")
            kind, ns, obj = key
            now = format_time(datetime.now(tz=UTC))
            if kind == MODEL:
                await self._patch(MODEL_KIND, ns, obj, {"status": {"lastActiveTime": now}}, status=True)
            else:
                await self._patch(MODEL_DEPLOYMENT_KIND, ns, obj, {"status": {"lastAccessTime": now}}, status=True)
            d.last = self.clock()
        except BaseException:
            d.retry_at = self.clock() + self.timings.failure_cooldown
            raise
        finally:
            d.task = None

    async def _heartbeat(self) -> None:
        """Every ``heartbeat_tick``: a model with open requests gets a demand patch per heartbeat interval."""
        t = self.timings
        while True:
            await asyncio.sleep(t.heartbeat_tick)
            now = self.clock()
            for name, view in self._index.views.items():
                if not view.endpoints or not any(self.load.in_flight(e.key) > 0 for e in view.endpoints):
                    continue
                d = self._demand.get(name)
                if d is None:
                    d = self._demand[name] = _Demand()
                if d.task is None and now - d.last >= t.heartbeat_interval and now >= d.retry_at:
                    d.task = self._spawn(self._signal(name, d), f"demand {name}")

    # -- Scaler: wake ----------------------------------------------------------------------------------
    async def wake(self, model: ModelView) -> None:
        """Signal demand (joining one in flight) and ask for a replica; returns once asked."""
        key = self._keys.get(model.name)
        if key is None:
            raise WakeError(f"model {model.name!r} is no longer in the cluster")
        kind, ns, name = key
        self._check_failed(key)
        d = self._demand.get(model.name)
        if d is None:
            d = self._demand[model.name] = _Demand()
        if d.task is None and self.clock() - d.last >= self.timings.demand_interval:
            d.task = self._spawn(self._signal(model.name, d), f"demand {model.name}")
        if d.task is not None:
            await asyncio.shield(d.task)  # a cancelled wake leaves the patch running
        if kind != MODEL_DEPLOYMENT:
            return
        group = self.state.group_of(ns, name)
        if group is not None:
            await asyncio.shield(self._enqueue(model.name, ns, name, group))
            return
        md = self.state.deployments.get((ns, name))
        if md is not None and md.spec.replicas < 1:
            await asyncio.shield(self._patch(MODEL_DEPLOYMENT_KIND, ns, name, {"spec": {"replicas": 1}}))

    def _check_failed(self, key: Key) -> None:
        kind, ns, name = key
        if kind == MODEL:
            m = self.state.models.get((ns, name))
            if m is not None and m.status.phase == "Failed":
                c = m.status.condition("Ready")
                why = f"{c.reason}: {c.message}" if c is not None and (c.reason or c.message) else "phase Failed"
                raise WakeError(f"model {name!r} has failed ({why})")
        else:
            md = self.state.deployments.get((ns, name))
            if md is not None and md.status.phase == "Failed":
                raise WakeError(f"model deployment {name!r} has failed")

    # -- Scaler: GPUGroup queue -------------------------------------------------------------------------
    async def _enqueue(self, view_name: str, ns: str, name: str, group: NsName) -> None:
        w = self._group_waits.get(view_name)
        if w is not None and w.task is not None and not w.task.done():
            return  # already queued; the wait keeps the depth current
        depth = max(1, self.load.queue_depth(view_name) or 1)
        since = format_time(datetime.now(tz=UTC))
        await self._patch(GPU_GROUP_KIND, group[0], group[1], {"metadata": {"annotations": {
            labels.queue_key(name): str(depth), labels.queue_since_key(name): since}}})
        view = self.resolve(view_name)
        wait_s = (view.cold_start_timeout if view is not None and view.cold_start_timeout else 120.0)
        now = self.clock()
        w = _GroupWait(view_name, ns, name, group, since, depth, now, now + wait_s)
        self._group_waits[view_name] = w
        w.task = self._spawn(self._group_wait(w), f"gpugroup queue {name}")

    def _active_and_ready(self, w: _GroupWait) -> bool:
        g = self.state.groups.get(w.group)
        view = self._index.views.get(w.view_name)
        return (g is not None and g.status.active_model == w.name and view is not None and view.ready
                and bool(view.endpoints))

    async def _group_wait(self, w: _GroupWait) -> None:
        """Keep the queue depth current until the member is active and ready (or nobody waits)."""
        t = self.timings
        try:
            while True:
                changed = self._changed
                if self._active_and_ready(w):
                    break
                depth = self.load.queue_depth(w.view_name)
                if depth is not None and depth <= 0:
                    break
                now = self.clock()
                if now >= w.deadline:
                    break
                if depth is not None and depth != w.depth and now - w.written_at >= t.queue_refresh:
                    w.depth, w.written_at = depth, now
                    try:
                        await self._patch(GPU_GROUP_KIND, w.group[0], w.group[1], {"metadata": {"annotations": {
                            labels.queue_key(w.name): str(depth)}}})
                    except WakeError as exc:
                        log.warning("updating the queue of %s failed: %s", w.name, exc)
                try:
                    await asyncio.wait_for(changed.wait(), timeout=t.queue_refresh)
                except TimeoutError:
                    pass
        finally:
            if self._group_waits.get(w.view_name) is w:
                del self._group_waits[w.view_name]
            try:
                await asyncio.wait_for(self._patch(GPU_GROUP_KIND, w.group[0], w.group[1], {"metadata": {
                    "annotations": {labels.queue_key(w.name): None, labels.queue_since_key(w.name): None}}}),
                    timeout=max(2.0, t.request_timeout))
            except (WakeError, TimeoutError) as exc:
                log.warning("clearing the queue annotations of %s failed: %s", w.name, exc)

    # -- patches ------------------------------------------------------------------------------------------
    async def _patch(self, kd: KindDef, ns: str, name: str, body: dict[str, Any], *, status: bool = False) -> None:
        """A merge patch, retried with backoff on conflicts, throttling, server and transport errors."""
        assert self._api is not None, "start() first"
        t = self.timings
        co = k8s.CustomObjectsApi(self._api)
        fn: Any = co.patch_namespaced_custom_object_status if status else co.patch_namespaced_custom_object
        backoff = Backoff(t.patch_backoff, t.patch_backoff_cap)
        what = f"{kd.plural}{'/status' if status else ''} {ns}/{name}"
        for attempt in range(1, t.patch_attempts + 1):
            try:
                await fn(GROUP, kd.version, ns, kd.plural, name, body, _content_type=MERGE_PATCH,
                         _request_timeout=t.request_timeout)
                return
            except ApiException as exc:
                err = KubeAPIError.from_api_exception(exc)
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                err = KubeAPIError(0, f"{type(exc).__name__}: {exc}")
            if not err.retryable or attempt == t.patch_attempts:
                raise WakeError(_readable(err, what, attempt)) from None
            delay = backoff.next(err.retry_after)
            log.info("patch %s: HTTP %d %s; retry %d in %.2fs", what, err.status, err.detail, attempt, delay)
            await asyncio.sleep(delay)


def _readable(err: KubeAPIError, what: str, attempts: int) -> str:
    if err.status == 404:
        return f"{what} not found (deleted?)"
    if err.status in (401, 403):
        return (f"the proxy may not patch {what} (HTTP {err.status}: {err.detail}); grant its ServiceAccount "
                "'patch' on it (README: Running in a cluster)")
    tries = f" after {attempts} attempts" if attempts > 1 else ""
    code = f"HTTP {err.status}" if err.status else "no answer"
    return f"patching {what} failed{tries} ({code}: {err.detail})"
