"""The runtime interface: what the proxy may know about where models live.

The proxy talks only to :class:`Inventory` (model name -> :class:`ModelView`) and :class:`Scaler`
(wake a model, record demand). In the other direction a runtime reads the proxy's load through a
:class:`LoadView`, handed to it at construction by the composition root (``flexinfer.cmd``). Implementations: ``static`` (a YAML file of fixed backends),
``local`` (processes on this machine) and ``kube`` (custom resources watched in a cluster).
Nothing here does I/O; views are immutable snapshots swapped atomically when anything changes.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol, runtime_checkable

ROUTING_STRATEGIES = ("default", "round-robin", "session-affinity", "prefix", "prefix-cache", "least-loaded",
                      "scored")
#: what a replica does in prefill/decode disaggregation (docs/disaggregation.md); "both": an ordinary engine
ENDPOINT_ROLES = ("prefill", "decode", "both")


@dataclass(frozen=True, slots=True)
class UpstreamLink:
    """How an endpoint that is not plain keyless HTTP is dialled (docs/tls.md): TLS (verified against
    the system CAs, or ``ca_file``; ``insecure_skip_verify`` for tests only) with SNI and certificate
    name ``server_hostname``, and a peer's API key sent as ``Authorization: Bearer`` instead of the
    client's own Authorization. Hashable: it is part of the pool key."""

    tls: bool = True
    server_hostname: str | None = None  # None: the endpoint's host
    ca_file: str | None = None
    insecure_skip_verify: bool = False
    api_key: str | None = field(default=None, repr=False)
    path_prefix: str = ""  # a peer's base path (``https://host/api``): put before every request path
    #: a client certificate (mTLS; PEM files, the key file private): the GlobalProxy's ``tls.secretRef``
    cert_file: str | None = None
    key_file: str | None = None


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One replica of a model: an address the proxy may dial (never derived from user input)."""

    host: str
    port: int
    role: str = "both"  # one of ENDPOINT_ROLES: "prefill" or "decode" only in a disaggregated model
    key: str = field(init=False, compare=False, repr=False)  # "host:port", computed once
    #: None: plain HTTP, no credentials (the pool key stays (host, port)); see UpstreamLink
    link: UpstreamLink | None = None

    @property
    def scheme(self) -> str:
        return "https" if self.link is not None and self.link.tls else "http"

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", f"{self.host}:{self.port}")
        if self.role != "both" and self.role not in ENDPOINT_ROLES:
            raise ValueError(f"endpoint role {self.role!r} must be one of {', '.join(ENDPOINT_ROLES)}")

    @classmethod
    def parse(cls, url: str, role: str = "both", *, ca_file: str | None = None,
              insecure_skip_verify: bool = False, api_key: str | None = None,
              path_prefix: str = "") -> Endpoint:
        """``http://host:port``, ``host:port`` or ``https://host[:port]`` (port 443 by default) ->
        Endpoint. ``ca_file``/``insecure_skip_verify`` apply to https only; ``api_key`` to both."""
        s = url.strip()
        tls = False
        if s.startswith("http://"):
            s = s[7:]
        elif s.startswith("https://"):
            s, tls = s[8:], True
        elif "://" in s:
            raise ValueError(f"unsupported endpoint scheme in {url!r} (http:// or https://)")
        s = s.rstrip("/")
        if "/" in s:
            raise ValueError(f"endpoint {url!r} must not contain a path")
        if tls and (s.endswith("]") or (":" not in s)):
            s += ":443"
        if s.startswith("["):  # [v6]:port
            host, _, port = s[1:].partition("]:")
        else:
            host, _, port = s.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"endpoint {url!r} must look like http://host:port or https://host[:port]")
        link = None
        if tls or api_key or path_prefix:
            link = UpstreamLink(tls, host if tls else None, ca_file if tls else None,
                                insecure_skip_verify and tls, api_key or None, path_prefix)
        return cls(host, int(port), role, link=link)


_EMPTY: Mapping[str, Any] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class BodyFilters:
    """A model's request-body filters (``filters:`` of ``flexinfer serve``'s config): keys removed
    from, then values forced into, a JSON request body before it is forwarded. ``model`` is never
    among them (the config refuses it)."""

    strip_params: tuple[str, ...] = ()
    set_params: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)

    def apply(self, data: dict[str, Any]) -> bool:
        """Filter ``data`` in place; True when it changed (the body must be encoded again)."""
        changed = False
        for key in self.strip_params:
            if key in data:
                del data[key]
                changed = True
        for key, value in self.set_params.items():  # containers copied: the body is the request's own
            data[key] = copy.deepcopy(value) if isinstance(value, dict | list) else value
            changed = True
        return changed


@dataclass(frozen=True, slots=True)
class ModelView:
    """Everything the proxy needs to serve one model, frozen."""

    name: str
    endpoints: tuple[Endpoint, ...] = ()
    ready: bool = True
    served_name: str | None = None  # body "model" is rewritten to this (None: left as sent)
    aliases: tuple[str, ...] = ()
    routing: str = "default"
    scheduler: str | None = None  # the ``scored`` chain ("least-request:1,...;filters=..."); None: the default
    cold_start_timeout: float | None = None
    context_window: int | None = None
    rewrite_model: bool = True  # False for a LoRA adapter routed to its parent: body untouched
    owned_by: str = "flexinfer"
    created: int = 0
    metadata: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)
    #: per-model limits the proxy enforces (None/False: off, one attribute read per request)
    concurrency_limit: int | None = None  # requests in flight to the model; beyond it 429 + Retry-After
    response_timeout: float | None = None  # seconds to the upstream's response head (None: PROXY_RESPONSE_TIMEOUT)
    filters: BodyFilters | None = None  # applied to JSON bodies before forwarding
    unlisted: bool = False  # served, but not in GET /v1/models
    #: routing "weighted": endpoint key -> weight (a missing key weighs 1; 0: never picked while
    #: another endpoint is left). The global proxy's FederatedModel weights (runtime.globalrt)
    weights: Mapping[str, int] = field(default_factory=lambda: _EMPTY)
    #: prefill/decode disaggregation: True when some endpoint's role is not "both" (computed once per
    #: view, read per request; see flexinfer.proxy.disagg for the prefill and decode sets)
    disaggregated: bool = field(init=False, compare=False, repr=False)
    #: the model name the backend sees: ``served_name``, else ``name`` (computed once per view like
    #: ``disaggregated``: a slot read per request instead of a Python property call)
    upstream_model: str = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "disaggregated", any(e.role != "both" for e in self.endpoints))
        object.__setattr__(self, "upstream_model", self.served_name or self.name)


@runtime_checkable
class Inventory(Protocol):
    """Model name -> view. ``resolve`` is called on every request: it must be a dict lookup."""

    def resolve(self, name: str) -> ModelView | None:
        """The model a client name refers to (name, alias, service label or adapter), or None."""
        ...

    def models(self) -> Iterable[ModelView]:
        """Every model, for ``GET /v1/models``."""
        ...

    def subscribe(self, callback: Callable[[ModelView], None]) -> None:
        """Call ``callback(view)`` whenever a model's view changes (readiness, endpoints)."""
        ...


