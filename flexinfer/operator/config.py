"""Operator settings: one frozen dataclass, read once (environment, then CLI flags).

Owns: every knob of ``flexinfer operator`` with its default and environment variable (the
original's ``DEFAULT_SHM_SIZE_LIMIT`` and ``DEFAULT_FLASH_LOADER_*`` included), the snapshot of
``DEFAULT_*_IMAGE*`` overrides handed to the backend registry, and the shared-GPU time windows.

Must not: import kopf or a Kubernetes client (the pure modules take these settings as input).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from flexinfer import __version__
from flexinfer.settings import SettingsError, from_env
from flexinfer.settings import setting as _f
from flexinfer.sharing import Windows

#: the FlexInfer image (flash-loader init container, benchmark and Hugging Face prefetch Jobs)
DEFAULT_FLEXINFER_IMAGE = f"ghcr.io/flexinfer/flexinfer:{__version__}"


@dataclass(frozen=True, slots=True)
class OperatorSettings:
    """What the operator needs to know besides the objects it watches. Durations are seconds."""

    resync_s: float = _f(30.0, "FLEXINFER_OPERATOR_RESYNC", "Every object is reconciled at least this often.")
    failed_requeue_s: float = _f(30.0, "FLEXINFER_OPERATOR_FAILED_REQUEUE",
                                 "Retry of placement failures that depend on the nodes (NoMatchingNodes, ...).")
    retry_base_s: float = _f(1.0, "FLEXINFER_OPERATOR_RETRY_BASE", "First backoff after a failed reconcile.")
    retry_max_s: float = _f(60.0, "FLEXINFER_OPERATOR_RETRY_MAX", "Longest backoff after failed reconciles.")
    request_timeout_s: float = _f(30.0, "FLEXINFER_OPERATOR_REQUEST_TIMEOUT", "Timeout of one API request.")
    api_retries: int = _f(3, "FLEXINFER_OPERATOR_API_RETRIES",
                          "Retries of one API request on 429, 5xx and timeouts (Retry-After honoured).")
    workers: int = _f(16, "FLEXINFER_OPERATOR_WORKERS", "Concurrent reconciles per kind.")
    shm_size: str = _f("8Gi", "DEFAULT_SHM_SIZE_LIMIT", "Size limit of the /dev/shm volume of model pods.")
    flash_enabled: bool = _f(False, "DEFAULT_FLASH_LOADER_ENABLED", "Run the flash-loader unless a Model says.")
    flash_image: str = _f(DEFAULT_FLEXINFER_IMAGE, "DEFAULT_FLASH_LOADER_IMAGE",
                          "Image of the flash-loader init container (runs `flexinfer flash-load`).")
    flash_concurrency: int = _f(4, "DEFAULT_FLASH_LOADER_CONCURRENCY", "Parallel copies of the flash-loader.")
    flash_buffer_kb: int = _f(4096, "DEFAULT_FLASH_LOADER_BUFFER_KB", "Copy buffer of the flash-loader, KiB.")
    flash_verify: bool = _f(False, "DEFAULT_FLASH_LOADER_VERIFY", "Verify each copied file (size).")
    flash_exclude: str = _f("", "DEFAULT_FLASH_LOADER_EXCLUDE", "Comma-separated path prefixes not copied.")
    flash_tmpfs_size_limit: str = _f("", "DEFAULT_FLASH_LOADER_TMPFS_SIZE_LIMIT", "Size limit of the tmpfs.")
    bench_image: str = _f(DEFAULT_FLEXINFER_IMAGE, "FLEXINFER_BENCH_IMAGE", "Image of benchmark Jobs.")
    bench_service_account: str = _f("flexinfer-bench", "FLEXINFER_BENCH_SERVICE_ACCOUNT",
                                    "Service account of benchmark Jobs (writes ConfigMaps).")
    image_pull_policy: str = _f("IfNotPresent", "FLEXINFER_IMAGE_PULL_POLICY",
                                "Pull policy of the FlexInfer-image containers it creates (Jobs, flash-loader).")
    image_pull_secrets: str = _f("", "FLEXINFER_IMAGE_PULL_SECRETS",
                                 "Comma-separated imagePullSecrets of the Job and model pods it creates.")
    proxy_url: str = _f("http://flexinfer-proxy", "FLEXINFER_PROXY_URL", "Proxy base URL benchmark Jobs use.")
    hf_token_secret: str = _f("", "FLEXINFER_HF_TOKEN_SECRET",
                              "Secret with key HF_TOKEN mounted into prefetch Jobs (optional).")
    prefetch_image: str = _f(DEFAULT_FLEXINFER_IMAGE, "FLEXINFER_PREFETCH_IMAGE",
                             "Image of HF prefetch Jobs (the FlexInfer image: huggingface_hub is in it).")
    git_image: str = _f("debian:bookworm-slim", "FLEXINFER_GIT_PREFETCH_IMAGE", "Image of git-lfs prefetch Jobs.")
    oras_image: str = _f("ghcr.io/oras-project/oras:v1.2.0", "FLEXINFER_ORAS_IMAGE", "Image of OCI prefetch Jobs.")
    copy_image: str = _f("alpine:3.20", "FLEXINFER_CACHE_COPY_IMAGE", "Image of pvc:// copy Jobs.")
    check_image: str = _f("alpine:3.19", "FLEXINFER_CACHE_CHECK_IMAGE", "Image of pvc:// check Jobs.")
    cleanup_image: str = _f("busybox:1.37", "FLEXINFER_CLEANUP_IMAGE", "Image of the tmpfs-cleanup Job.")
    demand_window_s: float = _f(120.0, "FLEXINFER_SHARED_DEMAND_WINDOW", "Shared GPU: recent demand window.")
    recent_window_s: float = _f(300.0, "FLEXINFER_SHARED_RECENT_WINDOW", "Shared GPU: recent activity window.")
    min_swap_cooldown_s: float = _f(300.0, "FLEXINFER_SHARED_MIN_COOLDOWN", "Shared GPU: least swap cooldown.")
    lora_timeout_s: float = _f(30.0, "FLEXINFER_LORA_TIMEOUT", "Timeout of one adapter load/unload call.")
    lora_requeue_s: float = _f(60.0, "FLEXINFER_LORA_REQUEUE", "How often loaded adapters are re-checked.")
    lora_pending_requeue_s: float = _f(10.0, "FLEXINFER_LORA_PENDING_REQUEUE",
                                       "Re-check of adapters whose parent is not ready.")
    gpugroup_requeue_s: float = _f(5.0, "FLEXINFER_GPUGROUP_REQUEUE", "GPUGroup re-evaluation interval.")
    federation_resync_s: float = _f(30.0, "FLEXINFER_FEDERATION_RESYNC",
                                    "How often a FederatedModel re-reads its member clusters' Models.")
    federation_cleanup_timeout_s: float = _f(300.0, "FLEXINFER_FEDERATION_CLEANUP_TIMEOUT",
                                             "How long a deleted FederatedModel retries unreachable members.")
    metrics_port: int = _f(8080, "FLEXINFER_OPERATOR_METRICS_PORT", "Prometheus /metrics port; 0 disables it.")
    metrics_host: str = _f("0.0.0.0", "FLEXINFER_OPERATOR_METRICS_HOST", "Listen address of the metrics port.")
    #: ``DEFAULT_*IMAGE*`` overrides for the backend registry (see ``flexinfer.backends.images``)
    images: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    def validate(self) -> None:
        if self.workers < 1:
            raise SettingsError("FLEXINFER_OPERATOR_WORKERS must be at least 1")
        if not 0 <= self.metrics_port <= 65535:
            raise SettingsError("FLEXINFER_OPERATOR_METRICS_PORT must be 0..65535")
        if self.api_retries < 0:
            raise SettingsError("FLEXINFER_OPERATOR_API_RETRIES must not be negative")
        if self.resync_s <= 0:
            raise SettingsError("FLEXINFER_OPERATOR_RESYNC must be positive")
        if self.image_pull_policy not in ("Always", "IfNotPresent", "Never"):
            raise SettingsError("FLEXINFER_IMAGE_PULL_POLICY must be Always, IfNotPresent or Never, "
                                f"got {self.image_pull_policy!r}")

    @property
    def windows(self) -> Windows:
        """The shared-GPU leader choice windows."""
        return Windows(demand=self.demand_window_s, recent=self.recent_window_s,
                       min_cooldown=self.min_swap_cooldown_s)

    @property
    def pull_secrets(self) -> tuple[str, ...]:
        """``FLEXINFER_IMAGE_PULL_SECRETS`` as names."""
        return tuple(p.strip() for p in self.image_pull_secrets.split(",") if p.strip())

    @property
    def flash_excludes(self) -> tuple[str, ...]:
        return tuple(p.strip() for p in self.flash_exclude.split(",") if p.strip())


def image_overrides(env: Mapping[str, str]) -> Mapping[str, str]:
    """The ``DEFAULT_*IMAGE*`` variables of ``env`` (what ``Backend.image`` consults)."""
    return MappingProxyType({k: v for k, v in env.items() if k.startswith("DEFAULT_") and "IMAGE" in k})


def load_settings(env: Mapping[str, str] | None = None, **overrides: Any) -> OperatorSettings:
    """Settings from ``env`` (None: the process environment) with ``overrides`` (None values ignored)."""
    import os

    env = os.environ if env is None else env
    overrides = {k: v for k, v in overrides.items() if v is not None}
    overrides.setdefault("images", image_overrides(env))
    out: OperatorSettings = from_env(OperatorSettings, env, **overrides)
    return out
