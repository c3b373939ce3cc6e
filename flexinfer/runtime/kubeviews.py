"""What the ``kube`` runtime knows about the cluster, and the model views built from it (pure).

Owns: the local copy of the objects the proxy watches (Models, ModelDeployments, LoRAAdapters,
GPUGroups as typed views from :mod:`flexinfer.api`; Services and EndpointSlices as small records;
the names of spot nodes going away), which models an object change affects, one
:class:`~flexinfer.runtime.base.ModelView` per model, and the immutable name index the proxy
resolves against (:class:`Index`).

Rules it implements (``shared/reference/flexinfer-upstream.md`` §4):

- A model's endpoints are the ready, not terminating addresses of the EndpointSlices of its Service
  (label ``flexinfer.ai/model``, else the Service named like the model), on the Service's ``http``
  port (else its first), skipping pods on nodes labelled ``flexinfer.ai/spot-terminating``.
- Prefill/decode disaggregation: an endpoint's role is the label ``flexinfer.ai/role`` of its
  EndpointSlice, else of its Service (the EndpointSlice controller copies a Service's labels onto its
  slices; pods are not watched, so label the pods' Service), else ``both``. The model's other
  Services (label ``flexinfer.ai/model``) that carry a role add their endpoints too: one Service
  per role is the usual layout. Without role labels nothing changes.
- A view is ready when the resource says so (``Ready`` condition; without one, phase ``Ready`` for a
  Model, ``Running`` with ready replicas for a ModelDeployment) *and* it has a ready endpoint.
- Names, first claimant wins within each rank: canonical names > ``litellm`` ``servedModelName``,
  ``aliases`` and ``copilotAlias`` > LoRA adapter names (the parent's view with
  ``rewrite_model=False``) > service labels (``ai.flexinfer/active-services`` on the model's Service
  when the key exists, even empty; else ``flexinfer.ai/service-labels``; else ``spec.serviceLabels``;
  the active member of a shared group first, then by name). A Model shadows a ModelDeployment of the
  same name; ``litellm.enabled: false`` hides a model from the proxy.
- With all namespaces, models outside the proxy's namespace are named ``<namespace>/<name>`` and
  also claim their plain name as an alias.

Must not: do I/O, import Kubernetes clients, or log on the per-request path (nothing here runs
per request: the proxy only reads :attr:`Index.by_name`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from types import MappingProxyType
from typing import Any

from flexinfer import labels
from flexinfer.api import GPUGroup, LoRAAdapter, Model, ModelDeployment, SpecError
from flexinfer.api.conditions import READY
from flexinfer.api.model import MODEL as MODEL_KIND
from flexinfer.api.modeldeployment import MODEL_DEPLOYMENT as MODEL_DEPLOYMENT_KIND
from flexinfer.backends import get_backend
from flexinfer.runtime.base import ENDPOINT_ROLES, ROUTING_STRATEGIES, Endpoint, ModelView

log = logging.getLogger("flexinfer.kube")

MODEL = "Model"
MODEL_DEPLOYMENT = "ModelDeployment"
LORA = "LoRAAdapter"
GPU_GROUP = "GPUGroup"
SERVICE = "Service"
SLICE = "EndpointSlice"
NODE = "Node"

Key = tuple[str, str, str]  # (kind, namespace, name) of a Model or ModelDeployment
NsName = tuple[str, str]

GROUP_MIN_COLD_START = 120.0  # a GPUGroup member waits max(2 x coldStart, 120 s), as the original


def _ns_name(obj: Mapping[str, Any]) -> NsName:
    md = obj.get("metadata") or {}
    return str(md.get("namespace") or ""), str(md.get("name") or "")


def _split(value: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in value.split(",") if p.strip())


def _role(kind: str, ns: str, name: str, lab: Mapping[str, Any]) -> str | None:
    """The ``flexinfer.ai/role`` label of an object; None when absent, or invalid (logged)."""
    v = lab.get(labels.ROLE)
    if v is None:
        return None
    if v in ENDPOINT_ROLES:
        return str(v)
    log.warning("ignoring label %s=%r on %s %s/%s (prefill, decode or both)", labels.ROLE, v, kind, ns, name)
    return None


def _epoch(dt: datetime | None) -> int:
    return int(dt.timestamp()) if dt is not None else 0


# ---- small records of core objects ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ServiceInfo:
    """The parts of a Service the proxy reads."""

    namespace: str
    name: str
    model: str  # the model it serves: label flexinfer.ai/model, else the legacy label, else its name
    service_labels: tuple[str, ...] | None  # annotation flexinfer.ai/service-labels (None: absent)
    active_services: tuple[str, ...] | None  # annotation ai.flexinfer/active-services (None: absent)
    port_name: str | None  # the Service port to use on the slices: "http" if present, else the first
    role: str | None = None  # label flexinfer.ai/role (prefill | decode | both); None: absent or invalid

    @classmethod
    def from_obj(cls, obj: Mapping[str, Any]) -> ServiceInfo:
        ns, name = _ns_name(obj)
        md = obj.get("metadata") or {}
        lab = md.get("labels") or {}
        ann = md.get("annotations") or {}
        ports = [p for p in ((obj.get("spec") or {}).get("ports") or []) if isinstance(p, Mapping)]
        names = [p.get("name") for p in ports]
        port_name = "http" if "http" in names else (names[0] if names else None)
        sl = ann.get(labels.SERVICE_LABELS)
        act = ann.get(labels.ACTIVE_SERVICES)
        return cls(namespace=ns, name=name,
                   model=str(lab.get(labels.MODEL) or lab.get(labels.MODELDEPLOYMENT_CR) or name),
                   service_labels=_split(sl) if isinstance(sl, str) else None,
                   active_services=_split(act) if isinstance(act, str) else None,
                   port_name=port_name if isinstance(port_name, str) and port_name else None,
                   role=_role(SERVICE, ns, name, lab))


@dataclass(frozen=True, slots=True)
class SliceInfo:
    """An EndpointSlice reduced to its Service, ports and ready addresses."""

    namespace: str
    name: str
    service: str
    ports: tuple[tuple[str, int], ...]  # (name, port)
    addresses: tuple[tuple[str, str | None], ...]  # (address, node) of ready, not terminating endpoints
    role: str | None = None  # label flexinfer.ai/role (None: absent or invalid; the Service's then)

    def port(self, name: str | None) -> int | None:
        for n, p in self.ports:
            if n == (name or ""):
                return p
        return self.ports[0][1] if self.ports else None

    @classmethod
    def from_obj(cls, obj: Mapping[str, Any]) -> SliceInfo:
        ns, name = _ns_name(obj)
        lab = (obj.get("metadata") or {}).get("labels") or {}
        ports = tuple((str(p.get("name") or ""), int(p["port"])) for p in obj.get("ports") or ()
                      if isinstance(p, Mapping) and isinstance(p.get("port"), int))
        addrs: list[tuple[str, str | None]] = []
        for ep in obj.get("endpoints") or ():
            if not isinstance(ep, Mapping):
                continue
            cond = ep.get("conditions") or {}
            # "ready: nil" means unknown, which consumers treat as ready (discovery/v1 API docs)
            if cond.get("ready") is False or cond.get("terminating") is True:
                continue
            a = ep.get("addresses") or ()
            if a and isinstance(a[0], str):
                node = ep.get("nodeName")
                addrs.append((a[0], node if isinstance(node, str) else None))
        return cls(namespace=ns, name=name, service=str(lab.get(labels.ENDPOINTSLICE_SERVICE_NAME) or ""),
                   ports=ports, addresses=tuple(addrs), role=_role(SLICE, ns, name, lab))


@dataclass(frozen=True, slots=True)
class Claims:
    """The client names one model claims, by rank."""

    aliases: tuple[str, ...] = ()
    adapters: tuple[str, ...] = ()
    labels: tuple[str, ...] = ()
    label_rank: int = 1  # 0: the active member of a shared group (claims first)


# ---- the cluster state ----------------------------------------------------------------------------


class ClusterState:
    """The watched objects, kept per kind; ``apply``/``replace`` return the model keys they affect
    (``None``: all of them)."""

    def __init__(self, namespace: str, all_namespaces: bool = False) -> None:
        self.namespace = namespace
        self.all_namespaces = all_namespaces
        self.models: dict[NsName, Model] = {}
        self.deployments: dict[NsName, ModelDeployment] = {}
        self.adapters: dict[NsName, LoRAAdapter] = {}
        self.groups: dict[NsName, GPUGroup] = {}
        self.services: dict[NsName, ServiceInfo] = {}
        self.slices: dict[NsName, SliceInfo] = {}
        self.spot_nodes: set[str] = set()
        # derived indexes
        self._services_of: dict[NsName, set[str]] = {}  # (ns, model) -> service names
        self._slices_of: dict[NsName, set[str]] = {}  # (ns, service) -> slice names
        self._adapters_of: dict[NsName, set[str]] = {}  # (ns, parent Model) -> adapter object names
        self._group_of: dict[NsName, NsName] = {}  # (ns, ModelDeployment) -> (ns, GPUGroup)
        self._bad: dict[tuple[str, str, str], str] = {}  # (kind, ns, name) -> resourceVersion logged

    # -- keys ----------------------------------------------------------------------------------------
    def model_keys(self) -> list[Key]:
        return [(MODEL, ns, n) for ns, n in self.models] + [(MODEL_DEPLOYMENT, ns, n) for ns, n in self.deployments]

    @staticmethod
    def _both(ns: str, name: str) -> set[Key]:
        return {(MODEL, ns, name), (MODEL_DEPLOYMENT, ns, name)}

    def group_of(self, ns: str, name: str) -> NsName | None:
        """The GPUGroup a ModelDeployment belongs to (``gpuGroupRef``, else group membership)."""
        md = self.deployments.get((ns, name))
        if md is not None and md.spec.gpu_group_ref:
            return (ns, md.spec.gpu_group_ref)
        return self._group_of.get((ns, name))

    # -- parsing -------------------------------------------------------------------------------------
    def _parse(self, kind: str, obj: Mapping[str, Any]) -> Any:
        ns, name = _ns_name(obj)
        try:
            if kind == MODEL:
                return Model.from_obj(obj)
            if kind == MODEL_DEPLOYMENT:
                return ModelDeployment.from_obj(obj)
            if kind == LORA:
                return LoRAAdapter.from_obj(obj)
            return GPUGroup.from_obj(obj)
        except SpecError as exc:
            rv = str((obj.get("metadata") or {}).get("resourceVersion") or "")
            if self._bad.get((kind, ns, name)) != rv:
                self._bad[(kind, ns, name)] = rv
                log.warning("ignoring %s %s/%s: %s", kind, ns, name, exc)
            return None

    # -- changes -------------------------------------------------------------------------------------
    def apply(self, kind: str, event: str, obj: Mapping[str, Any]) -> set[Key] | None:
        """One watch event (``ADDED``/``MODIFIED``/``DELETED``); the affected model keys."""
        key = _ns_name(obj)
        return self._put(kind, key, None if event == "DELETED" else obj)

    def replace(self, kind: str, items: Iterable[Mapping[str, Any]]) -> set[Key] | None:
        """A fresh list of ``kind``: everything else of that kind is gone."""
        fresh = {_ns_name(o): o for o in items}
        stores: dict[str, Mapping[NsName, Any]] = {
            MODEL: self.models, MODEL_DEPLOYMENT: self.deployments, LORA: self.adapters, GPU_GROUP: self.groups,
            SERVICE: self.services, SLICE: self.slices,
        }
        store = stores.get(kind, {})
        if kind == NODE:
            self.spot_nodes = {n for (_, n), o in fresh.items() if self._spot(o)}
            return None
        for gone in [k for k in store if k not in fresh]:
            self._put(kind, gone, None)
        for k, o in fresh.items():
            self._put(kind, k, o)
        return None

    @staticmethod
    def _spot(obj: Mapping[str, Any]) -> bool:
        v = ((obj.get("metadata") or {}).get("labels") or {}).get(labels.SPOT_TERMINATING)
        return isinstance(v, str) and v.strip().lower() not in ("false", "0")

    def _put(self, kind: str, key: NsName, obj: Mapping[str, Any] | None) -> set[Key] | None:
        ns, name = key
        if kind == MODEL:
            parsed = self._parse(kind, obj) if obj is not None else None
            self._store(self.models, key, parsed)
            return self._both(ns, name)
        if kind == MODEL_DEPLOYMENT:
            parsed = self._parse(kind, obj) if obj is not None else None
            self._store(self.deployments, key, parsed)
            return self._both(ns, name)
        if kind == LORA:
            return self._put_adapter(key, self._parse(kind, obj) if obj is not None else None)
        if kind == GPU_GROUP:
            return self._put_group(key, self._parse(kind, obj) if obj is not None else None)
        if kind == SERVICE:
            return self._put_service(key, ServiceInfo.from_obj(obj) if obj is not None else None)
        if kind == SLICE:
            return self._put_slice(key, SliceInfo.from_obj(obj) if obj is not None else None)
        if kind == NODE:
            before = name in self.spot_nodes
            now = obj is not None and self._spot(obj)
            if now:
                self.spot_nodes.add(name)
            else:
                self.spot_nodes.discard(name)
            return None if before != now else set()
        return set()

    @staticmethod
    def _store(store: dict[NsName, Any], key: NsName, value: Any) -> None:
        if value is None:
            store.pop(key, None)
        else:
            store[key] = value

    def _put_adapter(self, key: NsName, ad: LoRAAdapter | None) -> set[Key]:
        ns, name = key
        out: set[Key] = set()
        old = self.adapters.pop(key, None)
        if old is not None:
            self._adapters_of.get((ns, old.spec.model_ref), set()).discard(name)
            out.add((MODEL, ns, old.spec.model_ref))
        if ad is not None:
            self.adapters[key] = ad
            self._adapters_of.setdefault((ns, ad.spec.model_ref), set()).add(name)
            out.add((MODEL, ns, ad.spec.model_ref))
        return out

    def _put_group(self, key: NsName, g: GPUGroup | None) -> set[Key]:
        out: set[Key] = set()
        old = self.groups.pop(key, None)
        for grp in (old, g):
            if grp is None:
                continue
            for m in grp.spec.models:
                out.add((MODEL_DEPLOYMENT, m.namespace, m.name))
        for k in [k for k, v in self._group_of.items() if v == key]:
            del self._group_of[k]
        if g is not None:
            self.groups[key] = g
            for m in g.spec.models:
                self._group_of.setdefault((m.namespace, m.name), key)
        return out

    def _put_service(self, key: NsName, svc: ServiceInfo | None) -> set[Key]:
        ns, name = key
        out: set[Key] = set()
        old = self.services.pop(key, None)
        if old is not None:
            self._services_of.get((ns, old.model), set()).discard(name)
            out |= self._both(ns, old.model)
        if svc is not None:
            self.services[key] = svc
            self._services_of.setdefault((ns, svc.model), set()).add(name)
            out |= self._both(ns, svc.model)
        return out

    def _put_slice(self, key: NsName, sl: SliceInfo | None) -> set[Key]:
        ns, name = key
        out: set[Key] = set()
        old = self.slices.pop(key, None)
        for s in (old, sl):
            if s is None:
                continue
            svc = self.services.get((ns, s.service))
            out |= self._both(ns, svc.model if svc is not None else s.service)
        if old is not None:
            self._slices_of.get((ns, old.service), set()).discard(name)
        if sl is not None:
            self.slices[key] = sl
            self._slices_of.setdefault((ns, sl.service), set()).add(name)
        return out

    # -- per model -------------------------------------------------------------------------------------
    def service_of(self, ns: str, name: str) -> ServiceInfo | None:
        names = self._services_of.get((ns, name))
        if not names:
            return None
        return self.services.get((ns, name if name in names else min(names)))

    def endpoints(self, ns: str, name: str) -> tuple[Endpoint, ...]:
        svc = self.service_of(ns, name)
        svc_name = svc.name if svc is not None else name
        port_name = svc.port_name if svc is not None else "http"
        eps: set[Endpoint] = set()
        self._slice_endpoints(eps, ns, svc_name, port_name, svc.role if svc is not None else None)
        for other in self._services_of.get((ns, name), ()):  # disaggregation: one Service per role
            o = self.services.get((ns, other))
            if other != svc_name and o is not None and o.role is not None:
                self._slice_endpoints(eps, ns, other, o.port_name, o.role)
        return tuple(sorted(eps, key=lambda e: (e.host, e.port, e.role)))

    def _slice_endpoints(self, eps: set[Endpoint], ns: str, svc_name: str, port_name: str | None,
                         svc_role: str | None) -> None:
        for slice_name in self._slices_of.get((ns, svc_name), ()):
            sl = self.slices.get((ns, slice_name))
            if sl is None:
                continue
            port = sl.port(port_name)
            if port is None:
                continue
            role = sl.role or svc_role or "both"
            for addr, node in sl.addresses:
                if node is not None and node in self.spot_nodes:
                    continue
                eps.add(Endpoint(addr, port, role))

    def view_name(self, key: Key) -> str | None:
        kind, ns, name = key
        if kind == MODEL_DEPLOYMENT and (ns, name) in self.models:
            return None  # a Model of the same name wins
        if self.all_namespaces and ns != self.namespace:
            return f"{ns}/{name}"
        return name

    def build(self, key: Key) -> tuple[ModelView, Claims] | None:
        """The view of one model and the names it claims; None when it does not exist (or is hidden)."""
        view_name = self.view_name(key)
        if view_name is None:
            return None
        kind, ns, name = key
        if kind == MODEL:
            m = self.models.get((ns, name))
            return self._model_view(view_name, m) if m is not None else None
        md = self.deployments.get((ns, name))
        return self._md_view(view_name, md) if md is not None else None

    def _labels(self, ns: str, name: str, declared: tuple[str, ...], active: bool) -> tuple[tuple[str, ...], int]:
        svc = self.service_of(ns, name)
        if svc is not None and svc.active_services is not None:
            return svc.active_services, 0
        if svc is not None and svc.service_labels is not None:
            return svc.service_labels, 0 if active else 1
        return declared, 0 if active else 1

    def _routing(self, annotations: Mapping[str, str]) -> str:
        r = annotations.get(labels.ROUTING) or "default"
        return r if r in ROUTING_STRATEGIES else "default"

    @staticmethod
    def _scheduler(annotations: Mapping[str, str]) -> str | None:
        """The ``scored`` chain of the annotation, as written (the proxy checks it: a bad one is
        counted, logged once and replaced by the default chain)."""
        s = annotations.get(labels.SCHEDULER)
        return s.strip()[:1024] or None if isinstance(s, str) else None

    def _aliases(self, view_name: str, name: str, served: str | None, extra: Iterable[str]) -> tuple[str, ...]:
        out: list[str] = []
        for a in (served, *extra):
            if a and a != view_name and a not in out:
                out.append(a)
        return tuple(out)

    def _model_view(self, view_name: str, m: Model) -> tuple[ModelView, Claims] | None:
        spec, st = m.spec, m.status
        if not spec.litellm.enabled:
            return None
        ns, name = m.namespace, m.name
        eps = self.endpoints(ns, name)
        cond = st.condition(READY)
        ready = st.ready if cond is not None else st.phase == "Ready"
        ll = spec.litellm
        aliases = self._aliases(view_name, name, ll.served_model_name, (*ll.aliases, ll.copilot_alias or ""))
        shared_active = bool(spec.gpu.shared and st.shared_group is not None and st.shared_group.state == "Active")
        label_names, rank = self._labels(ns, name, spec.service_labels, shared_active)
        adapters = tuple(sorted(a.spec.adapter_name for n in self._adapters_of.get((ns, name), ())
                                if (a := self.adapters.get((ns, n))) is not None))
        meta = {
            "kind": MODEL, "api_version": MODEL_KIND.api_version,
            "namespace": ns, "backend": spec.backend, "phase": st.phase or "", "source": spec.source.raw,
            "gpu_shared": spec.gpu.shared or "", "gpu_priority": spec.gpu.priority,
            "served_model_name": spec.served_name, "service_labels": list(spec.service_labels),
            "replicas": len(eps), "lora_adapters": list(adapters),
        }
        view = ModelView(
            name=view_name, endpoints=eps, ready=ready and bool(eps), served_name=spec.served_name,
            aliases=aliases, routing=self._routing(m.meta.annotations), scheduler=self._scheduler(m.meta.annotations),
            cold_start_timeout=spec.serverless.cold_start_timeout_s, context_window=spec.context_window,
            owned_by="flexinfer", created=_epoch(m.meta.creation_timestamp), metadata=MappingProxyType(meta))
        plain = (name,) if view_name != name else ()
        return view, Claims(aliases=aliases + plain, adapters=adapters, labels=label_names, label_rank=rank)

    def _md_view(self, view_name: str, md: ModelDeployment) -> tuple[ModelView, Claims] | None:
        spec, st = md.spec, md.status
        if not spec.litellm.enabled:
            return None
        ns, name = md.meta.namespace, md.meta.name
        eps = self.endpoints(ns, name)
        cond = next((c for c in st.conditions if c.type == READY), None)
        ready = st.ready if cond is not None else (st.phase == "Running" and (st.ready_replicas or 0) > 0)
        group = self.group_of(ns, name)
        cold = spec.cold_start_timeout_s
        active = False
        if group is not None:
            cold = max(2 * cold, GROUP_MIN_COLD_START)
            g = self.groups.get(group)
            active = g is not None and g.status.active_model == name
        ll = spec.litellm
        aliases = self._aliases(view_name, name, ll.served_model_name, (*ll.aliases, ll.copilot_alias or ""))
        label_names, rank = self._labels(ns, name, spec.service_labels, active)
        try:
            window = get_backend(spec.backend).context_window(spec.backend_config())
        except Exception:  # a window we cannot read only disables the clamp
            window = None
        meta = {
            "kind": MODEL_DEPLOYMENT, "api_version": MODEL_DEPLOYMENT_KIND.api_version, "namespace": ns,
            "backend": spec.backend, "phase": st.phase or "", "source": spec.model,
            "gpu_shared": group[1] if group else "", "gpu_priority": spec.priority,
            "served_model_name": spec.model, "service_labels": list(spec.service_labels),
            "replicas": len(eps), "scaled": spec.replicas, "gpu_group": group[1] if group else "",
        }
        view = ModelView(
            name=view_name, endpoints=eps, ready=ready and bool(eps), served_name=spec.model, aliases=aliases,
            routing=self._routing(md.meta.annotations), scheduler=self._scheduler(md.meta.annotations),
            cold_start_timeout=cold, context_window=window,
            owned_by="flexinfer", created=_epoch(md.meta.creation_timestamp), metadata=MappingProxyType(meta))
        plain = (name,) if view_name != name else ()
        return view, Claims(aliases=aliases + plain, labels=label_names, label_rank=rank)


# ---- the index the proxy reads ------------------------------------------------------------------


class Index:
    """Immutable name index: canonical views plus every client name -> view. Replace, never mutate."""

    __slots__ = ("by_name", "names_of", "ordered", "views")

    def __init__(self, views: dict[str, ModelView], by_name: dict[str, ModelView],
                 names_of: dict[str, tuple[tuple[str, bool], ...]]) -> None:
        self.views = views
        self.by_name = by_name
        self.names_of = names_of  # canonical name -> ((client name, is adapter), ...)
        self.ordered: tuple[ModelView, ...] = tuple(views[n] for n in sorted(views))

    @classmethod
    def build(cls, entries: Iterable[tuple[ModelView, Claims]]) -> Index:
        items = sorted(entries, key=lambda e: e[0].name)
        views = {v.name: v for v, _ in items}
        by_name: dict[str, ModelView] = dict(views)
        names: dict[str, list[tuple[str, bool]]] = {n: [] for n in views}
        for v, c in items:
            for a in c.aliases:
                if a not in by_name:
                    by_name[a] = v
                    names[v.name].append((a, False))
        for v, c in items:
            for a in c.adapters:
                if a not in by_name:
                    by_name[a] = dataclasses.replace(v, rewrite_model=False)
                    names[v.name].append((a, True))
        for v, c in sorted(items, key=lambda e: (e[1].label_rank, e[0].name)):
            for a in c.labels:
                if a not in by_name:
                    by_name[a] = v
                    names[v.name].append((a, False))
        return cls(views, by_name, {n: tuple(x) for n, x in names.items()})

    def with_views(self, changed: Iterable[ModelView]) -> Index:
        """A copy where the given views (same names, same claims) replace their old versions."""
        views = dict(self.views)
        by_name = dict(self.by_name)
        for v in changed:
            views[v.name] = v
            by_name[v.name] = v
            for n, adapter in self.names_of.get(v.name, ()):
                by_name[n] = dataclasses.replace(v, rewrite_model=False) if adapter else v
        return Index(views, by_name, self.names_of)


EMPTY_INDEX = Index({}, {}, {})
