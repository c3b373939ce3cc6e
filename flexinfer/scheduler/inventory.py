"""In-memory inventory of the extender: Nodes, benchmark ConfigMaps and (for tenant fair share) Pods,
kept up to date by list+watch, so that no request makes an API call.

A :class:`Watcher` lists one resource, then watches it from the list's ``resourceVersion``; a
watch that ends is resumed from the last version seen (events and bookmarks move it), a 410 Gone
(expired version) re-lists, and errors back off exponentially (bounded, jittered). Events go through
:meth:`Watcher.apply_event`, which tests can call directly. Stores keep only the parsed facts the
logic needs. This module owns the Kubernetes reads of the extender and nothing else.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Protocol

import orjson

from flexinfer import labels
from flexinfer.scheduler.logic import NodeFacts, gpu_resources, node_facts, parse_float, static_score
from flexinfer.scheduler.settings import ExtenderSettings

log = logging.getLogger(__name__)

ListCall = Callable[..., Awaitable[Any]]
"""A kubernetes_asyncio list function (``CoreV1Api.list_node``, a partial of a namespaced one)."""

RestartHook = Callable[[str, str], None]
"""Called as ``hook(kind, reason)`` each time a watcher re-lists or backs off."""


class Store(Protocol):
    """Where a watcher puts what it sees."""

    def upsert(self, obj: Mapping[str, Any]) -> None: ...
    def delete(self, obj: Mapping[str, Any]) -> None: ...
    def replace(self, objs: Iterable[Mapping[str, Any]]) -> None: ...
    def __len__(self) -> int: ...


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


# ---- stores -------------------------------------------------------------------------------------------


class NodeStore:
    """Node name → :class:`NodeFacts`, and (with settings) name → the node-only part of the score."""

    def __init__(self, settings: ExtenderSettings | None = None) -> None:
        self.settings = settings
        self.facts: dict[str, NodeFacts] = {}
        self.static: dict[str, float] = {}

    def upsert(self, obj: Mapping[str, Any]) -> None:
        f = node_facts(obj)
        if f.name:
            self.facts[f.name] = f
            if self.settings is not None:
                self.static[f.name] = static_score(f, self.settings)

    def delete(self, obj: Mapping[str, Any]) -> None:
        name = str(_meta(obj).get("name") or "")
        self.facts.pop(name, None)
        self.static.pop(name, None)

    def replace(self, objs: Iterable[Mapping[str, Any]]) -> None:
        self.facts, self.static = {}, {}
        for o in objs:
            self.upsert(o)

    def __len__(self) -> int:
        return len(self.facts)


class ConfigMapStore:
    """Benchmark ConfigMaps only: the global one and ``*-benchmark-results``; (ns, name) → data."""

    def __init__(self, global_name: str = labels.BENCHMARK_CONFIGMAP) -> None:
        self.global_name = global_name
        self.data: dict[tuple[str, str], dict[str, str]] = {}

    def wanted(self, name: str) -> bool:
        return name == self.global_name or name.endswith(labels.BENCHMARK_CONFIGMAP_SUFFIX)

    def upsert(self, obj: Mapping[str, Any]) -> None:
        meta = _meta(obj)
        name, ns = str(meta.get("name") or ""), str(meta.get("namespace") or "")
        if not name or not self.wanted(name):
            return
        raw = obj.get("data")
        data = {str(k): str(v) for k, v in raw.items()} if isinstance(raw, Mapping) else {}
        self.data[(ns, name)] = data

    def delete(self, obj: Mapping[str, Any]) -> None:
        meta = _meta(obj)
        self.data.pop((str(meta.get("namespace") or ""), str(meta.get("name") or "")), None)

    def replace(self, objs: Iterable[Mapping[str, Any]]) -> None:
        self.data = {}
        for o in objs:
            self.upsert(o)

    def __len__(self) -> int:
        return len(self.data)


class PodUsageStore:
    """GPUs held per tenant by bound, unfinished pods (for the fair-share term)."""

    def __init__(self, tenant_label_key: str = "") -> None:
        self.tenant_label_key = tenant_label_key
        self.by_pod: dict[str, tuple[str, int]] = {}
        self.totals: dict[str, int] = {}

    def _key(self, obj: Mapping[str, Any]) -> str:
        meta = _meta(obj)
        return str(meta.get("uid") or f'{meta.get("namespace")}/{meta.get("name")}')

    def _tenant(self, obj: Mapping[str, Any]) -> str:
        meta = _meta(obj)
        lab = meta.get("labels")
        if self.tenant_label_key and isinstance(lab, Mapping) and lab.get(self.tenant_label_key):
            return str(lab[self.tenant_label_key])
        return str(meta.get("namespace") or "default")

    def _drop(self, key: str) -> None:
        old = self.by_pod.pop(key, None)
        if old is not None:
            tenant, n = old
            left = self.totals.get(tenant, 0) - n
            if left > 0:
                self.totals[tenant] = left
            else:
                self.totals.pop(tenant, None)

    def upsert(self, obj: Mapping[str, Any]) -> None:
        key = self._key(obj)
        self._drop(key)
        spec = obj.get("spec") if isinstance(obj.get("spec"), Mapping) else {}
        status = obj.get("status") if isinstance(obj.get("status"), Mapping) else {}
        assert isinstance(spec, Mapping) and isinstance(status, Mapping)
        if not spec.get("nodeName") or status.get("phase") in ("Succeeded", "Failed"):
            return
        n, _ = gpu_resources(obj)
        if n <= 0:
            return
        tenant = self._tenant(obj)
        self.by_pod[key] = (tenant, n)
        self.totals[tenant] = self.totals.get(tenant, 0) + n

    def delete(self, obj: Mapping[str, Any]) -> None:
        self._drop(self._key(obj))

    def replace(self, objs: Iterable[Mapping[str, Any]]) -> None:
        self.by_pod, self.totals = {}, {}
        for o in objs:
            self.upsert(o)

    def __len__(self) -> int:
        return len(self.by_pod)


# ---- watcher ---------------------------------------------------------------------------------------------


class Gone(Exception):
    """The watch's resourceVersion expired (410): re-list."""


