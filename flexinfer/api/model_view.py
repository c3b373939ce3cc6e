"""Typed, validated view of a ``Model`` object, parsed once per event.

Owns: turning a Model dict into frozen dataclasses with every default applied the way the original
helpers did (priority 100; GPU count 0 when ``gpu`` is nil or cpu, else 1; nil ``gpu`` means CPU;
empty vendor means auto; serverless on with minReplicas 0, and at least 1 replica when off; idle
timeout from the backend; cold start 60 s; cache strategy Memory if shared else SharedPVC;
compile cache on for shared amd/auto models; LiteLLM enabled unless its block says otherwise),
plus the static checks that need no cluster (unknown backend, backend/vendor, llama.cpp sources,
config knob types). Problems raise ``SpecError(reason, message)``.

Must not: look at other objects or nodes (alias conflicts, GPU detection and placement checks
belong to the operator, which calls ``flexinfer.backends.check_placement``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from flexinfer.api.common import (
    BACKEND_UNSUPPORTED,
    INVALID_CONFIG,
    INVALID_SOURCE,
    INVALID_SPEC,
    UNKNOWN_BACKEND,
    ObjectMeta,
    SpecError,
    check_kind,
    frozen_map,
    opt_time,
    parse_duration,
)
from flexinfer.api.conditions import READY, Condition, find_condition, parse_conditions
from flexinfer.api.model import (
    CACHE,
    COMPILATION_CACHE,
    FLASH_LOADER,
    KV_CACHE,
    LITELLM,
    MODEL_SPEC,
    MODEL_STATUS,
    SERVERLESS,
)
from flexinfer.api.validate import defaults_of, validate, validate_lenient
from flexinfer.backends import (
    Backend,
    Capabilities,
    ConfigError,
    UnknownBackendError,
    get_backend,
    source_model_id,
)
from flexinfer.backends.llm import LlamaCpp

SOURCE_SCHEMES = {"HF": "hf", "hf": "hf", "ollama": "ollama", "file": "file", "pvc": "pvc"}


@dataclass(frozen=True, slots=True)
class Source:
    """``spec.source`` split into scheme (hf, ollama, file, pvc) and reference."""

    raw: str
    scheme: str
    ref: str

    @property
    def model_id(self) -> str:
        """``org/model`` for HF, the tag for Ollama, the path for file; pvc sources stay whole."""
        return source_model_id(self.raw)

    @property
    def pvc_claim(self) -> str | None:
        return self.ref.split("/", 1)[0] if self.scheme == "pvc" else None

    @property
    def pvc_path(self) -> str:
        """The path inside the claim (``pvc://c/a/b`` -> ``a/b``), empty for the claim root."""
        return self.ref.split("/", 1)[1].strip("/") if self.scheme == "pvc" and "/" in self.ref else ""

    @classmethod
    def parse(cls, raw: str, path: str = "spec.source") -> Source:
        scheme, sep, ref = raw.partition("://")
        if not sep or scheme not in SOURCE_SCHEMES or not ref:
            raise SpecError(INVALID_SOURCE, f"{path}: expected HF://org/model, ollama://name:tag, file:///path or "
                                            f"pvc://claim/path, got {raw!r}")
        s = cls(raw=raw, scheme=SOURCE_SCHEMES[scheme], ref=ref)
        if s.scheme == "file" and not ref.startswith("/"):
            raise SpecError(INVALID_SOURCE, f"{path}: a file source needs an absolute path (file:///...), got {raw!r}")
        if s.scheme == "pvc" and not s.pvc_claim:
            raise SpecError(INVALID_SOURCE, f"{path}: a pvc source needs a claim name (pvc://claim/path)")
        return s


@dataclass(frozen=True, slots=True)
class GPUSpec:
    declared: bool  # spec.gpu is present
    vendor: str  # auto | nvidia | amd | cpu (nil gpu: cpu)
    count: int
    priority: int
    shared: str | None
    vram_estimate_mb: int | None
    swap_cooldown_s: float
    force_promotion: bool

    @property
    def is_cpu(self) -> bool:
        return self.vendor == "cpu"


@dataclass(frozen=True, slots=True)
class ServerlessSpec:
    enabled: bool
    min_replicas: int  # at least 1 when serverless is off
    idle_timeout_s: float  # spec, else the backend's default
    cold_start_timeout_s: float


@dataclass(frozen=True, slots=True)
class CompilationCacheSpec:
    enabled: bool
    host_path: str
    size_limit: str


@dataclass(frozen=True, slots=True)
class FlashLoaderSpec:
    enabled: bool | None  # None: auto (operator: env, ModelCache, shared + Local)
    concurrency: int
    buffer_size_kb: int
    verify_integrity: bool
    tmpfs_size_limit: str | None
    image: str | None


@dataclass(frozen=True, slots=True)
class CacheSpec:
    declared: bool  # spec.cache is present
    strategy: str  # effective: Memory | SharedPVC | Local | None
    strategy_explicit: bool
    pvc_name: str | None
    storage_class: str | None  # None: the cluster default
    size: str
    host_path: str
    compilation_cache: CompilationCacheSpec
    flash_loader: FlashLoaderSpec

    def local_dir(self, namespace: str, name: str) -> str:
        """The hostPath directory of a Local cache: ``<hostPath>/<ns>/<name>``."""
        return f"{self.host_path.rstrip('/')}/{namespace}/{name}"


@dataclass(frozen=True, slots=True)
class LiteLLMSpec:
    declared: bool
    enabled: bool
    served_model_name: str | None
    aliases: tuple[str, ...]
    copilot_alias: str | None


@dataclass(frozen=True, slots=True)
class Toleration:
    key: str | None = None
    operator: str | None = None
    value: str | None = None
    effect: str | None = None
    toleration_seconds: int | None = None

    def to_k8s(self) -> dict[str, Any]:
        out = {"key": self.key, "operator": self.operator, "value": self.value, "effect": self.effect,
               "tolerationSeconds": self.toleration_seconds}
        return {k: v for k, v in out.items() if v is not None}


@dataclass(frozen=True, slots=True)
class Resources:
    limits: Mapping[str, str]
    requests: Mapping[str, str]

    def to_k8s(self) -> dict[str, dict[str, str]]:
        out = {}
        if self.limits:
            out["limits"] = dict(self.limits)
        if self.requests:
            out["requests"] = dict(self.requests)
        return out


@dataclass(frozen=True, slots=True)
class KVCacheSpec:
    declared: bool
    pressure_policy: str  # Observe | Reconfigure | Evict
    high_watermark: float
    low_watermark: float
    max_block_size: int | None
    swap_space_gb: int | None
    reconfigure_cooldown_s: float


def parse_resources(raw: Mapping[str, Any] | None) -> Resources:
    raw = raw or {}
    return Resources(limits=frozen_map({k: str(v) for k, v in (raw.get("limits") or {}).items()}),
                     requests=frozen_map({k: str(v) for k, v in (raw.get("requests") or {}).items()}))


def parse_tolerations(raw: list[Mapping[str, Any]] | None) -> tuple[Toleration, ...]:
    return tuple(Toleration(key=t.get("key"), operator=t.get("operator"), value=t.get("value"),
                            effect=t.get("effect"), toleration_seconds=t.get("tolerationSeconds"))
                 for t in raw or ())


def parse_litellm(raw: Mapping[str, Any] | None) -> LiteLLMSpec:
    declared = raw is not None
    d = dict(raw) if raw is not None else defaults_of(LITELLM)
    return LiteLLMSpec(declared=declared, enabled=bool(d.get("enabled", True)),
                       served_model_name=d.get("servedModelName") or None, aliases=tuple(d.get("aliases") or ()),
                       copilot_alias=d.get("copilotAlias") or None)


def resolve_backend(name: str, path: str = "spec.backend") -> Backend:
    try:
        return get_backend(name)
    except UnknownBackendError as e:
        raise SpecError(UNKNOWN_BACKEND, f"{path}: {e}") from None


def check_config(backend: Backend, config: Mapping[str, Any], path: str = "spec.config") -> None:
    try:
        backend.validate_config(config)
    except ConfigError as e:
        raise SpecError(INVALID_CONFIG, f"{path}.{e.key}: {str(e).split(': ', 1)[1]}") from None


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """``spec`` of a Model with defaults applied; ``backend`` is the canonical name."""

    backend: str
    source: Source
    gpu: GPUSpec
    serverless: ServerlessSpec
    cache: CacheSpec
    config: Mapping[str, Any]
    resources: Resources
    node_selector: Mapping[str, str]
    tolerations: tuple[Toleration, ...]
    litellm: LiteLLMSpec
    service_labels: tuple[str, ...]
    capabilities: Capabilities  # as written (None = infer)
    kv_cache: KVCacheSpec

    @property
    def backend_def(self) -> Backend:
        return get_backend(self.backend)

    @property
    def effective_capabilities(self) -> Capabilities:
        """Inferred from the backend and config, overridden by ``spec.capabilities``."""
        return self.backend_def.capabilities(self.config).merged(self.capabilities)

    @property
    def served_name(self) -> str:
        """The model name the backend answers to: ``config.servedModelName``, else the source id."""
        v = self.config.get("servedModelName")
        return str(v) if v else self.source.model_id

    @property
    def context_window(self) -> int | None:
        return self.backend_def.context_window(self.config)

    @property
    def gguf_file(self) -> str | None:
        return LlamaCpp.gguf_file(self.config)

    @classmethod
    def from_dict(cls, raw_spec: Any, path: str = "spec") -> ModelSpec:
        """Validate (schema + CEL), default and check a raw ``spec``; raises ``SpecError``."""
        if raw_spec is None:
            raise SpecError(INVALID_SPEC, f"{path}: required")
        if isinstance(raw_spec, Mapping) and isinstance(raw_spec.get("backend"), str):
            resolve_backend(raw_spec["backend"], f"{path}.backend")  # UnknownBackend before the enum check
        g_raw = raw_spec.get("gpu") if isinstance(raw_spec, Mapping) else None
        if isinstance(g_raw, Mapping) and g_raw.get("vendor") == "":  # the original: empty vendor means auto
            raw_spec = {**raw_spec, "gpu": {k: v for k, v in g_raw.items() if k != "vendor"}}
        s = validate(MODEL_SPEC, raw_spec, path)
        backend = resolve_backend(s["backend"], f"{path}.backend")
        source = Source.parse(s["source"], f"{path}.source")
        config = frozen_map(s.get("config"))
        check_config(backend, config, f"{path}.config")

        g = s.get("gpu")
        if g is None:
            gpu = GPUSpec(declared=False, vendor="cpu", count=0, priority=100, shared=None, vram_estimate_mb=None,
                          swap_cooldown_s=300.0, force_promotion=False)
        else:
            vendor = g.get("vendor") or "auto"
            gpu = GPUSpec(declared=True, vendor=vendor, count=g.get("count", 0 if vendor == "cpu" else 1),
                          priority=g["priority"], shared=g.get("shared"), vram_estimate_mb=g.get("vramEstimateMB"),
                          swap_cooldown_s=parse_duration(g["swapCooldown"], path=f"{path}.gpu.swapCooldown"),
                          force_promotion=bool(g.get("forcePromotion", False)))
        if not backend.supports_vendor(gpu.vendor):
            hint = "" if gpu.declared else " (no spec.gpu means CPU; add gpu: {} for a GPU)"
            raise SpecError(BACKEND_UNSUPPORTED, f"{path}.gpu.vendor: backend {backend.name} does not run on "
                                                 f"{gpu.vendor}{hint}")

        sv = s.get("serverless") or defaults_of(SERVERLESS)
        enabled = bool(sv["enabled"])
        idle = sv.get("idleTimeout")
        serverless = ServerlessSpec(
            enabled=enabled,
            min_replicas=sv["minReplicas"] if enabled else max(1, sv["minReplicas"]),
            idle_timeout_s=(parse_duration(idle, path=f"{path}.serverless.idleTimeout") if idle
                            else backend.default_idle_timeout_s),
            cold_start_timeout_s=parse_duration(sv["coldStartTimeout"], path=f"{path}.serverless.coldStartTimeout"),
        )

        c = s.get("cache")
        cd = c if c is not None else defaults_of(CACHE)
        cc = cd.get("compilationCache") or defaults_of(COMPILATION_CACHE)
        fl = cd.get("flashLoader") or defaults_of(FLASH_LOADER)
        cache = CacheSpec(
            declared=c is not None,
            strategy=cd.get("strategy") or ("Memory" if gpu.shared else "SharedPVC"),
            strategy_explicit="strategy" in cd,
            pvc_name=cd.get("pvcName"),
            storage_class=cd.get("storageClass") or None,
            size=str(cd["size"]),
            host_path=cd["hostPath"],
            compilation_cache=CompilationCacheSpec(
                enabled=cc["enabled"] if "enabled" in cc else bool(gpu.shared and gpu.vendor in ("amd", "auto")),
                host_path=cc["hostPath"], size_limit=str(cc["sizeLimit"])),
            flash_loader=FlashLoaderSpec(
                enabled=fl.get("enabled"), concurrency=fl["concurrency"], buffer_size_kb=fl["bufferSizeKB"],
                verify_integrity=fl["verifyIntegrity"],
                tmpfs_size_limit=str(fl["tmpfsSizeLimit"]) if "tmpfsSizeLimit" in fl else None,
                image=fl.get("image") or None),
        )

        kv_raw = s.get("kvCache")
        kv = kv_raw if kv_raw is not None else defaults_of(KV_CACHE)
        kv_cache = KVCacheSpec(
            declared=kv_raw is not None, pressure_policy=kv["pressurePolicy"],
            high_watermark=float(kv["highWatermark"]), low_watermark=float(kv["lowWatermark"]),
            max_block_size=kv.get("maxBlockSize"), swap_space_gb=kv.get("swapSpace"),
            reconfigure_cooldown_s=parse_duration(kv["reconfigureCooldown"], path=f"{path}.kvCache.reconfigureCooldown"),
        )

        caps = s.get("capabilities") or {}
        spec = cls(
            backend=backend.name, source=source, gpu=gpu, serverless=serverless, cache=cache, config=config,
            resources=parse_resources(s.get("resources")), node_selector=frozen_map(s.get("nodeSelector")),
            tolerations=parse_tolerations(s.get("tolerations")), litellm=parse_litellm(s.get("litellm")),
            service_labels=tuple(s.get("serviceLabels") or ()),
            capabilities=Capabilities(tool_calling=caps.get("toolCalling"), vision=caps.get("vision"),
                                      image_generation=caps.get("imageGeneration")),
            kv_cache=kv_cache,
        )
        _check_backend_source(spec, path)
        return spec


def _check_backend_source(spec: ModelSpec, path: str) -> None:
    if spec.backend != "llamacpp":
        return
    if spec.source.scheme == "ollama":
        raise SpecError(INVALID_SOURCE, f"{path}.source: llamacpp cannot load ollama:// sources")
    if spec.source.scheme == "hf":
        gguf = spec.gguf_file
        if not gguf or not gguf.lower().endswith(".gguf"):
            raise SpecError(INVALID_CONFIG, f"{path}.config.ggufFile: llamacpp with an HF source needs the .gguf "
                                            "file to load (config.ggufFile)")


# ---- status ---------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class SharedGroupStatus:
    group_name: str | None
    state: str | None  # Active | Queued | Preempted
    queue_position: int | None
    preempted_by: str | None
    preempted_at: datetime | None


@dataclass(frozen=True, slots=True)
class GPUStatus:
    node: str | None
    device: str | None
    vendor: str | None
    architecture: str | None
    memory_mb: int | None


@dataclass(frozen=True, slots=True)
class CacheStatus:
    strategy: str | None
    ready: bool
    pvc_name: str | None
    job_name: str | None
    job_phase: str | None
    message: str | None
    size_bytes: int | None


@dataclass(frozen=True, slots=True)
class ModelStatus:
    """``status`` of a Model; unreadable fields are dropped, never raised on."""

    observed_generation: int | None = None
    phase: str | None = None
    conditions: tuple[Condition, ...] = ()
    endpoint: str | None = None
    last_active_time: datetime | None = None
    gpu: GPUStatus | None = None
    tokens_per_second: float | None = None
    load_time_seconds: float | None = None
    avg_latency_ms: float | None = None
    shared_group: SharedGroupStatus | None = None
    cache: CacheStatus | None = None
    kv_utilization: float | None = None
    kv_pressure: bool = False
    loading_substage: str | None = None
    loading_progress_at: datetime | None = None

    def condition(self, type_: str) -> Condition | None:
        return find_condition(self.conditions, type_)

    @property
    def ready(self) -> bool:
        c = self.condition(READY)
        return c is not None and c.is_true

    @classmethod
    def from_dict(cls, raw: Any) -> ModelStatus:
        s = validate_lenient(MODEL_STATUS, raw or {}) or {}
        g, m, sg, ca, kv = (s.get(k) for k in ("gpu", "metrics", "sharedGroup", "cache", "kvCache"))
        m = m or {}
        return cls(
            observed_generation=s.get("observedGeneration"),
            phase=s.get("phase"),
            conditions=parse_conditions(s.get("conditions")),
            endpoint=s.get("endpoint"),
            last_active_time=opt_time(s.get("lastActiveTime")),
            gpu=GPUStatus(g.get("node"), g.get("device"), g.get("vendor"), g.get("architecture"),
                          g.get("memoryMB")) if g else None,
            tokens_per_second=m.get("tokensPerSecond"),
            load_time_seconds=m.get("loadTimeSeconds"),
            avg_latency_ms=m.get("avgLatencyMs"),
            shared_group=SharedGroupStatus(sg.get("groupName"), sg.get("state"), sg.get("queuePosition"),
                                           sg.get("preemptedBy"), opt_time(sg.get("preemptedAt"))) if sg else None,
            cache=CacheStatus(ca.get("strategy"), bool(ca.get("ready", False)), ca.get("pvcName"), ca.get("jobName"),
                              ca.get("jobPhase"), ca.get("message"), ca.get("sizeBytes")) if ca else None,
            kv_utilization=(kv or {}).get("utilization"),
            kv_pressure=bool((kv or {}).get("pressure", False)),
            loading_substage=s.get("loadingSubstage"),
            loading_progress_at=opt_time(s.get("loadingProgressAt")),
        )


@dataclass(frozen=True, slots=True)
class Model:
    """A parsed Model: ``Model.from_obj(body)`` once per event."""

    meta: ObjectMeta
    spec: ModelSpec
    status: ModelStatus

    @property
    def name(self) -> str:
        return self.meta.name

    @property
    def namespace(self) -> str:
        return self.meta.namespace

    @classmethod
    def from_obj(cls, obj: Mapping[str, Any]) -> Model:
        check_kind(obj, "Model")
        return cls(meta=ObjectMeta.from_obj(obj), spec=ModelSpec.from_dict(obj.get("spec")),
                   status=ModelStatus.from_dict(obj.get("status")))
