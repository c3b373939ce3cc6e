"""The ``ModelCatalog`` CRD (ai.flexinfer/v1alpha2): schema, printer columns and typed view.

Owns: the registries to list (OCI, Hugging Face, Ollama), the sync interval and filters, and the
status with the entries found. Listing the registries is the operator's job.

Must not: import Kubernetes clients or HTTP clients.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from flexinfer.api.common import (
    INVALID_SPEC,
    V1ALPHA2,
    ObjectMeta,
    SpecError,
    check_kind,
    opt_time,
    parse_duration,
)
from flexinfer.api.conditions import Condition, parse_conditions
from flexinfer.api.schema import (
    Column,
    KindDef,
    array,
    boolean,
    conditions,
    date_time,
    duration,
    integer,
    obj,
    observed_generation,
    rule,
    secret_ref,
    string,
)
from flexinfer.api.validate import validate, validate_lenient

REGISTRY_TYPES = ("OCI", "HuggingFace", "Ollama")


def _oci_has_url(r: dict[str, Any]) -> bool:
    return r.get("type") != "OCI" or bool(r.get("url"))


OCI_URL_RULE = rule("self.type != 'OCI' || (has(self.url) && size(self.url) > 0)", "OCI registries need url",
                    _oci_has_url, field_path=".url")

CATALOG_SPEC = obj("Registries to list models from.", {
    "registries": array(obj("A registry.", {
        "type": string("Registry kind.", enum=REGISTRY_TYPES),
        "url": string("Registry URL (OCI: host/repository prefix).", max_length=2048),
        "secretRef": secret_ref("Credentials: a dockerconfigjson Secret for OCI, key HF_TOKEN for Hugging Face."),
    }, required=["type"], rules=[OCI_URL_RULE]), "Registries to list.", min_items=1, max_items=16),
    "syncInterval": duration("Time between syncs.", default="1h"),
    "filter": obj("Which models to keep.", {
        "tags": array(string("A tag.", min_length=1, max_length=128), "Tags that must all be present.",
                      max_items=16, list_type="set"),
        "namePattern": string("Glob the model name must match (e.g. llama-*).", max_length=253),
    }),
}, required=["registries"])

CATALOG_STATUS = obj("Observed state of a catalog.", {
    "observedGeneration": observed_generation(),
    "conditions": conditions(),
    "entries": array(obj("A model found in a registry.", {
        "name": string("Model name."),
        "registry": string("Registry type it came from."),
        "reference": string("Source to use in a Model (HF://..., ollama://..., oci://...)."),
        "sizeBytes": integer("Size, when the registry says.", minimum=0, int64=True),
        "format": string("Weights format, when the registry says (gguf, safetensors, ...)."),
    }), "Models found at the last sync (at most 1000 and 256 KiB; see truncated).", max_items=2000),
    "totalModels": integer("Number of models found (more than the entries listed when truncated).", minimum=0),
    "truncated": boolean("True when more models matched than the entries list (narrow the filter)."),
    "lastSyncTime": date_time("When the last sync finished."),
})

MODEL_CATALOG = KindDef(
    kind="ModelCatalog",
    plural="modelcatalogs",
    singular="modelcatalog",
    version=V1ALPHA2,
    short_names=("mcat",),
    description="A periodically synced list of models available in OCI, Hugging Face and Ollama registries.",
    spec=CATALOG_SPEC,
    status=CATALOG_STATUS,
    columns=(
        Column("Models", ".status.totalModels", "integer"),
        Column("LastSync", ".status.lastSyncTime", "date"),
    ),
)


@dataclass(frozen=True, slots=True)
class CatalogRegistry:
    type: str  # OCI | HuggingFace | Ollama
    url: str | None
    secret_name: str | None


@dataclass(frozen=True, slots=True)
class ModelCatalogSpec:
    registries: tuple[CatalogRegistry, ...]
    sync_interval_s: float
    filter_tags: tuple[str, ...]
    name_pattern: str | None

    @classmethod
    def from_dict(cls, raw: Any, path: str = "spec") -> ModelCatalogSpec:
        if raw is None:
            raise SpecError(INVALID_SPEC, f"{path}: required")
        s = validate(CATALOG_SPEC, raw, path)
        f = s.get("filter") or {}
        return cls(
            registries=tuple(CatalogRegistry(r["type"], r.get("url") or None, (r.get("secretRef") or {}).get("name"))
                             for r in s["registries"]),
            sync_interval_s=parse_duration(s["syncInterval"], path=f"{path}.syncInterval"),
            filter_tags=tuple(f.get("tags") or ()),
            name_pattern=f.get("namePattern") or None,
        )


@dataclass(frozen=True, slots=True)
class CatalogEntry:
    name: str | None
    registry: str | None
    reference: str | None
    size_bytes: int | None
    format: str | None = None


@dataclass(frozen=True, slots=True)
class ModelCatalogStatus:
    observed_generation: int | None = None
    conditions: tuple[Condition, ...] = ()
    entries: tuple[CatalogEntry, ...] = ()
    total_models: int = 0
    last_sync_time: datetime | None = None
    truncated: bool = False

    @classmethod
    def from_dict(cls, raw: Any) -> ModelCatalogStatus:
        s = validate_lenient(CATALOG_STATUS, raw or {}) or {}
        return cls(
            observed_generation=s.get("observedGeneration"), conditions=parse_conditions(s.get("conditions")),
            entries=tuple(CatalogEntry(e.get("name"), e.get("registry"), e.get("reference"), e.get("sizeBytes"),
                                       e.get("format")) for e in s.get("entries") or ()),
            total_models=s.get("totalModels", 0), last_sync_time=opt_time(s.get("lastSyncTime")),
            truncated=bool(s.get("truncated", False)),
        )


@dataclass(frozen=True, slots=True)
class ModelCatalog:
    meta: ObjectMeta
    spec: ModelCatalogSpec
    status: ModelCatalogStatus

    @classmethod
    def from_obj(cls, obj: Mapping[str, Any]) -> ModelCatalog:
        check_kind(obj, "ModelCatalog")
        return cls(ObjectMeta.from_obj(obj), ModelCatalogSpec.from_dict(obj.get("spec")),
                   ModelCatalogStatus.from_dict(obj.get("status")))