@runtime_checkable
class Scaler(Protocol):
    """Wakes models that are not ready and learns which models are in demand."""

    async def wake(self, model: ModelView) -> None:
        """Ask for the model to be started; returns once the request is made (not when ready).
        Raises an exception with a readable message when the model cannot be started."""
        ...

    def record_demand(self, model: ModelView) -> None:
        """A request for ``model`` was seen now (cheap; called on every request)."""
        ...


class LoadView(Protocol):
    """The proxy's load as a runtime reads it (idle checks, drains, demand heartbeats, group queues)."""

    def in_flight(self, endpoint: str) -> int:
        """Requests open to the replica ``endpoint`` (an :attr:`Endpoint.key`, ``host:port``)."""
        ...

    def queue_depth(self, model: str) -> int | None:
        """Requests waiting for ``model`` (a view name) to wake; None when not known."""
        ...


class NoLoad:
    """The :class:`LoadView` of a runtime with no proxy in front: nothing open, queue depth unknown."""

    __slots__ = ()

    def in_flight(self, endpoint: str) -> int:
        return 0

    def queue_depth(self, model: str) -> int | None:
        return None


NO_LOAD: LoadView = NoLoad()


class InventorySnapshot:
    """An immutable name index over a set of views; build a new one and swap it on change."""

    __slots__ = ("by_name", "views")

    def __init__(self, views: Iterable[ModelView]) -> None:
        self.views: tuple[ModelView, ...] = tuple(views)
        index: dict[str, ModelView] = {}
        for v in self.views:  # canonical names win over aliases
            for alias in v.aliases:
                index.setdefault(alias, v)
        for v in self.views:
            index[v.name] = v
        self.by_name = index


class StaticInventoryBase:
    """Shared plumbing for inventories that hold a snapshot and notify subscribers."""

    def __init__(self, views: Iterable[ModelView] = ()) -> None:
        self._snap = InventorySnapshot(views)
        self._subscribers: list[Callable[[ModelView], None]] = []

    def resolve(self, name: str) -> ModelView | None:
        return self._snap.by_name.get(name)

    def models(self) -> Iterable[ModelView]:
        return self._snap.views

    def subscribe(self, callback: Callable[[ModelView], None]) -> None:
        self._subscribers.append(callback)

    def replace(self, views: Iterable[ModelView]) -> None:
        """Swap in a new set of views and notify subscribers of every view that changed."""
        old = self._snap.by_name
        self._snap = InventorySnapshot(views)
        for v in self._snap.views:
            if old.get(v.name) != v:
                for cb in self._subscribers:
                    cb(v)

    def update(self, view: ModelView) -> None:
        """Replace (or add) one model's view."""
        views = [v for v in self._snap.views if v.name != view.name]
        views.append(view)
        self.replace(views)
