"""The text-generation backends: Ollama, vLLM, MLC-LLM and llama.cpp.

Owns: each server's port, images, command and args built from ``spec.config`` (reference §3),
environment, probes, timeouts and capability inference. Pure: every builder is a function of the
``LaunchContext`` it is given.

Must not: import Kubernetes clients or CRD code, or read the process environment.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from typing import Any, ClassVar

from flexinfer.backends.base import (
    Backend,
    Capabilities,
    ConfigError,
    ConfigKind,
    LaunchContext,
    Probe,
    env_values,
    flag_args,
    http_probe,
    knob_text,
    read_config,
)
from flexinfer.backends.images import ImageDefault, ImageTable

S, N, F, B, J = ConfigKind.STR, ConfigKind.INT, ConfigKind.FLOAT, ConfigKind.BOOL, ConfigKind.JSON


class Ollama(Backend):
    """``ollama serve``; pulls and caches models itself, so it needs no model volume."""

    name = "ollama"
    port = 11434
    vendors = frozenset({"nvidia", "amd", "cpu"})
    needs_volume = False
    env_name = "OLLAMA"
    images: ClassVar[ImageTable] = {
        "default": ImageDefault(public="ollama/ollama:latest"),
        "amd": ImageDefault(public="ollama/ollama:rocm"),
    }
    tool_calling = True
    quantizations = frozenset({"GGUF"})
    formats = frozenset({"gguf"})
    #: FlexInfer additions: knobs mapped to Ollama's environment variables
    _ENV_KNOBS: ClassVar[tuple[tuple[str, str, ConfigKind], ...]] = (
        ("keepAlive", "OLLAMA_KEEP_ALIVE", S),
        ("numParallel", "OLLAMA_NUM_PARALLEL", N),
        ("contextLength", "OLLAMA_CONTEXT_LENGTH", N),
        ("flashAttention", "OLLAMA_FLASH_ATTENTION", B),
    )
    config_keys: ClassVar[Mapping[str, ConfigKind]] = {k: kind for k, _, kind in _ENV_KNOBS}

    def _legacy_env(self) -> str | None:
        return "DEFAULT_BACKEND_IMAGE"

    def readiness_probe(self) -> Probe:
        return http_probe(self.port, "/")

    def base_args(self, ctx: LaunchContext) -> list[str]:
        return ["serve"]

    def base_env(self, ctx: LaunchContext) -> dict[str, str]:
        return {"OLLAMA_HOST": "0.0.0.0", **env_values(ctx.config, self._ENV_KNOBS)}


class VLLM(Backend):
    """vLLM's OpenAI-compatible server."""

    name = "vllm"
    port = 8000
    env_name = "VLLM"
    startup_timeout_s = 300.0
    images: ClassVar[ImageTable] = {
        "default": ImageDefault(public="vllm/vllm-openai:latest"),
        "amd": ImageDefault(public="rocm/vllm:latest"),
        "gfx1100": ImageDefault(registry_path="flexinfer/vllm:rocm-gfx1100"),
        "gfx906": ImageDefault(registry_path="flexinfer/vllm:rocm-gfx906"),
    }
    tool_calling = True
    supports_lora = True
    supports_kv_cache = True
    uses_compile_cache = True
    quantizations = frozenset({"AWQ", "GPTQ", "FP8", "GGUF"})
    formats = frozenset({"safetensors", "gguf"})
    _FLAGS: ClassVar[tuple[tuple[str, str, ConfigKind], ...]] = (
        ("dtype", "--dtype", S),
        ("maxModelLen", "--max-model-len", N),
        ("gpuMemoryUtilization", "--gpu-memory-utilization", F),
        ("trustRemoteCode", "--trust-remote-code", B),
        ("maxNumSeqs", "--max-num-seqs", N),
        ("maxNumBatchedTokens", "--max-num-batched-tokens", N),
        ("enforceEager", "--enforce-eager", B),
        ("cpuOffloadGb", "--cpu-offload-gb", F),
        ("quantization", "--quantization", S),
        ("tokenizer", "--tokenizer", S),
        ("kvCacheDtype", "--kv-cache-dtype", S),
        ("reasoningParser", "--reasoning-parser", S),
        ("speculativeConfig", "--speculative-config", J),
        ("limitMmPerPrompt", "--limit-mm-per-prompt", J),
        ("maxLoraRank", "--max-lora-rank", N),
    )
    _ENV_KNOBS: ClassVar[tuple[tuple[str, str, ConfigKind], ...]] = (
        ("hipVisibleDevices", "HIP_VISIBLE_DEVICES", S),
        ("attentionBackend", "VLLM_ATTENTION_BACKEND", S),
        ("disabledKernels", "VLLM_DISABLED_KERNELS", S),
    )
    config_keys: ClassVar[Mapping[str, ConfigKind]] = {
        **{k: kind for k, _, kind in _FLAGS},
        **{k: kind for k, _, kind in _ENV_KNOBS},
        "tensorParallelSize": N,
        "swapSpace": N,  # spec.kvCache.swapSpace wins
        "enablePrefixCaching": B,
        "enableToolCalling": B,
        "toolCallParser": S,
    }

    def default_command(self, ctx: LaunchContext) -> list[str]:
        # Explicit: rocm/vllm images have no server entrypoint.
        return ["python3", "-m", "vllm.entrypoints.openai.api_server"]

    def base_args(self, ctx: LaunchContext) -> list[str]:
        c = ctx.config
        out = ["--host", "0.0.0.0", "--port", str(self.port), "--model", ctx.model_path]
        served = read_config(c, "servedModelName", S) or ctx.served_name
        if served:
            out += ["--served-model-name", served]
        tp = read_config(c, "tensorParallelSize", N)
        if tp is None and ctx.gpu_count > 1:
            tp = ctx.gpu_count
        if tp:
            out += ["--tensor-parallel-size", str(tp)]
        out += flag_args(c, self._FLAGS)
        prefix = read_config(c, "enablePrefixCaching", B)
        if prefix is not None:
            out.append("--enable-prefix-caching" if prefix else "--no-enable-prefix-caching")
        if read_config(c, "enableToolCalling", B):
            out += ["--enable-auto-tool-choice", "--tool-call-parser", read_config(c, "toolCallParser", S) or "hermes"]
        if ctx.kv_block_size:
            out += ["--block-size", str(ctx.kv_block_size)]
        swap = ctx.kv_swap_space_gb if ctx.kv_swap_space_gb is not None else read_config(c, "swapSpace", N)
        if swap is not None:
            out += ["--swap-space", str(swap)]
        if ctx.lora_adapters > 0 and self.supports_lora:
            out += ["--enable-lora", "--max-loras", str(max(ctx.lora_adapters, 4))]
        return out

    def base_env(self, ctx: LaunchContext) -> dict[str, str]:
        out = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
        if ctx.vendor == "amd" and ctx.arch.startswith("gfx110"):
            # RDNA3: the Triton flash-attention and AITER kernels target Instinct parts.
            out.update({"VLLM_USE_TRITON_FLASH_ATTN": "0", "VLLM_ROCM_USE_AITER": "0"})
        if ctx.lora_adapters > 0 and self.supports_lora:
            out["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"  # /v1/load_lora_adapter is off without it
        out.update(env_values(ctx.config, self._ENV_KNOBS))
        return out


class MLCLLM(Backend):
    """``python -m mlc_llm serve``."""

    name = "mlc-llm"
    aliases = ("mlc", "mlc_llm", "mlc-llm-chat", "mlcllm")
    port = 8000
    env_name = "MLC"
    startup_timeout_s = 90.0
    images: ClassVar[ImageTable] = {
        "default": ImageDefault(public="ghcr.io/mlc-ai/mlc-llm:cuda"),
        "amd": ImageDefault(public="ghcr.io/mlc-ai/mlc-llm:rocm"),
        "gfx1100": ImageDefault(registry_path="flexinfer/mlc-llm:rocm64-gfx1100"),
        "gfx906": ImageDefault(registry_path="flexinfer/mlc-llm:rocm64-gfx906"),
        "maxwell": ImageDefault(registry_path="flexinfer/mlc-llm:cuda-maxwell-v7"),
    }
    formats = frozenset({"mlc"})
    #: GPU memory MLC plans with, bytes (the original's values)
    GPU_SIZE_BYTES_MAXWELL: ClassVar[int] = 5_000_000_000
    GPU_SIZE_BYTES_DEFAULT: ClassVar[int] = 24_696_061_952
    _OVERRIDES: ClassVar[tuple[tuple[str, str, ConfigKind], ...]] = (
        ("maxNumSequence", "max_num_sequence", N),
        ("maxTotalSeqLength", "max_total_seq_length", N),
        ("prefillChunkSize", "prefill_chunk_size", N),
        ("gpuMemoryUtilization", "gpu_memory_utilization", F),
        ("contextWindowSize", "context_window_size", N),
        ("slidingWindowSize", "sliding_window_size", N),
        ("attentionSinkSize", "attention_sink_size", N),
        ("tensorParallelShards", "tensor_parallel_shards", N),
    )
    config_keys: ClassVar[Mapping[str, ConfigKind]] = {
        **{k: kind for k, _, kind in _OVERRIDES},
        "mode": S,
        "modelLibPath": S,
        "jitPolicy": S,
        "device": S,
        "gpuMemoryBytes": N,
        "overridesRaw": S,  # extra "k=v;k=v" appended to --overrides
    }

    def readiness_probe(self) -> Probe:
        return http_probe(self.port, "/v1/models")

    def default_command(self, ctx: LaunchContext) -> list[str]:
        return ["python", "-m", "mlc_llm", "serve"]

    def overrides(self, ctx: LaunchContext) -> str:
        """The ``--overrides`` value: ``key=value`` pairs joined by ``;`` (empty if none)."""
        parts = []
        for key, name, kind in self._OVERRIDES:
            v = read_config(ctx.config, key, kind)
            if v is None and key == "tensorParallelShards" and ctx.gpu_count > 1:
                v = ctx.gpu_count
            if v is not None:
                parts.append(f"{name}={knob_text(v)}")
        raw = read_config(ctx.config, "overridesRaw", S)
        if raw:
            parts += [p for p in raw.split(";") if p.strip()]
        return ";".join(parts)

    def base_args(self, ctx: LaunchContext) -> list[str]:
        c = ctx.config
        out = [ctx.model_path, "--host", "0.0.0.0", "--port", str(self.port)]
        out += flag_args(c, (("mode", "--mode", S), ("modelLibPath", "--model-lib", S), ("device", "--device", S)))
        ov = self.overrides(ctx)
        if ov:
            out += ["--overrides", ov]
        return out

    def base_env(self, ctx: LaunchContext) -> dict[str, str]:
        maxwell = ctx.arch.startswith("sm_5")
        size = read_config(ctx.config, "gpuMemoryBytes", N)
        if size is None:
            size = self.GPU_SIZE_BYTES_MAXWELL if maxwell else self.GPU_SIZE_BYTES_DEFAULT
        out = {"MLC_GPU_SIZE_BYTES": str(size)}
        jit = read_config(ctx.config, "jitPolicy", S) or ("READONLY" if maxwell else None)
        if jit:
            out["MLC_JIT_POLICY"] = jit
        return out


_FLASH_ATTN = {"true": "on", "1": "on", "yes": "on", "on": "on", "false": "off", "0": "off", "no": "off",
               "off": "off", "auto": "auto"}


class LlamaCpp(Backend):
    """llama.cpp's ``llama-server`` (the image's entrypoint; ``config.command`` replaces it)."""

    name = "llamacpp"
    aliases = ("llama.cpp", "llama-cpp", "llama_cpp")
    port = 8080
    vendors = frozenset({"nvidia", "amd", "cpu"})
    env_name = "LLAMACPP"
    images: ClassVar[ImageTable] = {
        "default": ImageDefault(public="ghcr.io/ggml-org/llama.cpp:server-cuda"),
        "cpu": ImageDefault(public="ghcr.io/ggml-org/llama.cpp:server"),
        "amd": ImageDefault(public="ghcr.io/ggml-org/llama.cpp:server-rocm"),
        "gfx1100": ImageDefault(registry_path="flexinfer/llamacpp:rocm-gfx1100"),
        "gfx906": ImageDefault(registry_path="library/llamacpp:rocm-gfx906-patched"),
        "maxwell": ImageDefault(registry_path="flexinfer/llamacpp:cuda-maxwell"),
    }
    quantizations = frozenset({"GGUF"})
    formats = frozenset({"gguf"})
    #: layers offloaded when the config does not say (all of them)
    ALL_LAYERS: ClassVar[int] = 999
    _FLAGS: ClassVar[tuple[tuple[str, str, ConfigKind], ...]] = (
        ("contextSize", "--ctx-size", N),
        ("batchSize", "--batch-size", N),
        ("ubatchSize", "--ubatch-size", N),
        ("threads", "--threads", N),
        ("parallel", "--parallel", N),
        ("chatTemplate", "--chat-template", S),
        ("jinja", "--jinja", B),
        ("device", "--device", S),
        ("cacheTypeK", "--cache-type-k", S),
        ("cacheTypeV", "--cache-type-v", S),
        ("reasoningFormat", "--reasoning-format", S),
        ("reasoningBudget", "--reasoning-budget", N),
        ("metrics", "--metrics", B),
    )
    config_keys: ClassVar[Mapping[str, ConfigKind]] = {
        **{k: kind for k, _, kind in _FLAGS},
        "nGPULayers": N,
        "flashAttention": S,
        "mmproj": S,
        "fitOff": B,
        "ggufFile": S,
        "modelFile": S,
    }

    def validate_config(self, config: Mapping[str, Any]) -> None:
        super().validate_config(config)
        self.flash_attn(config)

    @staticmethod
    def flash_attn(config: Mapping[str, Any]) -> str | None:
        """``on``/``off``/``auto`` from ``config.flashAttention`` (booleans accepted)."""
        raw = read_config(config, "flashAttention", S)
        if raw is None:
            return None
        v = _FLASH_ATTN.get(raw.strip().lower())
        if v is None:
            raise ConfigError("flashAttention", f"expected on/off/auto or a boolean, got {raw!r}")
        return v

    @staticmethod
    def gguf_file(config: Mapping[str, Any]) -> str | None:
        """The GGUF file inside an HF repository (``config.ggufFile``, else ``config.modelFile``)."""
        return read_config(config, "ggufFile", S) or read_config(config, "modelFile", S)

    def base_args(self, ctx: LaunchContext) -> list[str]:
        c = ctx.config
        out = ["--host", "0.0.0.0", "--port", str(self.port), "--model", ctx.model_path]
        served = read_config(c, "servedModelName", S) or ctx.served_name
        if served:
            out += ["--alias", served]
        layers = 0 if ctx.vendor == "cpu" else read_config(c, "nGPULayers", N)
        out += ["--n-gpu-layers", str(self.ALL_LAYERS if layers is None else layers)]
        out += flag_args(c, self._FLAGS)
        fa = self.flash_attn(c)
        if fa:
            out += ["--flash-attn", fa]
        mmproj = read_config(c, "mmproj", S)
        if mmproj:
            if not mmproj.startswith("/"):
                mmproj = posixpath.join(posixpath.dirname(ctx.model_path) or "/models", mmproj)
            out += ["--mmproj", mmproj]
        if read_config(c, "fitOff", B):
            out += ["--fit", "off"]
        return out

    def capabilities(self, config: Mapping[str, Any]) -> Capabilities:
        return Capabilities(
            tool_calling=bool(read_config(config, "jinja", B)),
            vision=bool(read_config(config, "mmproj", S)),
            image_generation=False,
        )
