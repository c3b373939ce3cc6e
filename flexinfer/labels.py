"""Every label, annotation, finalizer and well-known name shared by the agent, the extender, the
operator and the proxy, and the keys of measured tokens/s.

One module so that a writer and its readers can never disagree on a spelling. Keys under the
default prefix ``flexinfer.ai/`` are module constants; the agent's ``--label-prefix`` flag can move
the node keys it owns, so those are also available through :func:`node_keys` for any prefix.

The bench-result keys (:func:`bench_key`, :func:`meta_key`, :func:`device_class`, ...) are the one
contract between the bench runner (``flexinfer.tps``), which writes, and the scheduler extender
(``flexinfer.scheduler``), which reads, the global ConfigMap (``BENCHMARK_RESULTS_CONFIGMAP``, default
:data:`BENCHMARK_CONFIGMAP`) with ``data["bench_<hash>"] = "<tokens/s>"`` and
``data["meta_<hash>"] = "<JSON>"``, where ``hash = sha256(f"{backend}|{model}|{device_class}").hexdigest()[:16]``
and the device class is ``vendor=…,arch=…,vram=…,count=…,int4=…`` built from the node agent's
``gpu.*`` labels, as the original system did (``shared/reference/flexinfer-upstream.md`` §5 and §7.1).
Both sides must pass the same canonical backend name (the backend registry's, e.g. ``llamacpp``) and
the same model name.

This module holds strings only: no logic beyond building keys, no I/O, no imports of our own.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

# ---- prefixes and groups ------------------------------------------------------------------------

PREFIX: Final = "flexinfer.ai/"
"""Default prefix of FlexInfer's own labels and annotations."""

API_GROUP: Final = "ai.flexinfer"
"""API group of the CRDs (``ai.flexinfer/v1alpha2`` Model, ...)."""

LITELLM_PREFIX: Final = "litellm.flexinfer.ai/"


def key(name: str, prefix: str = PREFIX) -> str:
    """``prefix + name``; a prefix without a trailing ``/`` gets one (``"x.io"`` → ``"x.io/name"``)."""
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    return prefix + name


# ---- node labels written by the agent (read by the extender and the operator) -------------------

GPU_VENDOR: Final = PREFIX + "gpu.vendor"          # "NVIDIA" | "AMD"
GPU_VRAM: Final = PREFIX + "gpu.vram"              # per-GPU VRAM, "<MiB // 1024>Gi", e.g. "24Gi"
GPU_ARCH: Final = PREFIX + "gpu.arch"              # "sm_89", "gfx1100"
GPU_INT4: Final = PREFIX + "gpu.int4"              # "true" | "false"
GPU_COUNT: Final = PREFIX + "gpu.count"            # "2"
CPU_AVX512: Final = PREFIX + "cpu.avx512"          # "true" | "false"

# ---- node annotations written by the agent -------------------------------------------------------

GPU_FREE_MEMORY: Final = PREFIX + "gpu-free-memory"  # MB free, summed over the node's GPUs
GPU_UTIL: Final = PREFIX + "gpu.util"                # average utilisation, percent 0..100
KV_CACHE_USAGE: Final = PREFIX + "kv-cache-usage"    # average KV-cache usage of model pods, 0..1 ("%.4f")

# ---- node keys written by others ------------------------------------------------------------------

COST: Final = PREFIX + "cost"                        # node annotation: relative cost (set by the admin)
SPOT_TERMINATING: Final = PREFIX + "spot-terminating"  # node label/annotation: spot node going away

# ---- pod / object keys -----------------------------------------------------------------------------

