"""The static inventory: a YAML file that maps model names to fixed backend URLs.

Format (``examples/static.yaml``)::

    models:
      - name: smollm2                 # what clients send as "model"
        endpoints: [http://127.0.0.1:18001]
        served_name: SmolLM2          # optional: body "model" rewritten to this
        aliases: [small]              # optional
        routing: default              # default | round-robin | session-affinity | prefix | prefix-cache | least-loaded | scored
        scheduler: "least-request:1,kv-cache:1;filters=least-request"   # with scored: the chain (default: Kthena's)
        context_window: 2048          # optional: enables the max_tokens clamp
      - name: big                     # prefill/decode disaggregation (docs/disaggregation.md)
        endpoints:
          - {url: http://10.0.0.1:8000, role: prefill}   # role: prefill | decode | both (default)
          - {url: http://10.0.0.2:8000, role: decode}
          - http://10.0.0.3:8000                         # a plain URL: role both

Models of a static inventory are always ready; it has no scaler.

Owns: the file's types (:class:`StaticFile`, msgspec Structs: an unknown key is an error with the
closest known one suggested; ``flexinfer proxy --schema`` prints their JSON Schema, committed as
``schemas/static.schema.json``), ``macros:`` and ``${env.NAME}`` in its strings, and the checks the
types cannot express (roles, URLs, unique names), every error as ``FILE:LINE: models[0].key: ...``
(docs/config.md). Must not: open connections or start anything.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

import msgspec

from flexinfer.runtime.base import (
    ENDPOINT_ROLES,
    ROUTING_STRATEGIES,
    Endpoint,
    ModelView,
    StaticInventoryBase,
)
from flexinfer.runtime.configfile import (
    InventoryConfigError,
    Path,
    Source,
    convert,
    expand_tree,
    read_yaml,
    schema,
    suggest,
    unescape,
    user_macros,
)

__all__ = ["InventoryConfigError", "StaticFile", "StaticInventory", "load_static", "static_schema"]

Routing = Annotated[str, msgspec.Meta(description="how requests pick a replica",
                                      extra_json_schema={"enum": list(ROUTING_STRATEGIES)})]
MacroValue = str | int | float


class EndpointSpec(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """One replica with its prefill/decode role (docs/disaggregation.md)."""

    url: Annotated[str, msgspec.Meta(description="http://host:port or https://host[:port] (TLS, docs/tls.md)")]
    role: Annotated[str, msgspec.Meta(extra_json_schema={"enum": list(ENDPOINT_ROLES)})] = "both"
    ca_file: Annotated[str | None, msgspec.Meta(
        description="https: PEM file of the CAs to trust instead of the system ones")] = None
    insecure_skip_verify: Annotated[bool, msgspec.Meta(
        description="https: skip certificate verification (testing only)")] = False
    api_key: Annotated[str | None, msgspec.Meta(
        description="sent upstream as Authorization: Bearer (the client's own is then never forwarded)")] = None


Endpoints = str | EndpointSpec | list[str | EndpointSpec]


class StaticModel(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """One model served by fixed backends."""

    name: Annotated[str, msgspec.Meta(description="what clients send as \"model\"")]
    endpoints: Annotated[Endpoints | None, msgspec.Meta(
        description="backend URLs, or {url, role} mappings")] = None
    endpoint: Annotated[Endpoints | None, msgspec.Meta(description="alias of endpoints")] = None
    served_name: Annotated[str | None, msgspec.Meta(description="body \"model\" rewritten to this")] = None
    aliases: str | list[str] = []
    routing: Routing = "default"
    scheduler: Annotated[str | None, msgspec.Meta(
        description="with routing: scored, the chain, e.g. least-request:1,kv-cache:1")] = None
    context_window: Annotated[int, msgspec.Meta(gt=0, description="enables the max_tokens clamp")] | None = None
    backend: str = "static"


class StaticFile(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The static inventory of `flexinfer proxy -c FILE`."""

    models: Annotated[list[StaticModel], msgspec.Meta(min_length=1)]
    macros: Annotated[dict[str, MacroValue], msgspec.Meta(
        description="user macros: ${NAME} in any string below; ${env.NAME} reads the environment")] = {}


