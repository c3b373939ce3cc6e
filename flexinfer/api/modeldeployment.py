"""The legacy ``ModelDeployment`` CRD (ai.flexinfer/v1alpha1): schema, columns and typed view.

Owns: the v1alpha1 spec (backend, model, replicas, idle/cold-start seconds, per-backend blocks,
benchmark, GPUGroup membership) and status, the scale subresource (``kubectl scale md``), and
``ModelDeploymentSpec.backend_config()`` which maps the typed per-backend blocks onto the v1alpha2
``spec.config`` knobs so both API versions share one set of backend builders.

Must not: import Kubernetes clients.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from flexinfer import labels
from flexinfer.api.common import (
    INVALID_SPEC,
    V1ALPHA1,
    ObjectMeta,
    SpecError,
    check_kind,
    frozen_map,
    opt_time,
    parse_duration,
)
from flexinfer.api.conditions import READY, Condition, find_condition, parse_conditions
from flexinfer.api.model import LITELLM, NODE_SELECTOR, SERVICE_LABELS
from flexinfer.api.model_view import (
    LiteLLMSpec,
    Resources,
    check_config,
    parse_litellm,
    parse_resources,
    resolve_backend,
)
from flexinfer.api.schema import (
    READY_COLUMN,
    Column,
    KindDef,
    Schema,
    array,
    boolean,
    conditions,
    date_time,
    duration,
    integer,
    name_ref,
    number,
    obj,
    observed_generation,
    quantity,
    string,
    string_map,
)
from flexinfer.api.validate import validate, validate_lenient
from flexinfer.backends import ACCEPTED_NAMES, GPU_RESOURCE_NAMES

FINALIZER = labels.FINALIZER_LEGACY
PHASES = ("Pending", "Running", "Failed", "Terminating")
#: spec field of each backend's block
BACKEND_BLOCKS = {"mlc-llm": "mlcllm", "vllm": "vllm", "llamacpp": "llamacpp", "comfyui": "comfyui",
                  "vllm-omni": "vllmOmni"}

_QTY = quantity("")
MD_RESOURCES = obj("Resources of the backend container; GPUs are requested here in v1alpha1 "
                   "(nvidia.com/gpu, amd.com/gpu).", {
                       "limits": string_map("Maximum resources.", values=_QTY, max_properties=32),
                       "requests": string_map("Requested resources.", values=_QTY, max_properties=32),
                   })


def _vllm_block(desc: str) -> Schema:
    return obj(desc, {
        "tensorParallelSize": integer("GPUs to shard over.", minimum=1, maximum=8),
        "dtype": string("Weights/activation dtype (auto, half, bfloat16, float).", max_length=32),
        "quantization": string("Quantization method (awq, gptq, fp8, ...).", max_length=32),
        "maxModelLen": integer("Context length.", minimum=1),
        "gpuMemoryUtilization": number("Fraction of GPU memory to use.", minimum=0.05, maximum=1),
        "enforceEager": boolean("Disable CUDA graphs."),
        "maxNumSeqs": integer("Concurrent sequences.", minimum=1),
        "swapSpace": integer("CPU swap space per GPU, GiB.", minimum=0, maximum=1024),
        "trustRemoteCode": boolean("Allow model code from the repository."),
        "hipVisibleDevices": string("HIP_VISIBLE_DEVICES for ROCm.", max_length=64),
        "enablePrefixCaching": boolean("Automatic prefix caching."),
        "kvCacheDtype": string("KV-cache dtype (auto, fp8, ...).", max_length=32),
    })


MD_SPEC = obj("Desired state of a ModelDeployment (legacy; prefer Model).", {
    "backend": string("Inference server; default ollama.", enum=ACCEPTED_NAMES, default="ollama"),
    "model": string("Model to serve (Ollama tag, HF id or path).", min_length=1, max_length=2048),
    "replicas": integer("Desired replicas (the proxy sets 1 on demand).", minimum=0, maximum=100, default=1),
    "minReplicas": integer("Replicas kept while idle.", minimum=0, maximum=100, default=0),
    "idleTimeoutSeconds": integer("Idle seconds before scaling to minReplicas.", minimum=1, maximum=604800,
                                  default=300),
    "coldStartTimeoutSeconds": integer("Seconds requests wait for a cold start.", minimum=10, maximum=1800,
                                       default=60),
    "resources": MD_RESOURCES,
    "benchmark": obj("Tokens/s benchmark run before the deployment counts as ready.", {
        "warmupIterations": integer("Requests before measuring.", minimum=0, maximum=100, default=2),
        "minDuration": duration("Minimum measuring time.", default="30s"),
        "batchSize": integer("max_tokens per request.", minimum=1, maximum=4096, default=128),
        "iterations": integer("Measured requests.", minimum=1, maximum=1000, default=5),
    }),
    "modelCacheRef": name_ref("ModelCache holding the files (no PVC is created)."),
    "litellm": LITELLM,
    "nodeSelector": NODE_SELECTOR,
    "mlcllm": obj("MLC-LLM options.", {
        "mode": string("Engine mode.", enum=["local", "server", "interactive"]),
        "modelLibPath": string("Precompiled model library.", max_length=4096),
        "gpuMemoryBytes": integer("GPU memory MLC may plan with.", minimum=0, int64=True),
        "jitPolicy": string("JIT compilation policy.", enum=["ON", "OFF", "REDO", "READONLY"]),
        "overrides": obj("Engine overrides.", {
            "prefillChunkSize": integer("Prefill chunk size.", minimum=1),
            "maxTotalSeqLength": integer("Total sequence length.", minimum=1),
            "maxNumSequence": integer("Concurrent sequences.", minimum=1),
            "gpuMemoryUtilization": number("Fraction of GPU memory.", minimum=0.05, maximum=1),
            "contextWindowSize": integer("Context window.", minimum=1),
            "raw": string("More overrides, k=v;k=v.", max_length=4096),
        }),
        "compileOptions": string("Options for compiling the model library (unused: compile beforehand).",
                                 max_length=4096),
    }),
    "vllm": _vllm_block("vLLM options."),
    "llamacpp": obj("llama.cpp options.", {
        "ggufFile": string("GGUF file inside the model directory.", max_length=1024),
        "contextSize": integer("Context length.", minimum=1),
        "nGPULayers": integer("Layers to offload (-1 or 999: all).", minimum=-1),
        "threads": integer("CPU threads.", minimum=1, maximum=1024),
        "batchSize": integer("Logical batch size.", minimum=1),
        "flashAttention": boolean("Flash attention."),
        "mmproj": string("Multimodal projector file.", max_length=1024),
        "jinja": boolean("Use the model's Jinja chat template (enables tool calls)."),
        "parallel": integer("Parallel slots.", minimum=1, maximum=256),
    }),
    "comfyui": obj("ComfyUI options.", {
        "lowVram": boolean("--lowvram."),
        "highVram": boolean("--highvram."),
        "extraArgs": array(string("An argument."), "Extra arguments.", max_items=64),
    }),
    "vllmOmni": _vllm_block("vLLM-Omni options."),
    "gpuGroupRef": name_ref("GPUGroup this deployment time-shares a GPU in."),
    "priority": integer("Priority in the GPU group.", minimum=0, maximum=1000, default=100),
    "vramEstimateMB": integer("Expected VRAM use per GPU, MiB.", minimum=1, maximum=1048576),
    "serviceLabels": SERVICE_LABELS,
}, required=["model"])

MD_STATUS = obj("Observed state of a ModelDeployment.", {
    "observedGeneration": observed_generation(),
    "phase": string("Lifecycle phase.", enum=PHASES),
    "conditions": conditions(),
    "allocatedGPU": string("GPU the deployment runs on (node/device)."),
    "endpoints": obj("Where to reach it.", {
        "internal": string("In-cluster URL."),
        "external": string("External URL, if any."),
    }),
    "lastAccessTime": date_time("Last request seen by the proxy."),
    "tokensPerSecond": number("Benchmarked tokens per second.", minimum=0),
    "metrics": obj("Other measurements.", {
        "avgLatencyMs": number("Average request latency.", minimum=0),
        "loadTimeSeconds": number("Time to ready.", minimum=0),
    }),
    "replicas": integer("Current replicas (scale subresource).", minimum=0),
    "readyReplicas": integer("Ready replicas.", minimum=0),
    "selector": string("Label selector of the pods (scale subresource)."),
})

MODEL_DEPLOYMENT = KindDef(
    kind="ModelDeployment",
    plural="modeldeployments",
    singular="modeldeployment",
    version=V1ALPHA1,
    short_names=("md",),
    description="Legacy (v1alpha1) model deployment; superseded by Model.",
    spec=MD_SPEC,
    status=MD_STATUS,
    columns=(
        Column("Backend", ".spec.backend"),
        Column("Model", ".spec.model"),
        Column("Replicas", ".spec.replicas", "integer"),
        Column("Phase", ".status.phase"),
        READY_COLUMN,
        Column("TPS", ".status.tokensPerSecond", "number"),
        Column("GPUGroup", ".spec.gpuGroupRef", priority=1),
    ),
    scale={"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas",
           "labelSelectorPath": ".status.selector"},
    finalizer=FINALIZER,
)


@dataclass(frozen=True, slots=True)
class BenchmarkSpec:
    warmup_iterations: int
    min_duration_s: float
    batch_size: int
    iterations: int


@dataclass(frozen=True, slots=True)
class ModelDeploymentSpec:
    backend: str  # canonical
    model: str
    replicas: int
    min_replicas: int
    idle_timeout_s: float
    cold_start_timeout_s: float
    resources: Resources
    benchmark: BenchmarkSpec
    model_cache_ref: str | None
    litellm: LiteLLMSpec
    node_selector: Mapping[str, str]
    backend_options: Mapping[str, Any]  # the block of the chosen backend, as written
    gpu_group_ref: str | None
    priority: int
    vram_estimate_mb: int | None
    service_labels: tuple[str, ...]

    @property
    def gpu_vendor(self) -> str:
        """``nvidia``/``amd``/``intel`` from the GPU resource requested, else ``cpu``."""
        for vendor, key in GPU_RESOURCE_NAMES.items():
            if key in self.resources.limits or key in self.resources.requests:
                return vendor
        return "cpu"

    @property
    def gpu_count(self) -> int:
        key = GPU_RESOURCE_NAMES.get(self.gpu_vendor)
        if key is None:
            return 0
        return int(self.resources.limits.get(key) or self.resources.requests.get(key) or 0)

    def backend_config(self) -> dict[str, Any]:
        """The backend block as v1alpha2 ``spec.config`` knobs (for the backend builders)."""
        b = dict(self.backend_options)
        if self.backend == "mlc-llm":
            ov = dict(b.pop("overrides", None) or {})
            b.pop("compileOptions", None)
            raw = ov.pop("raw", None)
            b.update(ov)
            if raw:
                b["overridesRaw"] = raw
        return b

    @classmethod
    def from_dict(cls, raw: Any, path: str = "spec") -> ModelDeploymentSpec:
        if raw is None:
            raise SpecError(INVALID_SPEC, f"{path}: required")
        if isinstance(raw, Mapping) and raw.get("backend") == "":
            raw = {k: v for k, v in raw.items() if k != "backend"}  # the original read "" as ollama
        if isinstance(raw, Mapping) and isinstance(raw.get("backend"), str):
            resolve_backend(raw["backend"], f"{path}.backend")
        s = validate(MD_SPEC, raw, path)
        backend = resolve_backend(s["backend"], f"{path}.backend")
        block = BACKEND_BLOCKS.get(backend.name)
        bm = s.get("benchmark") or validate(MD_SPEC["properties"]["benchmark"], {}, f"{path}.benchmark")
        spec = cls(
            backend=backend.name, model=s["model"], replicas=s["replicas"], min_replicas=s["minReplicas"],
            idle_timeout_s=float(s["idleTimeoutSeconds"]), cold_start_timeout_s=float(s["coldStartTimeoutSeconds"]),
            resources=parse_resources(s.get("resources")),
            benchmark=BenchmarkSpec(bm["warmupIterations"], parse_duration(bm["minDuration"], path=f"{path}.benchmark.minDuration"),
                                    bm["batchSize"], bm["iterations"]),
            model_cache_ref=s.get("modelCacheRef"), litellm=parse_litellm(s.get("litellm")),
            node_selector=frozen_map(s.get("nodeSelector")),
            backend_options=frozen_map(s.get(block) if block else None),
            gpu_group_ref=s.get("gpuGroupRef"), priority=s["priority"], vram_estimate_mb=s.get("vramEstimateMB"),
            service_labels=tuple(s.get("serviceLabels") or ()),
        )
        check_config(backend, spec.backend_config(), f"{path}.{block or 'config'}")
        return spec


@dataclass(frozen=True, slots=True)
class ModelDeploymentStatus:
    observed_generation: int | None = None
    phase: str | None = None
    conditions: tuple[Condition, ...] = ()
    last_access_time: datetime | None = None
    tokens_per_second: float | None = None
    replicas: int | None = None
    ready_replicas: int | None = None
    endpoint: str | None = None

    @property
    def ready(self) -> bool:
        c = find_condition(self.conditions, READY)
        return c is not None and c.is_true

    @classmethod
    def from_dict(cls, raw: Any) -> ModelDeploymentStatus:
        s = validate_lenient(MD_STATUS, raw or {}) or {}
        return cls(s.get("observedGeneration"), s.get("phase"), parse_conditions(s.get("conditions")),
                   opt_time(s.get("lastAccessTime")), s.get("tokensPerSecond"), s.get("replicas"),
                   s.get("readyReplicas"), (s.get("endpoints") or {}).get("internal"))


@dataclass(frozen=True, slots=True)
class ModelDeployment:
    meta: ObjectMeta
    spec: ModelDeploymentSpec
    status: ModelDeploymentStatus

    @classmethod
    def from_obj(cls, obj: Mapping[str, Any]) -> ModelDeployment:
        check_kind(obj, "ModelDeployment")
        return cls(ObjectMeta.from_obj(obj), ModelDeploymentSpec.from_dict(obj.get("spec")),
                   ModelDeploymentStatus.from_dict(obj.get("status")))
