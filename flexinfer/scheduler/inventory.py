"""In-memory inventory of the extender: Nodes, benchmark ConfigMaps and (for tenant fair share) Pods,
kept up to date by list+watch, so that no request makes an API call.

A :class:`Watcher` keeps one resource kind in a store with the one list+watch reflector
(:class:`flexinfer.k8s.reflector.ResourceWatch`): list, watch from the list's ``resourceVersion``,
resume from the last version seen (events and bookmarks move it), re-list on 410 Gone, back off
exponentially (bounded, jittered, ``Retry-After`` honoured) on errors and when streams end at once.
Lists and events can be fed directly (:meth:`Watcher.apply_list`, :meth:`Watcher.apply_event`) in
tests. Stores keep only the parsed facts the logic needs. This module owns the Kubernetes reads of the
extender and nothing else.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Protocol

from flexinfer import labels
from flexinfer.k8s.backoff import Backoff
from flexinfer.k8s.reflector import ResourceWatch
from flexinfer.scheduler.logic import NodeFacts, gpu_resources, node_facts, parse_float, static_score
from flexinfer.scheduler.settings import ExtenderSettings

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


LIST_TIMEOUT = 300.0
"""Seconds one list may take: the extender lists every Node and every ConfigMap, which can be large."""


class Watcher(ResourceWatch):
    """List+watch one resource kind into a :class:`Store`, with the one reflector.

    ``call`` is the kubernetes_asyncio list function (None: fed by :meth:`apply_list` and
    :meth:`apply_event` only), ``selectors`` its ``label_selector``/``field_selector``; ``on_restart``
    hears ``(kind, "gone")`` on each re-list after a 410 and ``(kind, "error")`` on each back-off.
    """

    def __init__(self, kind: str, store: Store, call: ListCall | None = None, *,
                 timeout_seconds: int = 300, backoff_min: float = 0.5, backoff_max: float = 30.0,
                 on_restart: RestartHook | None = None, **selectors: str) -> None:
        self.kind = kind
        self.store = store
        self.lists = 0  # lists applied to the store
        super().__init__(kind, call, (), {k: v for k, v in selectors.items() if v},
                         on_sync=self._replace, on_event=self._apply, backoff=Backoff(backoff_min, backoff_max),
                         watch_timeout=timeout_seconds, list_timeout=LIST_TIMEOUT,
                         on_restart=None if on_restart is None else functools.partial(on_restart, kind))

    def _replace(self, items: list[dict[str, Any]]) -> None:
        self.store.replace(items)
        self.lists += 1

    def _apply(self, type_: str, obj: dict[str, Any]) -> None:
        if type_ == "DELETED":
            self.store.delete(obj)
        else:  # ADDED, MODIFIED
            self.store.upsert(obj)


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