class _Top(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    models: list[Any]
    macros: dict[str, MacroValue] = {}


def static_schema() -> dict[str, Any]:
    return schema(StaticFile, "FlexInfer static inventory (flexinfer proxy -c)")


def read_models_file(path: str, top: type[msgspec.Struct] = _Top) -> tuple[Source, Any]:
    """The file with a non-empty ``models`` list, its top level converted to ``top``."""
    src = read_yaml(path)
    doc = src.data
    if not isinstance(doc, Mapping) or not isinstance(doc.get("models"), list) or not doc["models"]:
        raise InventoryConfigError(f"{path}:1: expected a mapping with a non-empty 'models' list")
    out = convert(src, doc, top)
    if out is None:  # a top-level mistake: go on with the models, so that their errors are reported too
        out = top(models=doc["models"])
    return src, out


def _endpoints(src: Source, path: Path, value: Endpoints | None) -> tuple[Endpoint, ...]:
    if value is None:
        return ()
    items = value if isinstance(value, list) else [value]
    out: list[Endpoint] = []
    for i, item in enumerate(items):
        at: Path = (*path, i) if isinstance(value, list) else path
        url, role = (item.url, item.role) if isinstance(item, EndpointSpec) else (item, "both")
        tls: dict[str, Any] = {}
        if isinstance(item, EndpointSpec):
            tls = {"ca_file": item.ca_file, "insecure_skip_verify": item.insecure_skip_verify,
                   "api_key": item.api_key}
        if not url:
            src.error(at, "url must be a non-empty string")
            continue
        if role not in ENDPOINT_ROLES:
            src.error((*at, "role"), f"must be one of {', '.join(ENDPOINT_ROLES)}, not {role!r}{suggest(role, ENDPOINT_ROLES)}")
            continue
        try:
            out.append(Endpoint.parse(url, role, **tls))
        except ValueError as exc:
            src.error(at, str(exc))
    return tuple(out)


def check_routing(src: Source, path: Path, routing: str, scheduler: str | None) -> None:
    if routing not in ROUTING_STRATEGIES:
        src.error((*path, "routing"), f"unknown routing {routing!r}{suggest(routing, ROUTING_STRATEGIES)} "
                  f"(one of {', '.join(ROUTING_STRATEGIES)})")
    if scheduler is not None and not scheduler.strip():
        src.error((*path, "scheduler"), "scheduler must be a non-empty string "
                  "like 'least-request:1,prefix-cache:1;filters=least-request'")


def _model(src: Source, i: int, m: StaticModel) -> ModelView | None:
    path: Path = ("models", i)
    before = len(src.problems)
    if not m.name:
        src.error((*path, "name"), "every model needs a non-empty name")
    if m.endpoints is not None and m.endpoint is not None:
        src.error((*path, "endpoint"), "give endpoints or endpoint, not both")
    key = "endpoints" if m.endpoints is not None or m.endpoint is None else "endpoint"
    endpoints = _endpoints(src, (*path, key), m.endpoints if m.endpoints is not None else m.endpoint)
    if not endpoints and len(src.problems) == before:
        src.error(path, f"model {m.name!r}: at least one endpoint is required")
    roles = {e.role for e in endpoints}
    if "both" not in roles and len(roles) == 1:  # prefill only or decode only
        src.error((*path, key), "a disaggregated model needs at least one "
                  "prefill (or both) and one decode (or both) endpoint")
    check_routing(src, path, m.routing, m.scheduler)
    aliases = [m.aliases] if isinstance(m.aliases, str) else m.aliases
    for j, a in enumerate(aliases):
        if not a:
            src.error((*path, "aliases", j), "an alias must be a non-empty string")
    if len(src.problems) > before:
        return None
    return ModelView(name=m.name, endpoints=endpoints, ready=True, served_name=m.served_name,
                     aliases=tuple(aliases), routing=m.routing, scheduler=m.scheduler,
                     context_window=m.context_window, metadata={"backend": m.backend})


def check_unique_names(src: Source, entries: list[tuple[int, str, tuple[str, ...]]]) -> None:
    """Every name and alias must belong to one model only."""
    seen: dict[str, str] = {}
    for i, name, aliases in entries:
        for j, n in enumerate((name, *aliases)):
            if n in seen:
                at: Path = ("models", i, "name") if j == 0 else ("models", i, "aliases", j - 1)
                src.error(at, f"name {n!r} is used by both {seen[n]!r} and {name!r}")
            else:
                seen[n] = name


def load_static(path: str) -> list[ModelView]:
    src, top = read_models_file(path)
    macros = user_macros(src, top.macros, frozenset())
    views: list[ModelView] = []
    for i, raw in enumerate(top.models):
        base: Path = ("models", i)
        if isinstance(raw, Mapping):  # unknown keys are reported by convert, not expanded
            raw = {k: unescape(expand_tree(src, v, (*base, str(k)), macros.get))
                   if k in StaticModel.__struct_fields__ else v for k, v in raw.items()}
        m = convert(src, raw, StaticModel, base)
        v = _model(src, i, m) if m is not None else None
        if v is not None:
            views.append(v)
    src.raise_problems()
    check_unique_names(src, [(i, v.name, v.aliases) for i, v in enumerate(views)])
    src.raise_problems()
    return views


class StaticInventory(StaticInventoryBase):
    """Inventory backed by a YAML file; every model is ready and has fixed endpoints."""

    scaler = None

    @classmethod
    def from_file(cls, path: str) -> StaticInventory:
        return cls(load_static(path))