class WatchError(Exception):
    """The apiserver sent an ERROR event other than 410, or a malformed answer."""


class APIStatusError(Exception):
    """A list or watch request answered with a non-2xx status (``status`` says which)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


async def _check_status(resp: Any, kind: str) -> None:
    """Raise :class:`APIStatusError` for a non-2xx raw response (kubernetes_asyncio does not when
    ``_preload_content=False``), releasing it."""
    status = int(getattr(resp, "status", 200))
    if 200 <= status < 300:
        return
    try:
        text = (await resp.content.read(4096)).decode("utf-8", "replace")
    except Exception:
        text = ""
    finally:
        resp.release()
    raise APIStatusError(status, f"{kind}: {text[:300]}")


class Watcher:
    """List+watch one resource kind into a :class:`Store`."""

    def __init__(self, kind: str, store: Store, call: ListCall | None = None, *,
                 timeout_seconds: int = 300, backoff_min: float = 0.5, backoff_max: float = 30.0,
                 on_restart: RestartHook | None = None, **selectors: str) -> None:
        self.kind = kind
        self.store = store
        self.call = call
        self.timeout_seconds = timeout_seconds
        self.backoff_min = backoff_min
        self.backoff_max = backoff_max
        self.on_restart = on_restart
        self.selectors = {k: v for k, v in selectors.items() if v}
        self.resource_version: str | None = None
        self.synced = asyncio.Event()
        self.events_applied = 0
        self.lists = 0
        self._failures = 0

    # -- pure-ish state changes ---------------------------------------------------------------------

    def apply_event(self, type_: str, obj: Mapping[str, Any]) -> None:
        """Apply one watch event (ADDED, MODIFIED, DELETED, BOOKMARK, ERROR)."""
        t = type_.upper()
        if t == "ERROR":
            code = obj.get("code") if isinstance(obj, Mapping) else None
            if code == 410:
                raise Gone(str(obj.get("message") or "resource version expired"))
            raise WatchError(f"watch error {code}: {obj.get('message') if isinstance(obj, Mapping) else obj}")
        rv = _meta(obj).get("resourceVersion")
        if t in ("ADDED", "MODIFIED"):
            self.store.upsert(obj)
        elif t == "DELETED":
            self.store.delete(obj)
        elif t != "BOOKMARK":
            log.debug("%s watch: ignoring event type %r", self.kind, type_)
            return
        if rv:
            self.resource_version = str(rv)
        self.events_applied += 1

    def apply_list(self, body: Mapping[str, Any]) -> None:
        """Replace the store with a list response and remember its resourceVersion."""
        items = body.get("items")
        self.store.replace(i for i in (items if isinstance(items, list) else []) if isinstance(i, Mapping))
        rv = _meta(body).get("resourceVersion")
        self.resource_version = str(rv) if rv else None
        self.lists += 1
        self.synced.set()

    # -- the loop -----------------------------------------------------------------------------------

    def _backoff(self) -> float:
        base = min(self.backoff_max, self.backoff_min * (2 ** min(self._failures, 16)))
        self._failures += 1
        return base * random.uniform(0.5, 1.0)

    def _restart(self, reason: str) -> None:
        if self.on_restart is not None:
            self.on_restart(self.kind, reason)

    async def list_once(self) -> None:
        """One list call (raw JSON, no model objects) applied to the store."""
        assert self.call is not None
        resp = await self.call(_preload_content=False, **self.selectors)
        await _check_status(resp, self.kind)
        try:
            body = orjson.loads(await resp.read())
        finally:
            resp.release()
        if not isinstance(body, Mapping):
            raise WatchError(f"{self.kind} list: unexpected body")
        self.apply_list(body)

    async def watch_once(self) -> None:
        """One watch request from ``resource_version`` until the server ends it."""
        assert self.call is not None
        resp = await self.call(
            watch=True, resource_version=self.resource_version or "", allow_watch_bookmarks=True,
            timeout_seconds=self.timeout_seconds, _request_timeout=self.timeout_seconds + 30,
            _preload_content=False, **self.selectors)
        await _check_status(resp, self.kind)
        buf = b""
        try:
            async for chunk in resp.content.iter_any():
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if line.strip():
                        self._apply_line(line)
            if buf.strip():
                self._apply_line(buf)
        finally:
            resp.release()

    def _apply_line(self, line: bytes) -> None:
        try:
            ev = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise WatchError(f"{self.kind} watch: bad event line: {exc}") from None
        if not isinstance(ev, Mapping) or not isinstance(ev.get("object"), Mapping):
            raise WatchError(f"{self.kind} watch: malformed event")
        self.apply_event(str(ev.get("type") or ""), ev["object"])
        self._failures = 0

    async def run(self) -> None:
        """List, then watch forever (until cancelled), re-listing on 410 and backing off on errors."""
        need_list = True
        while True:
            try:
                if need_list or self.resource_version is None:
                    await self.list_once()
                    need_list = False
                    self._failures = 0
                await self.watch_once()
            except asyncio.CancelledError:
                raise
            except Gone as exc:
                log.info("%s watch expired (%s): re-listing", self.kind, exc)
                self._restart("gone")
                need_list = True
                if self._failures:
                    await asyncio.sleep(self._backoff())
                else:
                    self._failures += 1
            except Exception as exc:
                status = getattr(exc, "status", None)
                if status == 410:
                    self._restart("gone")
                    need_list = True
                    continue
                delay = self._backoff()
                log.warning("%s watch failed (%s: %s); retrying in %.1fs", self.kind, type(exc).__name__,
                            exc, delay)
                self._restart("error")
                await asyncio.sleep(delay)


# ---- the inventory --------------------------------------------------------------------------------------


class Inventory:
    """Everything the extender reads from the cluster, kept in memory."""

    def __init__(self, settings: ExtenderSettings, namespace: str = "") -> None:
        self.settings = settings
        self.namespace = namespace  # where ConfigMaps are watched; "" = every namespace
        self.nodes = NodeStore(settings)
        self.configmaps = ConfigMapStore(settings.benchmark_configmap)
        self.pods = PodUsageStore(settings.tenant_label_key)
        self.watchers: list[Watcher] = []

    def make_watchers(self, api_client: Any, *, on_restart: RestartHook | None = None,
                      timeout_seconds: int = 300) -> list[Watcher]:
        """Build the watchers for a kubernetes_asyncio ``ApiClient`` (pods only with fair share)."""
        import functools

        from kubernetes_asyncio import client as k8s

        core = k8s.CoreV1Api(api_client)
        cm_call: ListCall = (functools.partial(core.list_namespaced_config_map, self.namespace)
                             if self.namespace else core.list_config_map_for_all_namespaces)
        self.watchers = [
            Watcher("nodes", self.nodes, core.list_node, on_restart=on_restart, timeout_seconds=timeout_seconds),
            Watcher("configmaps", self.configmaps, cm_call, on_restart=on_restart,
                    timeout_seconds=timeout_seconds),
        ]
        if self.settings.tenant_fairshare_enabled:
            self.watchers.append(Watcher(
                "pods", self.pods, core.list_pod_for_all_namespaces, on_restart=on_restart,
                timeout_seconds=timeout_seconds,
                field_selector="spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"))
        return self.watchers

    @property
    def nodes_synced(self) -> bool:
        """True once the node list has been loaded (NodeNames requests need it)."""
        w = next((w for w in self.watchers if w.kind == "nodes"), None)
        return w is None or w.synced.is_set()

    @property
    def synced(self) -> bool:
        return all(w.synced.is_set() for w in self.watchers)

    def lookup(self, names: Iterable[str]) -> tuple[list[NodeFacts], list[str]]:
        """Facts for the named nodes, and the names the inventory does not know."""
        found, missing = [], []
        facts = self.nodes.facts
        for n in names:
            f = facts.get(n)
            if f is None:
                missing.append(n)
            else:
                found.append(f)
        return found, missing

    def bench(self, namespace: str) -> Mapping[str, str] | None:
        """The global benchmark ConfigMap's data: the pod's namespace, else the extender's."""
        name = self.settings.benchmark_configmap
        data = self.configmaps.data.get((namespace, name))
        if data is None and self.namespace:
            data = self.configmaps.data.get((self.namespace, name))
        return data

    def deployment_tps(self, namespace: str, deployment: str | None) -> float | None:
        """``tokensPerSecond`` of ``<deployment>-benchmark-results`` (legacy per-deployment results)."""
        if not deployment:
            return None
        name = deployment + labels.BENCHMARK_CONFIGMAP_SUFFIX
        data = self.configmaps.data.get((namespace, name))
        if data is None and self.namespace:
            data = self.configmaps.data.get((self.namespace, name))
        return parse_float(data.get(labels.TOKENS_PER_SECOND)) if data else None

    def tenant_used(self, tenant: str) -> float:
        """GPUs the tenant's bound, unfinished pods hold."""
        return float(self.pods.totals.get(tenant, 0))
