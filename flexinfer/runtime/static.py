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
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from flexinfer.runtime.base import (
    ENDPOINT_ROLES,
    ROUTING_STRATEGIES,
    Endpoint,
    ModelView,
    StaticInventoryBase,
)


class InventoryConfigError(ValueError):
    """The inventory file is malformed; the message names the model and field."""


def _str_list(model: str, key: str, value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(x, str) and x for x in value):
        raise InventoryConfigError(f"model {model!r}: {key} must be a list of strings")
    return tuple(value)


def _endpoints(model: str, value: Any) -> tuple[Endpoint, ...]:
    """``endpoints``: URL strings, or mappings ``{url: ..., role: prefill|decode|both}``."""
    if value is None:
        return ()
    if isinstance(value, str | Mapping):
        value = [value]
    if not isinstance(value, list):
        raise InventoryConfigError(f"model {model!r}: endpoints must be a list of URLs or {{url, role}} mappings")
    out: list[Endpoint] = []
    for i, item in enumerate(value):
        role: Any = "both"
        if isinstance(item, Mapping):
            extra = set(item) - {"url", "role"}
            if extra:
                raise InventoryConfigError(f"model {model!r}: endpoints[{i}]: unknown field(s) "
                                           f"{', '.join(sorted(map(str, extra)))} (url, role)")
            role = item.get("role", "both")
            item = item.get("url")
        if not isinstance(item, str) or not item:
            raise InventoryConfigError(f"model {model!r}: endpoints[{i}]: url must be a non-empty string")
        if role not in ENDPOINT_ROLES:
            raise InventoryConfigError(f"model {model!r}: endpoints[{i}]: role must be one of "
                                       f"{', '.join(ENDPOINT_ROLES)}, not {role!r}")
        try:
            out.append(Endpoint.parse(item, role))
        except ValueError as exc:
            raise InventoryConfigError(f"model {model!r}: {exc}") from None
    return tuple(out)


def parse_model(entry: Mapping[str, Any]) -> ModelView:
    if not isinstance(entry, Mapping):
        raise InventoryConfigError("each entry of 'models' must be a mapping")
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise InventoryConfigError("every model needs a non-empty 'name'")
    endpoints = _endpoints(name, entry.get("endpoints", entry.get("endpoint")))
    if not endpoints:
        raise InventoryConfigError(f"model {name!r}: at least one endpoint is required")
    roles = {e.role for e in endpoints}
    if "both" not in roles and len(roles) == 1:  # prefill only or decode only
        raise InventoryConfigError(f"model {name!r}: endpoints: a disaggregated model needs at least one "
                                   "prefill (or both) and one decode (or both) endpoint")
    routing = entry.get("routing", "default")
    if routing not in ROUTING_STRATEGIES:
        raise InventoryConfigError(f"model {name!r}: routing must be one of {', '.join(ROUTING_STRATEGIES)}")
    scheduler = entry.get("scheduler")
    if scheduler is not None and (not isinstance(scheduler, str) or not scheduler.strip()):
        raise InventoryConfigError(f"model {name!r}: scheduler must be a non-empty string "
                                   "like 'least-request:1,prefix-cache:1;filters=least-request'")
    window = entry.get("context_window")
    if window is not None and (not isinstance(window, int) or window <= 0):
        raise InventoryConfigError(f"model {name!r}: context_window must be a positive integer")
    served = entry.get("served_name")
    if served is not None and not isinstance(served, str):
        raise InventoryConfigError(f"model {name!r}: served_name must be a string")
    return ModelView(
        name=name,
        endpoints=endpoints,
        ready=True,
        served_name=served,
        aliases=_str_list(name, "aliases", entry.get("aliases")),
        routing=routing,
        scheduler=scheduler,
        context_window=window,
        metadata={"backend": str(entry.get("backend", "static"))},
    )


def read_models_file(path: str) -> Mapping[str, Any]:
    """The YAML document of an inventory file (static or local), with a non-empty ``models`` list."""
    try:
        with open(path, encoding="utf-8") as fh:
            doc = yaml.safe_load(fh) or {}
    except OSError as exc:
        raise InventoryConfigError(f"cannot read {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise InventoryConfigError(f"{path} is not valid YAML: {exc}") from None
    if not isinstance(doc, Mapping) or not isinstance(doc.get("models"), list) or not doc["models"]:
        raise InventoryConfigError(f"{path}: expected a mapping with a non-empty 'models' list")
    return doc


def check_unique_names(entries: list[tuple[str, tuple[str, ...]]]) -> None:
    """Every name and alias must belong to one model only."""
    seen: dict[str, str] = {}
    for name, aliases in entries:
        for n in (name, *aliases):
            if n in seen:
                raise InventoryConfigError(f"name {n!r} is used by both {seen[n]!r} and {name!r}")
            seen[n] = name


def load_static(path: str) -> list[ModelView]:
    views = [parse_model(e) for e in read_models_file(path)["models"]]
    check_unique_names([(v.name, v.aliases) for v in views])
    return views


class StaticInventory(StaticInventoryBase):
    """Inventory backed by a YAML file; every model is ready and has fixed endpoints."""

    scaler = None

    @classmethod
    def from_file(cls, path: str) -> StaticInventory:
        return cls(load_static(path))