MODEL: Final = PREFIX + "model"                      # label + annotation: the Model's name
BACKEND: Final = PREFIX + "backend"                  # label + annotation: backend name (vllm, llamacpp, ...)
VRAM_ESTIMATE_MB: Final = PREFIX + "gpu.vram-estimate-mb"  # pod annotation: VRAM per GPU the model needs
GPU_GROUP: Final = PREFIX + "gpu-group"              # label: shared GPU group
ROUTING: Final = PREFIX + "routing"                  # Model annotation: session-affinity | prefix | least-loaded
SCHEDULER: Final = PREFIX + "scheduler"              # Model annotation: the ``scored`` chain ("least-request:1,...")
ROLE: Final = PREFIX + "role"                        # pod/Service/EndpointSlice label: prefill | decode | both
SERVICE_LABELS: Final = PREFIX + "service-labels"    # Service annotation: comma-joined service labels
ACTIVE_SERVICES: Final = "ai.flexinfer/active-services"  # Service annotation (note the other spelling)
SERVE_PATHS: Final = PREFIX + "serve-paths"
ADMISSION: Final = PREFIX + "admission"
FEDERATED_MODEL: Final = PREFIX + "federated-model"
SOURCE: Final = PREFIX + "source"                    # cache Job annotations
CACHE_KIND: Final = PREFIX + "cache-kind"
CACHE_PVC: Final = PREFIX + "cache-pvc"
CACHE_DEST: Final = PREFIX + "cache-dest"
CACHE_PATH: Final = PREFIX + "cache-path"

MODELDEPLOYMENT_CR: Final = "modeldeployment_cr"     # legacy pod label naming its ModelDeployment

QUEUE_PREFIX: Final = PREFIX + "queue."              # GPUGroup annotation per member: queue depth
QUEUE_SINCE_PREFIX: Final = PREFIX + "queue-since."  # GPUGroup annotation per member: RFC 3339 time


def queue_key(model: str) -> str:
    """``flexinfer.ai/queue.<model>``: requests the proxy holds for a GPUGroup member."""
    return QUEUE_PREFIX + model


def queue_since_key(model: str) -> str:
    """``flexinfer.ai/queue-since.<model>``: since when the proxy holds requests (RFC 3339)."""
    return QUEUE_SINCE_PREFIX + model


# ---- Kubernetes recommended labels ----------------------------------------------------------------

MANAGED_BY: Final = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE: Final = "flexinfer"
APP_NAME: Final = "app.kubernetes.io/name"
APP_INSTANCE: Final = "app.kubernetes.io/instance"
APP_COMPONENT: Final = "app.kubernetes.io/component"

# ---- LiteLLM discovery annotations ------------------------------------------------------------------

LITELLM_SERVED_MODEL: Final = LITELLM_PREFIX + "served-model"
LITELLM_ALIASES: Final = LITELLM_PREFIX + "aliases"
LITELLM_COPILOT_MODEL: Final = LITELLM_PREFIX + "copilot-model"
LITELLM_CAPABILITIES: Final = LITELLM_PREFIX + "capabilities"

# ---- finalizers --------------------------------------------------------------------------------------

FINALIZER_MODEL: Final = PREFIX + "model-cleanup"
FINALIZER_LORA: Final = PREFIX + "lora-cleanup"
FINALIZER_LEGACY: Final = PREFIX + "cleanup"
FINALIZER_FEDERATION: Final = PREFIX + "federation-cleanup"  # FederatedModel: copies on the member clusters

# ---- federation (Models the hub operator copies to member clusters) ----------------------------------

FEDERATION_OWNER: Final = PREFIX + "federation-owner"  # annotation on the copy: "<hub namespace>/<name>"

# ---- third-party keys we read ------------------------------------------------------------------------

NODE_GPU_VENDOR_SELECTOR: Final = "node.flexstack.io/gpu-vendor"
NVIDIA_COMPUTE_MAJOR: Final = "nvidia.com/gpu.compute.major"
AMD_GPU_ARCH: Final = "gpu.amd.com/gpu-architecture"
AMD_GPU_MODEL: Final = "gpu.amd.com/model"

ENDPOINTSLICE_SERVICE_NAME: Final = "kubernetes.io/service-name"  # EndpointSlice label: its Service

RESOURCE_NVIDIA_GPU: Final = "nvidia.com/gpu"
RESOURCE_AMD_GPU: Final = "amd.com/gpu"
RESOURCE_INTEL_GPU: Final = "gpu.intel.com/i915"
GPU_RESOURCES: Final = (RESOURCE_NVIDIA_GPU, RESOURCE_AMD_GPU, RESOURCE_INTEL_GPU)

# ---- well-known object names -------------------------------------------------------------------------

