"""What a backend is: the ``Backend`` base class and the small value types it speaks in.

Owns: the launch context handed in by the operator (``LaunchContext``), probes, capabilities,
typed reads of ``spec.config`` knobs (``ConfigError`` on a wrong type), the GPU resource names and
the environment every ROCm/compile-cache container gets. Concrete backends live in ``llm.py`` and
``imagegen.py``; image choice in ``images.py``; the support matrix in ``compat.py``.

Must not: import Kubernetes clients, read the process environment (``images.py`` owns that), or
know about CRD objects. Everything here is pure data and pure functions of their arguments.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar

from flexinfer import labels
from flexinfer.backends.images import ImageChoice, ImageTable, resolve_image

#: Extended resource name per vendor; CPU requests no extended resource.
GPU_RESOURCE_NAMES: Mapping[str, str] = {
    "nvidia": labels.RESOURCE_NVIDIA_GPU,
    "amd": labels.RESOURCE_AMD_GPU,
    "intel": labels.RESOURCE_INTEL_GPU,
}

#: Where the compile cache volume is mounted in the backend container.
COMPILE_CACHE_DIR = "/cache/compile"

#: Vendors a Model can name; ``auto`` is resolved by the operator from the nodes.
VENDORS: tuple[str, ...] = ("auto", "nvidia", "amd", "cpu")


def gpu_resource_name(vendor: str) -> str | None:
    """The extended resource a pod of ``vendor`` requests, or None for CPU (and unknown vendors)."""
    return GPU_RESOURCE_NAMES.get(vendor)


class ConfigKind(StrEnum):
    """How a ``spec.config`` knob is read."""

    STR = "string"
    INT = "integer"
    FLOAT = "number"
    BOOL = "boolean"
    JSON = "json"  # a string passed through, or an object/array serialised to compact JSON
    LIST = "list"  # a list of strings, or one string split like a shell would
    MAP = "map"  # an object of string -> scalar


class ConfigError(ValueError):
    """A ``spec.config`` knob has a value of the wrong type. ``key`` names the knob."""

    reason = "InvalidConfig"

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"config.{key}: {message}")
        self.key = key


_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def read_config(config: Mapping[str, Any], key: str, kind: ConfigKind) -> Any:
    """Read ``config[key]`` as ``kind``; None when absent, null or an empty string.

    Values may come as JSON scalars or as strings (``"1"``, ``"true"``, ``"4096"``), the way the
    original stored them. Raises ``ConfigError`` when the value cannot be read as ``kind``.
    """
    raw = config.get(key)
    if raw is None or raw == "":
        return None
    if kind is ConfigKind.STR:
        if isinstance(raw, bool):
            return "true" if raw else "false"
        if isinstance(raw, str | int | float):
            return str(raw)
        raise ConfigError(key, f"expected a string, got {type(raw).__name__}")
    if kind is ConfigKind.BOOL:
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, int | float):
            return raw != 0
        if isinstance(raw, str):
            low = raw.strip().lower()
            if low in _TRUE:
                return True
            if low in _FALSE:
                return False
        raise ConfigError(key, f"expected a boolean (true/false/1/0), got {raw!r}")
    if kind is ConfigKind.INT:
        if isinstance(raw, int) and not isinstance(raw, bool):
            return raw
        if isinstance(raw, float) and raw.is_integer():
            return int(raw)
        return _read_number(key, raw, int, "an integer")
    if kind is ConfigKind.FLOAT:
        if isinstance(raw, int | float) and not isinstance(raw, bool):
            return float(raw)
        return _read_number(key, raw, float, "a number")
    if kind is ConfigKind.JSON:
        if isinstance(raw, str):
            return raw
        if isinstance(raw, Mapping | list | int | float | bool):
            return json.dumps(raw, separators=(",", ":"), sort_keys=True)
        raise ConfigError(key, f"expected JSON, got {type(raw).__name__}")
    if kind is ConfigKind.LIST:
        if isinstance(raw, str):
            try:
                return shlex.split(raw)
            except ValueError as e:
                raise ConfigError(key, f"cannot split {raw!r}: {e}") from None
        if isinstance(raw, list) and all(isinstance(x, str | int | float) and not isinstance(x, bool) for x in raw):
            return [str(x) for x in raw]
        raise ConfigError(key, "expected a list of strings")
    # MAP
    if isinstance(raw, Mapping) and all(isinstance(k, str) for k in raw):
        out: dict[str, str] = {}
        for k, v in raw.items():
            if isinstance(v, bool):
                out[k] = "true" if v else "false"
            elif isinstance(v, str | int | float):
                out[k] = str(v)
            else:
                raise ConfigError(f"{key}.{k}", "expected a scalar value")
        return out
    raise ConfigError(key, "expected an object of string values")


def _read_number(key: str, raw: Any, parse: Callable[[str], Any], what: str) -> Any:
    """The rest of a number knob: a numeric string parsed, else ``ConfigError`` (booleans named)."""
    if isinstance(raw, bool):
        raise ConfigError(key, f"expected {what}, got a boolean")
    if isinstance(raw, str):
        try:
            return parse(raw.strip())
        except ValueError:
            pass
    raise ConfigError(key, f"expected {what}, got {raw!r}")


#: Knobs every backend understands (FlexInfer additions, not in the original).
COMMON_CONFIG: Mapping[str, ConfigKind] = {
    "command": ConfigKind.LIST,  # replaces the container command
    "extraArgs": ConfigKind.LIST,  # appended to the args verbatim
    "env": ConfigKind.MAP,  # extra environment variables (win over the backend's own)
    "servedModelName": ConfigKind.STR,  # the model name the server answers to
    "hfAllowPatterns": ConfigKind.JSON,  # prefetch filters (read by the operator's cache Job)
    "hfIgnorePatterns": ConfigKind.JSON,
    "hfRevision": ConfigKind.STR,
    "warmPolicy": ConfigKind.STR,  # "primary": wins the idle fallback of a shared group
}


@dataclass(frozen=True, slots=True)
class Probe:
    """A readiness or startup probe; ``to_k8s()`` renders the Kubernetes Probe object."""

    port: int
    path: str | None = None  # None: a TCP socket probe
    initial_delay_s: int = 0
    period_s: int = 10
    timeout_s: int = 5
    failure_threshold: int = 30

    def to_k8s(self) -> dict[str, Any]:
        handler: dict[str, Any]
        if self.path is None:
            handler = {"tcpSocket": {"port": self.port}}
        else:
            handler = {"httpGet": {"path": self.path, "port": self.port}}
        return {
            **handler,
            "initialDelaySeconds": self.initial_delay_s,
            "periodSeconds": self.period_s,
            "timeoutSeconds": self.timeout_s,
            "failureThreshold": self.failure_threshold,
        }


def http_probe(port: int, path: str, **kw: int) -> Probe:
    """An HTTP GET probe; failureThreshold 30 unless given (the original's helper)."""
    return Probe(port=port, path=path, **kw)


def tcp_probe(port: int, **kw: int) -> Probe:
    """A TCP socket probe; failureThreshold 90 unless given (the original's helper)."""
    kw.setdefault("failure_threshold", 90)
    return Probe(port=port, path=None, **kw)


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What clients may ask of a model; None means unknown."""

    tool_calling: bool | None = None
    vision: bool | None = None
    image_generation: bool | None = None

    def merged(self, override: Capabilities) -> Capabilities:
        """``override``'s set fields win (``spec.capabilities`` over inference)."""
        return Capabilities(
            tool_calling=self.tool_calling if override.tool_calling is None else override.tool_calling,
            vision=self.vision if override.vision is None else override.vision,
            image_generation=(
                self.image_generation if override.image_generation is None else override.image_generation
            ),
        )


@dataclass(frozen=True, slots=True)
class LaunchContext:
    """Everything a backend needs to build its container, gathered by the operator.

    ``model_path`` is what the server loads (``/models/<n>``, ``/models/<n>/x.gguf``, an Ollama
    tag, ...). ``served_name`` is the name the proxy rewrites requests to; backends that can alias
    (vLLM, llama.cpp) answer to it. ``vendor`` is resolved (``nvidia``, ``amd`` or ``cpu``).
    """

    model_path: str
    config: Mapping[str, Any] = field(default_factory=dict)
    vendor: str = "nvidia"
    arch: str = ""
    gpu_count: int = 1
    served_name: str = ""
    source: str = ""
    lora_adapters: int = 0  # LoRAAdapters referencing the Model
    kv_block_size: int | None = None  # spec.kvCache.maxBlockSize
    kv_swap_space_gb: int | None = None  # spec.kvCache.swapSpace
    compile_cache: bool = False  # a compile cache volume is mounted at COMPILE_CACHE_DIR


def source_model_id(source: str) -> str:
    """The model id inside a source URI: ``HF://org/m`` -> ``org/m``; ``pvc://`` is kept whole."""
    for prefix in ("HF://", "hf://", "ollama://", "file://"):
        if source.startswith(prefix):
            return source[len(prefix):]
    return source


def rocm_env(arch: str) -> dict[str, str]:
    """Environment ROCm needs on consumer and older AMD parts."""
    if arch.startswith("gfx110"):
        return {
            "HSA_OVERRIDE_GFX_VERSION": "11.0.0",
            "TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL": "1",
            "PYTORCH_ROCM_ARCH": "gfx1100",
        }
    if arch == "gfx906":
        return {"HSA_ENABLE_SDMA": "0"}
    return {}


def compile_cache_env() -> dict[str, str]:
    """Point every kernel/compile cache of torch, triton, MIOpen and vLLM into the cache volume."""
    d = COMPILE_CACHE_DIR
    return {
        "MIOPEN_CUSTOM_CACHE_DIR": f"{d}/miopen",
        "MIOPEN_USER_DB_PATH": f"{d}/miopen",
        "VLLM_CACHE_ROOT": f"{d}/vllm",
        "XDG_CACHE_HOME": d,
        "TORCHINDUCTOR_CACHE_DIR": f"{d}/inductor",
        "TRITON_CACHE_DIR": f"{d}/triton",
        "TORCH_HOME": f"{d}/torch",
    }


def flag_args(config: Mapping[str, Any], table: Sequence[tuple[str, str, ConfigKind]]) -> list[str]:
    """Turn config knobs into CLI args: ``(key, flag, kind)``; booleans are bare flags when true."""
    out: list[str] = []
    for key, flag, kind in table:
        v = read_config(config, key, kind)
        if v is None:
            continue
        if kind is ConfigKind.BOOL:
            if v:
                out.append(flag)
        else:
            out += [flag, knob_text(v)]
    return out


def env_values(config: Mapping[str, Any], table: Sequence[tuple[str, str, ConfigKind]]) -> dict[str, str]:
    """Turn config knobs into environment variables: ``(key, variable, kind)``; booleans are ``1``/``0``."""
    out: dict[str, str] = {}
    for key, var, kind in table:
        v = read_config(config, key, kind)
        if v is not None:
            out[var] = ("1" if v else "0") if kind is ConfigKind.BOOL else knob_text(v)
    return out


def knob_text(v: Any) -> str:
    """A knob's value as a command line or environment wants it: floats ``%g``, the rest ``str``."""
    return format(v, "g") if isinstance(v, float) else str(v)


class Backend:
    """One inference server. Subclasses set the class attributes and override the builders.

    Instances hold no state; the registry keeps one per backend.
    """

    name: ClassVar[str]
    aliases: ClassVar[tuple[str, ...]] = ()
    port: ClassVar[int] = 8000
    #: vendors the backend runs on (``cpu`` included where it can run without a GPU)
    vendors: ClassVar[frozenset[str]] = frozenset({"nvidia", "amd"})
    needs_volume: ClassVar[bool] = True
    image_generation: ClassVar[bool] = False
    default_idle_timeout_s: ClassVar[float] = 300.0
    startup_timeout_s: ClassVar[float] = 60.0
    #: ``DEFAULT_<env_name>_IMAGE[_VARIANT]`` overrides the images
    env_name: ClassVar[str]
    images: ClassVar[ImageTable]
    #: backend knobs read from ``spec.config`` (COMMON_CONFIG applies to all)
    config_keys: ClassVar[Mapping[str, ConfigKind]] = {}
    tool_calling: ClassVar[bool] = False
    supports_lora: ClassVar[bool] = False
    lora_load_path: ClassVar[str] = "/v1/load_lora_adapter"
    lora_unload_path: ClassVar[str] = "/v1/unload_lora_adapter"
    supports_kv_cache: ClassVar[bool] = False
    uses_compile_cache: ClassVar[bool] = False
    quantizations: ClassVar[frozenset[str]] = frozenset()
    #: model file formats the server loads
    formats: ClassVar[frozenset[str]] = frozenset()

    def __repr__(self) -> str:
        return f"<Backend {self.name}>"

    # ---- static facts -------------------------------------------------------------------------

    def supports_vendor(self, vendor: str) -> bool:
        """Whether the backend runs on ``vendor`` (``auto`` is checked after detection)."""
        return vendor == "auto" or vendor in self.vendors

    def readiness_probe(self) -> Probe:
        return http_probe(self.port, "/health")

    def startup_probe(self) -> Probe | None:
        return None

    def image(self, vendor: str, arch: str = "", env: Mapping[str, str] | None = None) -> ImageChoice:
        """The container image for ``vendor``/``arch``, honouring ``DEFAULT_<B>_IMAGE*`` in ``env``."""
        return resolve_image(self.env_name, self.images, vendor, arch, env, legacy_env=self._legacy_env())

    def _legacy_env(self) -> str | None:
        return None

    def capabilities(self, config: Mapping[str, Any]) -> Capabilities:
        """Capabilities inferred from the backend and its config (``spec.capabilities`` wins)."""
        return Capabilities(tool_calling=self.tool_calling, image_generation=self.image_generation)

    def all_config_keys(self) -> Mapping[str, ConfigKind]:
        return {**COMMON_CONFIG, **self.config_keys}

    def validate_config(self, config: Mapping[str, Any]) -> None:
        """Raise ``ConfigError`` for a known knob of the wrong type; unknown knobs pass through."""
        for key, kind in self.all_config_keys().items():
            read_config(config, key, kind)

    # ---- container ----------------------------------------------------------------------------

    def command(self, ctx: LaunchContext) -> list[str]:
        """The container command; empty means the image's entrypoint. ``config.command`` wins."""
        override = read_config(ctx.config, "command", ConfigKind.LIST)
        return list(override) if override else self.default_command(ctx)

    def default_command(self, ctx: LaunchContext) -> list[str]:
        return []

    def args(self, ctx: LaunchContext) -> list[str]:
        """The container args: the backend's own, then LoRA/KV additions, then ``config.extraArgs``."""
        out = self.base_args(ctx)
        extra = read_config(ctx.config, "extraArgs", ConfigKind.LIST)
        if extra:
            out += extra
        return out

    def base_args(self, ctx: LaunchContext) -> list[str]:
        return []

    def env(self, ctx: LaunchContext) -> dict[str, str]:
        """The container environment; ``config.env`` entries win over the backend's."""
        out: dict[str, str] = {}
        if ctx.vendor == "amd":
            out.update(rocm_env(ctx.arch))
        if ctx.compile_cache and self.uses_compile_cache:
            out.update(compile_cache_env())
        out.update(self.base_env(ctx))
        extra = read_config(ctx.config, "env", ConfigKind.MAP)
        if extra:
            out.update(extra)
        return out

    def base_env(self, ctx: LaunchContext) -> dict[str, str]:
        return {}

    def context_window(self, config: Mapping[str, Any]) -> int | None:
        """The context length the server was configured with, if the config says."""
        for key in ("maxModelLen", "maxTotalSeqLength", "contextWindowSize", "contextSize"):
            try:
                v = read_config(config, key, ConfigKind.INT)
            except ConfigError:
                continue
            if v:
                return int(v)
        return None

