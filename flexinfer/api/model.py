"""The ``Model`` CRD (ai.flexinfer/v1alpha2): its OpenAPI schema, CEL rules and printer columns.

Owns: the spec and status schemas of Model, the building blocks other kinds reuse (``LITELLM``,
``RESOURCES``, ``TOLERATIONS``, ``NODE_SELECTOR``, ``MODEL_SPEC`` for FederatedModel templates),
and the ``MODEL`` KindDef. Defaults that depend on other fields (GPU count, cache strategy, idle
timeout) are not schema defaults; ``model_view`` applies them, as the original's helpers did.

Must not: import Kubernetes clients; parse objects (that is ``model_view``).
"""

from __future__ import annotations

from typing import Any

from flexinfer import labels
from flexinfer.api.common import NODE_VENDOR_LABEL, V1ALPHA2
from flexinfer.api.schema import (
    LABEL_VALUE,
    Column,
    KindDef,
    Schema,
    array,
    boolean,
    conditions,
    date_time,
    duration,
    free_object,
    integer,
    name_ref,
    number,
    obj,
    observed_generation,
    quantity,
    rule,
    string,
    string_map,
)
from flexinfer.backends import ACCEPTED_NAMES, GPU_RESOURCE_NAMES, VENDORS

FINALIZER = labels.FINALIZER_MODEL
PHASES = ("Idle", "Pending", "Loading", "Ready", "Preempted", "Failed")
CACHE_STRATEGIES = ("Memory", "SharedPVC", "Local", "None")
SHARED_STATES = ("Active", "Queued", "Preempted")
PRESSURE_POLICIES = ("Observe", "Reconfigure", "Evict")
SOURCE_PATTERN = r"^(HF|hf|ollama|file|pvc)://\S+$"
GPU_KEYS: tuple[str, ...] = tuple(GPU_RESOURCE_NAMES.values())

# ---- CEL rules with their Python twins -------------------------------------------------------------


def _cpu_has_no_gpu_fields(g: dict[str, Any]) -> bool:
    return g.get("vendor") != "cpu" or not ({"count", "vramEstimateMB", "shared"} & g.keys())


def _no_gpu_resources(r: dict[str, Any]) -> bool:
    return not any(k in (r.get(part) or {}) for part in ("limits", "requests") for k in GPU_KEYS)


def _node_selector_vendor(spec: dict[str, Any]) -> bool:
    sel = spec.get("nodeSelector") or {}
    gpu = spec.get("gpu")
    if NODE_VENDOR_LABEL not in sel or gpu is None or gpu.get("vendor", "auto") == "auto":
        return True
    return bool(sel[NODE_VENDOR_LABEL] == gpu.get("vendor"))


def _pvc_source_cache(spec: dict[str, Any]) -> bool:
    return not str(spec.get("source", "")).startswith("pvc://") or (spec.get("cache") or {}).get("strategy") != "Memory"


def _watermarks_ordered(kv: dict[str, Any]) -> bool:
    lo, hi = kv.get("lowWatermark"), kv.get("highWatermark")
    return lo is None or hi is None or lo <= hi


def _gpu_keys_absent(part: str) -> str:
    return f"!has(self.{part}) || !(" + " || ".join(f"'{k}' in self.{part}" for k in GPU_KEYS) + ")"


CPU_RULE = rule(
    "!has(self.vendor) || self.vendor != 'cpu' || (!has(self.count) && !has(self.vramEstimateMB) && !has(self.shared))",
    "with vendor cpu, count, vramEstimateMB and shared must be empty", _cpu_has_no_gpu_fields)
GPU_RESOURCES_RULE = rule(
    f"({_gpu_keys_absent('limits')}) && ({_gpu_keys_absent('requests')})",
    f"GPU resources ({', '.join(GPU_KEYS)}) are set by spec.gpu.count, not spec.resources", _no_gpu_resources)