BENCHMARK_CONFIGMAP: Final = "flexinfer-benchmark-results"  # global tokens/s ConfigMap (data[bench_<hash>])
BENCHMARK_CONFIGMAP_SUFFIX: Final = "-benchmark-results"    # per-ModelDeployment ConfigMap suffix
BENCH_KEY_PREFIX: Final = "bench_"
BENCH_META_PREFIX: Final = "meta_"
TOKENS_PER_SECOND: Final = "tokensPerSecond"                 # per-deployment ConfigMap data key

VENDOR_NVIDIA: Final = "NVIDIA"
VENDOR_AMD: Final = "AMD"


# ---- the node keys one agent owns, for any prefix ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodeKeys:
    """The node labels and annotations the agent owns under one prefix."""

    gpu_vendor: str
    gpu_vram: str
    gpu_arch: str
    gpu_int4: str
    gpu_count: str
    cpu_avx512: str
    gpu_free_memory: str
    gpu_util: str
    kv_cache_usage: str

    @property
    def labels(self) -> tuple[str, ...]:
        """Label keys the agent owns (it removes them when they no longer apply)."""
        return (self.gpu_vendor, self.gpu_vram, self.gpu_arch, self.gpu_int4, self.gpu_count, self.cpu_avx512)

    @property
    def annotations(self) -> tuple[str, ...]:
        """Annotation keys the agent owns."""
        return (self.gpu_free_memory, self.gpu_util, self.kv_cache_usage)


def node_keys(prefix: str = PREFIX) -> NodeKeys:
    """The agent's node keys under ``prefix`` (the default gives the module constants)."""
    return NodeKeys(
        gpu_vendor=key("gpu.vendor", prefix),
        gpu_vram=key("gpu.vram", prefix),
        gpu_arch=key("gpu.arch", prefix),
        gpu_int4=key("gpu.int4", prefix),
        gpu_count=key("gpu.count", prefix),
        cpu_avx512=key("cpu.avx512", prefix),
        gpu_free_memory=key("gpu-free-memory", prefix),
        gpu_util=key("gpu.util", prefix),
        kv_cache_usage=key("kv-cache-usage", prefix),
    )


DEFAULT_NODE_KEYS: Final = node_keys()


# ---- keys of measured tokens/s (the bench runner writes them, the extender reads them) -------------


def device_class(vendor: str = "", arch: str = "", vram: str = "", count: str | int = "",
                 int4: str | bool = "") -> str:
    """``vendor=NVIDIA,arch=sm_86,vram=24Gi,count=1,int4=true`` (booleans as true/false)."""
    if isinstance(int4, bool):
        int4 = "true" if int4 else "false"
    return f"vendor={vendor},arch={arch},vram={vram},count={count},int4={int4}"


def device_class_from_labels(node_labels: Mapping[str, str], prefix: str = PREFIX) -> str:
    """The device class of a node from its labels (``<prefix>gpu.vendor`` …); missing ones are empty."""
    keys = node_keys(prefix)
    return device_class(vendor=node_labels.get(keys.gpu_vendor, ""), arch=node_labels.get(keys.gpu_arch, ""),
                        vram=node_labels.get(keys.gpu_vram, ""), count=node_labels.get(keys.gpu_count, ""),
                        int4=node_labels.get(keys.gpu_int4, ""))


def bench_hash(backend: str, model: str, device_class: str) -> str:
    """16 hex chars identifying (backend, model, device class)."""
    return hashlib.sha256(f"{backend}|{model}|{device_class}".encode()).hexdigest()[:16]


def bench_key(backend: str, model: str, device_class: str) -> str:
    """Global ConfigMap key holding the tokens/s, as a decimal string."""
    return BENCH_KEY_PREFIX + bench_hash(backend, model, device_class)


def meta_key(backend: str, model: str, device_class: str) -> str:
    """Global ConfigMap key holding the JSON metadata of that measurement."""
    return BENCH_META_PREFIX + bench_hash(backend, model, device_class)


def deployment_configmap_name(deployment: str) -> str:
    """The per-deployment results ConfigMap the original operator waits for."""
    return deployment + BENCHMARK_CONFIGMAP_SUFFIX
