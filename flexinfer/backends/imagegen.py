"""The image-generation backends: diffusers, ComfyUI and vLLM-Omni.

Owns: their ports, images, commands, config-to-environment mapping, probes and their longer
idle (10 m) and startup timeouts. Pure functions of the ``LaunchContext``.

Must not: import Kubernetes clients or CRD code, or read the process environment.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from flexinfer.backends.base import (
    Backend,
    ConfigKind,
    LaunchContext,
    Probe,
    env_values,
    flag_args,
    http_probe,
    source_model_id,
    tcp_probe,
)
from flexinfer.backends.images import ImageDefault, ImageTable
from flexinfer.backends.llm import VLLM

S, N, F, B = ConfigKind.STR, ConfigKind.INT, ConfigKind.FLOAT, ConfigKind.BOOL

IMAGE_IDLE_TIMEOUT_S = 600.0


class Diffusers(Backend):
    """A diffusers HTTP API server configured entirely by environment variables."""

    name = "diffusers"
    aliases = ("diffusers-api",)
    port = 8000
    env_name = "DIFFUSERS"
    image_generation = True
    default_idle_timeout_s = IMAGE_IDLE_TIMEOUT_S
    startup_timeout_s = 180.0
    uses_compile_cache = True
    images: ClassVar[ImageTable] = {
        "default": ImageDefault(registry_path="library/diffusers-api:cuda"),
        "amd": ImageDefault(registry_path="library/diffusers-api:rocm-latest"),
        "gfx1100": ImageDefault(registry_path="flexinfer/diffusers:rocm-gfx1100"),
        "gfx906": ImageDefault(registry_path="flexinfer/diffusers:rocm-gfx906"),
    }
    formats = frozenset({"safetensors"})
    #: config knob -> environment variable
    _ENV_KNOBS: ClassVar[tuple[tuple[str, str, ConfigKind], ...]] = (
        ("numInferenceSteps", "NUM_INFERENCE_STEPS", N),
        ("guidanceScale", "GUIDANCE_SCALE", F),
        ("scheduler", "SCHEDULER", S),
        ("negativePrompt", "NEGATIVE_PROMPT", S),
        ("useFp16", "USE_FP16", B),
        ("vaePath", "VAE_PATH", S),
        ("pipelineMode", "PIPELINE_MODE", S),
        ("strength", "STRENGTH", F),
        ("skipWarmup", "SKIP_WARMUP", B),
        ("warmupWidth", "WARMUP_WIDTH", N),
        ("warmupHeight", "WARMUP_HEIGHT", N),
        ("cpuOffload", "USE_CPU_OFFLOAD", B),
    )
    config_keys: ClassVar[Mapping[str, ConfigKind]] = {
        **{k: kind for k, _, kind in _ENV_KNOBS},
        "vaeRepo": S,  # prefetched next to the model by the cache Job
    }
    #: allocator settings that keep gfx906 (16 GB, no XNACK) from fragmenting
    GFX906_HIP_ALLOC_CONF: ClassVar[str] = "garbage_collection_threshold:0.8,max_split_size_mb:256"

    def readiness_probe(self) -> Probe:
        return http_probe(self.port, "/health", initial_delay_s=0, period_s=5, failure_threshold=3)

    def startup_probe(self) -> Probe | None:
        period = 10
        return http_probe(self.port, "/health", period_s=period,
                          failure_threshold=int(self.startup_timeout_s // period))

    def base_env(self, ctx: LaunchContext) -> dict[str, str]:
        out = {"MODEL_ID": source_model_id(ctx.source) or ctx.model_path, "MODEL": ctx.model_path,
               "PORT": str(self.port), **env_values(ctx.config, self._ENV_KNOBS)}
        if ctx.vendor == "amd" and ctx.arch == "gfx906":
            out.setdefault("PYTORCH_HIP_ALLOC_CONF", self.GFX906_HIP_ALLOC_CONF)
            out.setdefault("ENABLE_ATTENTION_SLICING", "1")
        return out


class ComfyUI(Backend):
    """ComfyUI's ``main.py`` server."""

    name = "comfyui"
    aliases = ("comfy", "comfy-ui", "comfy_ui")
    port = 8188
    env_name = "COMFYUI"
    image_generation = True
    default_idle_timeout_s = IMAGE_IDLE_TIMEOUT_S
    startup_timeout_s = 180.0
    uses_compile_cache = True
    images: ClassVar[ImageTable] = {
        "default": ImageDefault(public="comfyanonymous/comfyui:latest"),
        "amd": ImageDefault(registry_path="library/comfyui:rocm6.2.3-v8"),
        "gfx1100": ImageDefault(registry_path="flexinfer/comfyui:rocm-gfx1100"),
        "gfx906": ImageDefault(registry_path="flexinfer/comfyui:rocm-gfx906"),
    }
    formats = frozenset({"safetensors"})
    OUTPUT_DIR: ClassVar[str] = "/output"
    _FLAGS: ClassVar[tuple[tuple[str, str, ConfigKind], ...]] = (
        ("outputDirectory", "--output-directory", S),
        ("inputDirectory", "--input-directory", S),
        ("extraModelPathsConfig", "--extra-model-paths-config", S),
        ("lowVram", "--lowvram", B),
        ("highVram", "--highvram", B),
    )
    config_keys: ClassVar[Mapping[str, ConfigKind]] = {k: kind for k, _, kind in _FLAGS}

    def readiness_probe(self) -> Probe:
        return tcp_probe(self.port)

    def default_command(self, ctx: LaunchContext) -> list[str]:
        return ["python", "main.py"]

    def base_args(self, ctx: LaunchContext) -> list[str]:
        return ["--listen", "0.0.0.0", "--port", str(self.port), "--enable-cors-header",
                *flag_args(ctx.config, self._FLAGS)]

    def base_env(self, ctx: LaunchContext) -> dict[str, str]:
        return {"COMFYUI_OUTPUT_DIRECTORY": self.OUTPUT_DIR}


class VLLMOmni(VLLM):
    """vLLM serving omni-modal (image-generating) models; same knobs as vLLM."""

    name = "vllm-omni"
    aliases = ("vllm-diffusion", "vllm_omni")
    env_name = "VLLM_OMNI"
    image_generation = True
    default_idle_timeout_s = IMAGE_IDLE_TIMEOUT_S
    startup_timeout_s = 180.0
    tool_calling = False
    supports_lora = False
    images: ClassVar[ImageTable] = {
        "default": ImageDefault(public="vllm/vllm-openai:latest"),
        "amd": ImageDefault(public="rocm/vllm:latest", registry_path="library/vllm-api:rocm-navi"),
    }

    def readiness_probe(self) -> Probe:
        return http_probe(self.port, "/health", initial_delay_s=30)