NODE_SELECTOR_RULE = rule(
    f"!has(self.nodeSelector) || !('{NODE_VENDOR_LABEL}' in self.nodeSelector) || !has(self.gpu) || "
    f"!has(self.gpu.vendor) || self.gpu.vendor == 'auto' || "
    f"self.nodeSelector['{NODE_VENDOR_LABEL}'] == self.gpu.vendor",
    f"nodeSelector {NODE_VENDOR_LABEL} must match gpu.vendor", _node_selector_vendor, field_path=".nodeSelector")
PVC_SOURCE_RULE = rule(
    "!self.source.startsWith('pvc://') || !has(self.cache) || !has(self.cache.strategy) || "
    "self.cache.strategy != 'Memory'",
    "a pvc:// source cannot use cache strategy Memory", _pvc_source_cache, field_path=".cache")
WATERMARK_RULE = rule(
    "!has(self.lowWatermark) || !has(self.highWatermark) || self.lowWatermark <= self.highWatermark",
    "lowWatermark must not exceed highWatermark", _watermarks_ordered)

# ---- blocks shared with other kinds ------------------------------------------------------------------

_QTY_VALUE: Schema = quantity("")

RESOURCES = obj("CPU and memory for the backend container. GPUs come from spec.gpu.count.", {
    "limits": string_map("Maximum resources, e.g. memory: 32Gi.", values=_QTY_VALUE, max_properties=32),
    "requests": string_map("Requested resources, e.g. cpu: '4'.", values=_QTY_VALUE, max_properties=32),
}, rules=[GPU_RESOURCES_RULE])

NODE_SELECTOR = string_map("Node labels the backend pod must match.", max_properties=32)

TOLERATIONS = array(obj("A toleration (core/v1 Toleration).", {
    "key": string("Taint key; empty with operator Exists matches every taint.", max_length=317),
    "operator": string("Key relation.", enum=["Exists", "Equal"]),
    "value": string("Taint value for operator Equal.", max_length=63),
    "effect": string("Taint effect to match; empty matches all.", enum=["NoSchedule", "PreferNoSchedule", "NoExecute"]),
    "tolerationSeconds": integer("How long a NoExecute taint is tolerated.", int64=True),
}), "Extra tolerations for the backend pod (GPU pods always tolerate dedicated=gpu:NoSchedule).",
    max_items=32)

LITELLM = obj("LiteLLM discovery and the names clients may use for this model.", {
    "enabled": boolean("Publish the model to LiteLLM and serve it through the proxy.", default=True),
    "servedModelName": string("Name clients send as model (resolves to this resource).", max_length=253),
    "aliases": array(string("An alias.", min_length=1, max_length=253), "More names resolving to this model.",
                     max_items=32, list_type="set"),
    "copilotAlias": string("Name published for Copilot-style clients.", max_length=253),
})

SERVICE_LABELS = array(string("A service label, e.g. textgen.", min_length=1, max_length=63, pattern=LABEL_VALUE),
                       "Service labels (e.g. textgen) that route to this model; in a shared group only the active "
                       "model claims them.", max_items=10, list_type="set")

# ---- Model spec ------------------------------------------------------------------------------------

GPU = obj("GPU requirements. Leaving gpu out runs on CPU; gpu: {} asks for one GPU of any vendor.", {
    "vendor": string("GPU vendor; auto picks the vendor of the matching nodes.", enum=VENDORS, default="auto"),
    "shared": string("Name of a GPU-sharing group: models with the same name time-share one GPU.",
                     min_length=1, max_length=63, pattern=LABEL_VALUE),
    "priority": integer("Priority in the shared group (higher wins).", minimum=0, maximum=1000, default=100),
    "count": integer("GPUs per replica (default 1 for a GPU vendor).", minimum=1, maximum=8),
    "vramEstimateMB": integer("Expected VRAM use per GPU, MiB (fit check and scheduling).", minimum=1,
                              maximum=1048576),
    "swapCooldown": duration("Minimum time between swaps in the shared group.", default="5m"),
    "forcePromotion": boolean("Take the shared GPU now, ignoring the cooldown."),
}, rules=[CPU_RULE])

