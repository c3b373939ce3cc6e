"""The backend registry: ollama, vllm, mlc-llm, llamacpp, diffusers, comfyui, vllm-omni.

Pure data and pure functions (no Kubernetes client): for each inference server its port, image
per vendor/architecture (``DEFAULT_<B>_IMAGE*`` overrides), command and args from ``spec.config``,
environment, probes, timeouts, vendor support and GPU compatibility. The operator builds containers
from these; the proxy reads ports and context windows.
"""

from flexinfer.backends.base import (
    COMMON_CONFIG,
    COMPILE_CACHE_DIR,
    GPU_RESOURCE_NAMES,
    VENDORS,
    Backend,
    Capabilities,
    ConfigError,
    ConfigKind,
    LaunchContext,
    Probe,
    gpu_resource_name,
    read_config,
    source_model_id,
)
from flexinfer.backends.compat import (
    SUPPORT_MATRIX,
    VRAM_FAIL_RATIO,
    VRAM_MB_BY_ARCH,
    VRAM_WARN_RATIO,
    Finding,
    Support,
    arch_vram_mb,
    check_placement,
    check_vram,
    support_level,
    vendor_of_arch,
)
from flexinfer.backends.images import REGISTRY_ENV, ImageChoice, ImageNotConfigured, variant_chain
from flexinfer.backends.registry import (
    ACCEPTED_NAMES,
    ALIASES,
    BACKEND_NAMES,
    BACKENDS,
    UnknownBackendError,
    canonical_name,
    get_backend,
)

__all__ = [
    "ACCEPTED_NAMES",
    "ALIASES",
    "BACKENDS",
    "BACKEND_NAMES",
    "COMMON_CONFIG",
    "COMPILE_CACHE_DIR",
    "GPU_RESOURCE_NAMES",
    "REGISTRY_ENV",
    "SUPPORT_MATRIX",
    "VENDORS",
    "VRAM_FAIL_RATIO",
    "VRAM_MB_BY_ARCH",
    "VRAM_WARN_RATIO",
    "Backend",
    "Capabilities",
    "ConfigError",
    "ConfigKind",
    "Finding",
    "ImageChoice",
    "ImageNotConfigured",
    "LaunchContext",
    "Probe",
    "Support",
    "UnknownBackendError",
    "arch_vram_mb",
    "canonical_name",
    "check_placement",
    "check_vram",
    "get_backend",
    "gpu_resource_name",
    "read_config",
    "source_model_id",
    "support_level",
    "variant_chain",
    "vendor_of_arch",
]
