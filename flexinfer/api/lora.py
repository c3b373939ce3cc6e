"""The ``LoRAAdapter`` CRD (ai.flexinfer/v1alpha2): schema, printer columns and typed view.

Owns: the adapter spec (parent Model, the name clients send, where the weights are) and status
(phase, loaded/total replicas). The operator hot-loads adapters on every replica of the parent.

Must not: import Kubernetes clients or talk to backends.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from flexinfer import labels
from flexinfer.api.common import INVALID_SPEC, V1ALPHA2, ObjectMeta, SpecError, check_kind
from flexinfer.api.conditions import READY, Condition, find_condition, parse_conditions
from flexinfer.api.schema import (
    Column,
    KindDef,
    boolean,
    conditions,
    integer,
    name_ref,
    obj,
    observed_generation,
    string,
)
from flexinfer.api.validate import validate, validate_lenient

FINALIZER = labels.FINALIZER_LORA
PHASES = ("Pending", "Caching", "Loaded", "Unloading", "Failed")
SOURCE_TYPES = ("HuggingFace", "OCI", "LocalPath")

LORA_SPEC = obj("Desired state of a LoRA adapter.", {
    "modelRef": name_ref("Name of the parent Model in the same namespace."),
    "adapterName": string("Name clients send as model to use the adapter.", min_length=1, max_length=253,
                          pattern=r"^\S+$"),
    "source": obj("Where the adapter weights are (passed to the backend as is).", {
        "type": string("Kind of location.", enum=SOURCE_TYPES),
        "uri": string("HF repo id, OCI reference or path inside the backend pod.", min_length=1, max_length=2048),
    }, required=["type", "uri"]),
    "maxRank": integer("Largest LoRA rank to allow (vLLM max_lora_rank).", minimum=1, maximum=1024),
    "preload": boolean("Load the adapter as soon as the parent is ready.", default=False),
}, required=["modelRef", "adapterName", "source"])

LORA_STATUS = obj("Observed state of a LoRA adapter.", {
    "observedGeneration": observed_generation(),
    "phase": string("Lifecycle phase.", enum=PHASES),
    "conditions": conditions(),
    "loadedReplicas": integer("Replicas of the parent that have the adapter loaded.", minimum=0),
    "totalReplicas": integer("Ready replicas of the parent.", minimum=0),
    "message": string("Details of the last load or failure.", max_length=32768),
})

LORA_ADAPTER = KindDef(
    kind="LoRAAdapter",
    plural="loraadapters",
    singular="loraadapter",
    version=V1ALPHA2,
    short_names=("lora",),
    description="A LoRA adapter hot-loaded on every replica of its parent Model.",
    spec=LORA_SPEC,
    status=LORA_STATUS,
    columns=(
        Column("Model", ".spec.modelRef"),
        Column("Adapter", ".spec.adapterName"),
        Column("Phase", ".status.phase"),
        Column("Loaded", ".status.loadedReplicas", "integer", description="Replicas with the adapter loaded"),
        Column("Total", ".status.totalReplicas", "integer", priority=1),
    ),
    finalizer=FINALIZER,
)


@dataclass(frozen=True, slots=True)
class LoRAAdapterSpec:
    model_ref: str
    adapter_name: str
    source_type: str  # HuggingFace | OCI | LocalPath
    source_uri: str
    max_rank: int | None
    preload: bool

    @classmethod
    def from_dict(cls, raw: Any, path: str = "spec") -> LoRAAdapterSpec:
        if raw is None:
            raise SpecError(INVALID_SPEC, f"{path}: required")
        s = validate(LORA_SPEC, raw, path)
        return cls(model_ref=s["modelRef"], adapter_name=s["adapterName"], source_type=s["source"]["type"],
                   source_uri=s["source"]["uri"], max_rank=s.get("maxRank"), preload=s["preload"])


@dataclass(frozen=True, slots=True)
class LoRAAdapterStatus:
    observed_generation: int | None = None
    phase: str | None = None
    conditions: tuple[Condition, ...] = ()
    loaded_replicas: int = 0
    total_replicas: int = 0
    message: str | None = None

    @property
    def ready(self) -> bool:
        c = find_condition(self.conditions, READY)
        return c is not None and c.is_true

    @classmethod
    def from_dict(cls, raw: Any) -> LoRAAdapterStatus:
        s = validate_lenient(LORA_STATUS, raw or {}) or {}
        return cls(observed_generation=s.get("observedGeneration"), phase=s.get("phase"),
                   conditions=parse_conditions(s.get("conditions")), loaded_replicas=s.get("loadedReplicas", 0),
                   total_replicas=s.get("totalReplicas", 0), message=s.get("message"))


@dataclass(frozen=True, slots=True)
class LoRAAdapter:
    meta: ObjectMeta
    spec: LoRAAdapterSpec
    status: LoRAAdapterStatus

    @classmethod
    def from_obj(cls, obj: Mapping[str, Any]) -> LoRAAdapter:
        check_kind(obj, "LoRAAdapter")
        return cls(ObjectMeta.from_obj(obj), LoRAAdapterSpec.from_dict(obj.get("spec")),
                   LoRAAdapterStatus.from_dict(obj.get("status")))