SERVERLESS = obj("Scale to zero when idle and wake on demand.", {
    "enabled": boolean("Scale to zero after idleTimeout (false keeps minReplicas, at least 1, running).",
                       default=True),
    "minReplicas": integer("Replicas kept while idle.", minimum=0, maximum=10, default=0),
    "idleTimeout": duration("Idle time before scaling down (default: the backend's, 5m; 10m for image backends)."),
    "coldStartTimeout": duration("How long requests wait for a cold start before failing.", default="60s"),
})

COMPILATION_CACHE = obj("Persistent kernel/compile cache (on by default for shared AMD/auto models).", {
    "enabled": boolean("Mount the compile cache (default: on when shared and vendor is amd or auto)."),
    "hostPath": string("Host directory of the cache.", default="/var/lib/flexinfer/compile-cache", max_length=4096),
    "sizeLimit": quantity("Size limit of the cache.", default="2Gi"),
})

FLASH_LOADER = obj("Copy model files into tmpfs before the backend starts.", {
    "enabled": boolean("Run the flash-loader (default: on for shared models with a Local cache)."),
    "concurrency": integer("Parallel copies.", minimum=1, maximum=32, default=4),
    "tmpfsSizeLimit": quantity("Size limit of the tmpfs volume."),
    "bufferSizeKB": integer("Copy buffer, KiB.", minimum=32, maximum=16384, default=4096),
    "verifyIntegrity": boolean("Compare sizes after copying.", default=False),
    "image": string("Flash-loader image.", max_length=1024),
})

CACHE = obj("Where model files live.", {
    "strategy": string("Memory (tmpfs), SharedPVC, Local (hostPath) or None. Default: Memory if shared, else "
                       "SharedPVC.", enum=CACHE_STRATEGIES),
    "pvcName": name_ref("Existing PVC to use (SharedPVC); default <name>-cache is created."),
    "storageClass": string("StorageClass of a created PVC; empty: the cluster default.", max_length=253),
    "size": quantity("Size of a created PVC.", default="50Gi"),
    "hostPath": string("Host directory for Local; files go to <hostPath>/<namespace>/<name>.",
                       default="/var/lib/flexinfer/models", max_length=4096),
    "compilationCache": COMPILATION_CACHE,
    "flashLoader": FLASH_LOADER,
})

CAPABILITIES = obj("What the model can do; unset fields are inferred from the backend and config.", {
    "toolCalling": boolean("Supports tool/function calling."),
    "vision": boolean("Accepts images."),
    "imageGeneration": boolean("Generates images."),
})

KV_CACHE = obj("KV-cache pressure handling.", {
    "pressurePolicy": string("What to do above highWatermark.", enum=PRESSURE_POLICIES, default="Observe"),
    "highWatermark": number("Utilisation (0-1) that counts as pressure.", minimum=0, maximum=1, default=0.85),
    "lowWatermark": number("Utilisation (0-1) that ends pressure.", minimum=0, maximum=1, default=0.60),
    "maxBlockSize": integer("KV block size in tokens (vLLM --block-size).", minimum=1, maximum=256),
    "swapSpace": integer("CPU swap space per GPU, GiB (vLLM --swap-space).", minimum=0, maximum=1024),
    "reconfigureCooldown": duration("Minimum time between reconfigurations.", default="5m"),
}, rules=[WATERMARK_RULE])

