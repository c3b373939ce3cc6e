"""The legacy ``ModelCache`` CRD (ai.flexinfer/v1alpha1): schema, columns and typed view.

Owns: the cache source (huggingface://, HF://, mlc://, oci://, oras://), storage strategy (Auto is
SharedPVC), storage, eviction, flash-loader and quantization settings, and the status. A Model's
flash-loader settings may come from a matching ModelCache (the operator resolves that).

Must not: import Kubernetes clients.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from flexinfer.api.common import (
    INVALID_SPEC,
    V1ALPHA1,
    ObjectMeta,
    SpecError,
    check_kind,
    frozen_map,
    opt_time,
)
from flexinfer.api.conditions import READY, Condition, find_condition, parse_conditions
from flexinfer.api.model import NODE_SELECTOR
from flexinfer.api.schema import (
    READY_COLUMN,
    Column,
    KindDef,
    boolean,
    conditions,
    date_time,
    integer,
    name_ref,
    obj,
    observed_generation,
    quantity,
    secret_ref,
    string,
)
from flexinfer.api.validate import validate, validate_lenient

PHASES = ("Pending", "Initializing", "Provisioning", "Quantizing", "Ready", "Failed")
#: Ephemeral existed in the original's enum but was never implemented, so it is not accepted
STRATEGIES = ("Auto", "NodeLocal", "SharedPVC", "Memory")
EVICTION_POLICIES = ("LRU", "LFU", "FIFO", "None")
QUANT_FORMATS = ("GGUF", "AWQ", "GPTQ", "EXL2", "FP8")
SOURCE_PATTERN = r"^(huggingface|HF|hf|mlc|oci|oras)://\S+$"

CACHE_SPEC = obj("Model files to cache for ModelDeployments and Models.", {
    "source": string("huggingface://org/model, HF://org/model, mlc://..., oci://... or oras://...",
                     pattern=SOURCE_PATTERN, max_length=2048),
    "storageStrategy": string("Auto (= SharedPVC), NodeLocal (per-node DaemonSet), SharedPVC or Memory.",
                              enum=STRATEGIES, default="Auto"),
    "existingClaimName": name_ref("Use this PVC instead of creating one."),
    "modelPath": string("Path of the files inside the volume.", max_length=4096),
    "storageSize": quantity("Size of a created PVC.", default="50Gi"),
    "storageClassName": string("StorageClass of a created PVC; empty: the cluster default.", max_length=253),
    "secretRef": secret_ref("Secret with HF_TOKEN for Hugging Face sources."),
    "ociRegistrySecretRef": secret_ref("dockerconfigjson Secret for oci:// and oras:// sources."),
    "nodeSelector": NODE_SELECTOR,
    "hostPath": string("Host directory for NodeLocal.", max_length=4096),
    "evictionPolicy": string("What to evict first when the disk fills.", enum=EVICTION_POLICIES, default="LRU"),
    "evictionThresholdPercent": integer("Disk use that triggers eviction.", minimum=1, maximum=100, default=85),
    "retentionPriority": integer("Higher is evicted later.", minimum=0, maximum=100, default=50),
    "modelGroup": string("Group name for eviction accounting.", max_length=63),
    "flashLoader": obj("Flash-loader defaults for Models using this cache.", {
        "enabled": boolean("Run the flash-loader.", default=False),
        "concurrency": integer("Parallel copies.", minimum=1, maximum=32, default=4),
        "bufferSizeKB": integer("Copy buffer, KiB.", minimum=32, maximum=16384, default=4096),
        "tmpfsSizeLimit": quantity("Size limit of the tmpfs volume."),
        "image": string("Flash-loader image.", max_length=1024),
    }),
    "quantization": obj("Quantize after download.", {
        "format": string("Target format.", enum=QUANT_FORMATS),
        "ggufType": string("GGUF type (Q4_K_M, Q8_0, ...).", max_length=32),
        "bits": integer("Bits per weight.", minimum=2, maximum=8),
        "groupSize": integer("Quantization group size.", minimum=1, maximum=4096),
        "useGPU": boolean("Quantize on a GPU."),
        "maxMemoryGB": integer("Memory limit of the quantization Job.", minimum=1, maximum=4096),
    }, required=["format"]),
}, required=["source"])

CACHE_STATUS = obj("Observed state of a ModelCache.", {
    "observedGeneration": observed_generation(),
    "phase": string("Lifecycle phase.", enum=PHASES),
    "conditions": conditions(),
    "message": string("Details.", max_length=32768),
    "path": string("Where the files are inside the volume."),
    "readyNodes": integer("Nodes with the files (NodeLocal).", minimum=0),
    "totalNodes": integer("Nodes that should have them.", minimum=0),
    "sizeBytes": integer("Size of the files.", minimum=0, int64=True),
    "lastAccessTime": date_time("Last use (LRU)."),
    "accessCount": integer("Uses (LFU).", minimum=0, int64=True),
    "quantization": obj("Result of quantization.", {
        "format": string("Format produced."),
        "path": string("Path of the quantized files."),
        "sizeBytes": integer("Size.", minimum=0, int64=True),
        "completedAt": date_time("When it finished."),
    }),
    "ociDigest": string("Digest pulled (oci://, oras://)."),
    "ociRegistry": string("Registry pulled from."),
})

MODEL_CACHE = KindDef(
    kind="ModelCache",
    plural="modelcaches",
    singular="modelcache",
    version=V1ALPHA1,
    short_names=("mcache",),
    description="Legacy (v1alpha1) model file cache on a PVC, on every node, or in memory.",
    spec=CACHE_SPEC,
    status=CACHE_STATUS,
    columns=(
        Column("Strategy", ".spec.storageStrategy"),
        Column("Phase", ".status.phase"),
        READY_COLUMN,
        Column("Source", ".spec.source", priority=1),
        Column("Nodes", ".status.readyNodes", "integer", priority=1),
    ),
)


@dataclass(frozen=True, slots=True)
class CacheFlashLoader:
    enabled: bool
    concurrency: int
    buffer_size_kb: int
    tmpfs_size_limit: str | None
    image: str | None


@dataclass(frozen=True, slots=True)
class QuantizationSpec:
    format: str
    gguf_type: str | None
    bits: int | None
    group_size: int | None
    use_gpu: bool
    max_memory_gb: int | None


@dataclass(frozen=True, slots=True)
class ModelCacheSpec:
    source: str
    storage_strategy: str  # effective: NodeLocal | SharedPVC | Memory (Auto -> SharedPVC)
    storage_strategy_raw: str
    existing_claim_name: str | None
    model_path: str | None
    storage_size: str
    storage_class: str | None
    secret_name: str | None
    oci_secret_name: str | None
    node_selector: Mapping[str, str]
    host_path: str | None
    eviction_policy: str
    eviction_threshold_percent: int
    retention_priority: int
    model_group: str | None
    flash_loader: CacheFlashLoader | None  # None: no flashLoader block
    quantization: QuantizationSpec | None

    @classmethod
    def from_dict(cls, raw: Any, path: str = "spec") -> ModelCacheSpec:
        if raw is None:
            raise SpecError(INVALID_SPEC, f"{path}: required")
        s = validate(CACHE_SPEC, raw, path)
        fl, q = s.get("flashLoader"), s.get("quantization")
        strategy = s["storageStrategy"]
        return cls(
            source=s["source"], storage_strategy="SharedPVC" if strategy == "Auto" else strategy,
            storage_strategy_raw=strategy, existing_claim_name=s.get("existingClaimName"),
            model_path=s.get("modelPath"), storage_size=str(s["storageSize"]),
            storage_class=s.get("storageClassName") or None, secret_name=(s.get("secretRef") or {}).get("name"),
            oci_secret_name=(s.get("ociRegistrySecretRef") or {}).get("name"),
            node_selector=frozen_map(s.get("nodeSelector")), host_path=s.get("hostPath"),
            eviction_policy=s["evictionPolicy"], eviction_threshold_percent=s["evictionThresholdPercent"],
            retention_priority=s["retentionPriority"], model_group=s.get("modelGroup"),
            flash_loader=CacheFlashLoader(fl["enabled"], fl["concurrency"], fl["bufferSizeKB"],
                                          str(fl["tmpfsSizeLimit"]) if "tmpfsSizeLimit" in fl else None,
                                          fl.get("image")) if fl is not None else None,
            quantization=QuantizationSpec(q["format"], q.get("ggufType"), q.get("bits"), q.get("groupSize"),
                                          bool(q.get("useGPU", False)), q.get("maxMemoryGB")) if q else None,
        )


@dataclass(frozen=True, slots=True)
class ModelCacheStatus:
    observed_generation: int | None = None
    phase: str | None = None
    conditions: tuple[Condition, ...] = ()
    path: str | None = None
    ready_nodes: int | None = None
    total_nodes: int | None = None
    last_access_time: datetime | None = None

    @property
    def ready(self) -> bool:
        c = find_condition(self.conditions, READY)
        return (c is not None and c.is_true) or self.phase == "Ready"

    @classmethod
    def from_dict(cls, raw: Any) -> ModelCacheStatus:
        s = validate_lenient(CACHE_STATUS, raw or {}) or {}
        return cls(s.get("observedGeneration"), s.get("phase"), parse_conditions(s.get("conditions")),
                   s.get("path"), s.get("readyNodes"), s.get("totalNodes"), opt_time(s.get("lastAccessTime")))


@dataclass(frozen=True, slots=True)
class ModelCache:
    meta: ObjectMeta
    spec: ModelCacheSpec
    status: ModelCacheStatus

    @classmethod
    def from_obj(cls, obj: Mapping[str, Any]) -> ModelCache:
        check_kind(obj, "ModelCache")
        return cls(ObjectMeta.from_obj(obj), ModelCacheSpec.from_dict(obj.get("spec")),
                   ModelCacheStatus.from_dict(obj.get("status")))
