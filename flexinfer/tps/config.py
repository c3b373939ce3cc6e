"""Bench runner configuration: :class:`BenchConfig` (env, then ``flexinfer bench`` flags) and the errors.

This module owns what a run measures and where it publishes (one frozen dataclass read once through
:func:`flexinfer.settings.from_env`), the base-URL rules (``--base-url`` → ``PROXY_URL`` →
``BENCHMARK_PROXY_URL`` → the in-cluster proxy Service) and the bench runner's error types
(:class:`BenchError`, :class:`HTTPStatusError`). It does no I/O and must not import HTTP,
Kubernetes or plotting code.
"""

from __future__ import annotations

import math
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from flexinfer import labels
from flexinfer.settings import SettingsError, from_env
from flexinfer.settings import setting as _f

DEFAULT_PROMPT = "Write a long story about a space adventure to Mars."


class BenchError(Exception):
    """A failure with a one-line message for the user; the command exits 1 with it."""


class HTTPStatusError(BenchError):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


# ---- configuration ---------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class BenchConfig:
    """What to measure and where to publish it. Built by :func:`load_config` (env, then flags)."""

    base_url: str = _f("", None, "OpenAI base URL ending in /v1; derived from the proxy URL when empty.")
    proxy_url: str = _f("", "PROXY_URL", "FlexInfer proxy root URL (first choice when --base-url is unset).")
    benchmark_proxy_url: str = _f("", "BENCHMARK_PROXY_URL", "Proxy root URL (second choice).")
    proxy_namespace: str = _f("flexinfer-system", "BENCHMARK_PROXY_NAMESPACE",
                              "Namespace of the in-cluster proxy Service (last resort URL).")
    model: str = _f("", "MODEL_NAME", "Model name sent in the body; if empty and /models lists one, that one.")
    api_key: str = _f("", "BENCHMARK_API_KEY", "Bearer token (falls back to OPENAI_API_KEY).")
    openai_api_key: str = _f("", "OPENAI_API_KEY", "Bearer token fallback.")
    warmup: int = _f(2, None, "Unmeasured requests first.")
    iterations: int = _f(5, None, "At least this many measured requests ...")
    min_duration: float = _f(30.0, None, "... and at least this many seconds of measuring.")
    max_tokens: int = _f(128, None, "max_tokens of each request.")
    prompt: str = _f(DEFAULT_PROMPT, None, "User message of each request.")
    stream: bool = _f(True, None, "Streaming requests (decode time from the stream).")
    timeout: float = _f(180.0, None, "Per-request timeout (socket inactivity), seconds.")
    ready_timeout: float = _f(300.0, None, "How long the first request waits for the model to be ready.")
    ready_poll: float = _f(5.0, None, "Retry interval while waiting for readiness.")
    configmap: str = _f("", None, "Per-deployment ConfigMap to write (empty: no cluster writes).")
    namespace: str = _f("", "POD_NAMESPACE", "Namespace of the ConfigMaps.")
    global_configmap: str = _f(labels.BENCHMARK_CONFIGMAP, "BENCHMARK_RESULTS_CONFIGMAP",
                               "Global ConfigMap of bench_<hash>/meta_<hash> keys.")
    backend: str = _f("", "BENCHMARK_BACKEND", "Canonical backend name for the keys (else from /models).")
    device_class: str = _f("", "BENCHMARK_DEVICE_CLASS", "Device class for the keys (else from the node).")
    node_name: str = _f("", "NODE_NAME", "Node whose gpu.* labels give the device class.")
    kubeconfig: str = _f("", "KUBECONFIG", "Kubeconfig used outside a cluster (default ~/.kube/config).")

    def validate(self) -> None:
        if self.warmup < 0:
            raise SettingsError(f"--warmup must be >= 0, got {self.warmup}")
        if self.iterations < 1:
            raise SettingsError(f"--iterations must be >= 1, got {self.iterations}")
        if self.min_duration < 0 or math.isnan(self.min_duration):
            raise SettingsError("--min-duration must be >= 0")
        if self.max_tokens < 1:
            raise SettingsError(f"--max-tokens must be >= 1, got {self.max_tokens}")
        if self.timeout <= 0:
            raise SettingsError("--timeout must be > 0")

    @property
    def bearer(self) -> str:
        return self.api_key or self.openai_api_key


def base_url_from_proxy(proxy_url: str) -> str:
    """A proxy root (``http://h:80``) -> its OpenAI base (``http://h:80/v1``); ``/v1`` kept if present."""
    u = proxy_url.rstrip("/")
    return u if u.endswith("/v1") else u + "/v1"


def load_config(env: Mapping[str, str] | None = None, **overrides: Any) -> BenchConfig:
    """Read the environment once (``None``: the process's); ``overrides`` are CLI flags (None = unset).

    Base URL: ``--base-url`` → ``PROXY_URL`` → ``BENCHMARK_PROXY_URL`` →
    ``http://flexinfer-proxy.<BENCHMARK_PROXY_NAMESPACE|flexinfer-system>.svc.cluster.local:80``,
    the proxy forms getting ``/v1`` appended.
    """
    cfg: BenchConfig = from_env(BenchConfig, env, **overrides)
    base = cfg.base_url.rstrip("/")
    if not base:
        root = cfg.proxy_url or cfg.benchmark_proxy_url or (
            f"http://flexinfer-proxy.{cfg.proxy_namespace}.svc.cluster.local:80")
        base = base_url_from_proxy(root)
    u = urllib.parse.urlsplit(base)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise SettingsError(f"base URL must be http(s)://host[:port]/..., got {base!r}")
    return replace(cfg, base_url=base)