MODEL_SPEC = obj("Desired state of a Model.", {
    "backend": string("Inference server (aliases such as llama.cpp or mlc are accepted).", enum=ACCEPTED_NAMES),
    "source": string("Where the model comes from: HF://org/model, ollama://name:tag, file:///path or "
                     "pvc://claim/path.", pattern=SOURCE_PATTERN, max_length=2048),
    "gpu": GPU,
    "serverless": SERVERLESS,
    "cache": CACHE,
    "config": free_object("Backend knobs (e.g. maxModelLen, contextSize, ggufFile); see the backend registry."),
    "resources": RESOURCES,
    "nodeSelector": NODE_SELECTOR,
    "tolerations": TOLERATIONS,
    "litellm": LITELLM,
    "serviceLabels": SERVICE_LABELS,
    "capabilities": CAPABILITIES,
    "kvCache": KV_CACHE,
}, required=["backend", "source"], rules=[NODE_SELECTOR_RULE, PVC_SOURCE_RULE])

# ---- Model status ---------------------------------------------------------------------------------

MODEL_STATUS = obj("Observed state of a Model.", {
    "observedGeneration": observed_generation(),
    "phase": string("Lifecycle phase.", enum=PHASES),
    "conditions": conditions(),
    "gpu": obj("Where the model runs.", {
        "node": string("Node name."),
        "device": string("Device id on the node."),
        "vendor": string("GPU vendor."),
        "architecture": string("GPU architecture (sm_86, gfx1100, ...)."),
        "memoryMB": integer("GPU memory, MiB.", minimum=0, int64=True),
    }),
    "endpoint": string("In-cluster URL of the backend Service."),
    "lastActiveTime": date_time("Last request seen by the proxy (drives scale-to-zero and shared-GPU demand)."),
    "metrics": obj("Measured performance.", {
        "tokensPerSecond": number("Decode throughput.", minimum=0),
        "loadTimeSeconds": number("Time from pod start to ready.", minimum=0),
        "avgLatencyMs": number("Average request latency.", minimum=0),
    }),
    "sharedGroup": obj("Membership in a GPU-sharing group.", {
        "groupName": string("spec.gpu.shared."),
        "state": string("Active holds the GPU; Queued waits; Preempted was displaced.", enum=SHARED_STATES),
        "queuePosition": integer("1-based rank while queued; 0 when active.", minimum=0),
        "preemptedBy": string("Model that took the GPU."),
        "preemptedAt": date_time("When it was preempted."),
    }),
    "cache": obj("Model file cache.", {
        "strategy": string("Effective cache strategy.", enum=CACHE_STRATEGIES),
        "ready": boolean("Files are in place."),
        "pvcName": string("PVC holding the files."),
        "jobName": string("Cache Job (prefetch, copy or check)."),
        "jobPhase": string("Phase of that Job."),
        "message": string("Details.", max_length=32768),
        "sizeBytes": integer("Size of the files.", minimum=0, int64=True),
    }),
    "kvCache": obj("KV-cache pressure.", {
        "utilization": number("Latest utilisation (0-1).", minimum=0, maximum=1),
        "pressure": boolean("Above the high watermark."),
        "lastPressureTime": date_time("When pressure was last seen."),
        "lastAction": string("Observed, Reconfigured or EvictRequested."),
        "reconfiguredAt": date_time("Last reconfiguration."),
        "evictedAt": date_time("Last eviction."),
    }),
    "loadingSubstage": string("What a Loading model is doing (Pulling, Copying, Starting, ...)."),
    "loadingProgressAt": date_time("Last time loading made progress."),
})

MODEL = KindDef(
    kind="Model",
    plural="models",
    singular="model",
    version=V1ALPHA2,
    short_names=("mdl",),
    description="A model served by one backend, scaled to zero when idle, optionally sharing a GPU.",
    spec=MODEL_SPEC,
    status=MODEL_STATUS,
    columns=(
        Column("Backend", ".spec.backend"),
        Column("Phase", ".status.phase"),
        Column("Ready", '.status.conditions[?(@.type=="Ready")].status'),
        Column("Shared", ".spec.gpu.shared", priority=1, description="GPU-sharing group"),
        Column("Priority", ".spec.gpu.priority", "integer", priority=1),
    ),
    finalizer=FINALIZER,
)
