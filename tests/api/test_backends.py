"""The backend registry: names and aliases, static facts, args/env per config, images, compatibility."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from flexinfer.backends import (
    ACCEPTED_NAMES,
    BACKEND_NAMES,
    BACKENDS,
    Capabilities,
    ConfigError,
    ConfigKind,
    ImageNotConfigured,
    LaunchContext,
    Support,
    UnknownBackendError,
    arch_vram_mb,
    canonical_name,
    check_placement,
    check_vram,
    get_backend,
    gpu_resource_name,
    read_config,
    support_level,
    vendor_of_arch,
)
from tests.api.helpers import ROOT

# ---- registry ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "canonical"), [
    ("ollama", "ollama"), ("vllm", "vllm"), ("VLLM", "vllm"), (" vllm ", "vllm"),
    ("llamacpp", "llamacpp"), ("llama.cpp", "llamacpp"), ("llama-cpp", "llamacpp"), ("llama_cpp", "llamacpp"),
    ("mlc-llm", "mlc-llm"), ("mlc", "mlc-llm"), ("mlc_llm", "mlc-llm"), ("mlc-llm-chat", "mlc-llm"),
    ("comfyui", "comfyui"), ("comfy", "comfyui"), ("comfy-ui", "comfyui"), ("comfy_ui", "comfyui"),
    ("vllm-omni", "vllm-omni"), ("vllm-diffusion", "vllm-omni"), ("vllm_omni", "vllm-omni"),
    ("diffusers", "diffusers"), ("diffusers-api", "diffusers"),
])
def test_aliases(name, canonical):
    assert canonical_name(name) == canonical
    assert get_backend(name).name == canonical


@pytest.mark.parametrize("name", ["", "tgi", "llama", "vllm2", "ollama://x"])
def test_unknown_backend(name):
    with pytest.raises(UnknownBackendError) as e:
        get_backend(name)
    assert e.value.reason == "UnknownBackend" and "known: ollama, vllm" in str(e.value)


def test_registry_contents():
    assert BACKEND_NAMES == ("ollama", "vllm", "mlc-llm", "llamacpp", "diffusers", "comfyui", "vllm-omni")
    assert set(BACKEND_NAMES) <= set(ACCEPTED_NAMES) and len(ACCEPTED_NAMES) == len(set(ACCEPTED_NAMES))
    assert all(n == n.lower() for n in ACCEPTED_NAMES)


# ---- static facts ----------------------------------------------------------------------------------

FACTS = {  # port, idle, startup, needs volume, image generation, vendors, readiness (path or None=tcp)
    "ollama": (11434, 300, 60, False, False, {"nvidia", "amd", "cpu"}, "/"),
    "vllm": (8000, 300, 300, True, False, {"nvidia", "amd"}, "/health"),
    "mlc-llm": (8000, 300, 90, True, False, {"nvidia", "amd"}, "/v1/models"),
    "llamacpp": (8080, 300, 60, True, False, {"nvidia", "amd", "cpu"}, "/health"),
    "diffusers": (8000, 600, 180, True, True, {"nvidia", "amd"}, "/health"),
    "comfyui": (8188, 600, 180, True, True, {"nvidia", "amd"}, None),
    "vllm-omni": (8000, 600, 180, True, True, {"nvidia", "amd"}, "/health"),
}


@pytest.mark.parametrize("name", BACKEND_NAMES)
def test_static_facts(name):
    b = get_backend(name)
    port, idle, startup, volume, image_gen, vendors, path = FACTS[name]
    assert (b.port, b.default_idle_timeout_s, b.startup_timeout_s, b.needs_volume, b.image_generation) == (
        port, idle, startup, volume, image_gen)
    assert set(b.vendors) == vendors and b.supports_vendor("auto")
    probe = b.readiness_probe()
    assert probe.port == port and probe.path == path
    assert probe.failure_threshold == (90 if path is None else 3 if name == "diffusers" else 30)


def test_probes_render_for_kubernetes():
    assert get_backend("vllm").readiness_probe().to_k8s() == {
        "httpGet": {"path": "/health", "port": 8000}, "initialDelaySeconds": 0, "periodSeconds": 10,
        "timeoutSeconds": 5, "failureThreshold": 30}
    assert get_backend("comfyui").readiness_probe().to_k8s()["tcpSocket"] == {"port": 8188}
    assert get_backend("vllm-omni").readiness_probe().initial_delay_s == 30
    startup = get_backend("diffusers").startup_probe()
    assert startup is not None and startup.period_s * startup.failure_threshold == 180
    assert all(get_backend(n).startup_probe() is None for n in BACKEND_NAMES if n != "diffusers")


def test_optional_capabilities():
    assert [n for n in BACKEND_NAMES if get_backend(n).supports_lora] == ["vllm"]
    assert get_backend("vllm").lora_load_path == "/v1/load_lora_adapter"
    assert {n for n in BACKEND_NAMES if get_backend(n).uses_compile_cache} == {"vllm", "diffusers", "comfyui",
                                                                              "vllm-omni"}
    assert gpu_resource_name("nvidia") == "nvidia.com/gpu" and gpu_resource_name("amd") == "amd.com/gpu"
    assert gpu_resource_name("cpu") is None


# ---- command and args -----------------------------------------------------------------------------

def ctx(**kw: Any) -> LaunchContext:
    kw.setdefault("model_path", "/models/m")
    return LaunchContext(**kw)


ARGS_CASES: list[tuple[str, dict[str, Any], list[str]]] = [
    ("ollama", {}, ["serve"]),
    ("vllm", {}, ["--host", "0.0.0.0", "--port", "8000", "--model", "/models/m"]),
    ("vllm", {"served_name": "org/m", "gpu_count": 2},
     ["--host", "0.0.0.0", "--port", "8000", "--model", "/models/m", "--served-model-name", "org/m",
      "--tensor-parallel-size", "2"]),
    ("vllm", {"config": {"dtype": "bfloat16", "maxModelLen": "8192", "gpuMemoryUtilization": 0.9,
                         "trustRemoteCode": "true", "enforceEager": False, "servedModelName": "chat",
                         "tensorParallelSize": 1}},
     ["--host", "0.0.0.0", "--port", "8000", "--model", "/models/m", "--served-model-name", "chat",
      "--tensor-parallel-size", "1", "--dtype", "bfloat16", "--max-model-len", "8192", "--gpu-memory-utilization",
      "0.9", "--trust-remote-code"]),
    ("vllm", {"config": {"maxNumSeqs": 64, "quantization": "awq", "kvCacheDtype": "fp8", "enablePrefixCaching": False,
                         "enableToolCalling": True, "reasoningParser": "deepseek_r1",
                         "speculativeConfig": {"method": "ngram", "num_speculative_tokens": 4}}},
     ["--host", "0.0.0.0", "--port", "8000", "--model", "/models/m", "--max-num-seqs", "64", "--quantization", "awq",
      "--kv-cache-dtype", "fp8", "--reasoning-parser", "deepseek_r1", "--speculative-config",
      '{"method":"ngram","num_speculative_tokens":4}', "--no-enable-prefix-caching", "--enable-auto-tool-choice",
      "--tool-call-parser", "hermes"]),
    ("vllm", {"config": {"enableToolCalling": "1", "toolCallParser": "llama3_json", "extraArgs": "--seed 7"},
              "kv_block_size": 16, "kv_swap_space_gb": 4, "lora_adapters": 6},
     ["--host", "0.0.0.0", "--port", "8000", "--model", "/models/m", "--enable-auto-tool-choice",
      "--tool-call-parser", "llama3_json", "--block-size", "16", "--swap-space", "4", "--enable-lora",
      "--max-loras", "6", "--seed", "7"]),
    ("vllm", {"lora_adapters": 1, "config": {"swapSpace": 2}},
     ["--host", "0.0.0.0", "--port", "8000", "--model", "/models/m", "--swap-space", "2", "--enable-lora",
      "--max-loras", "4"]),
    ("vllm-omni", {"lora_adapters": 2}, ["--host", "0.0.0.0", "--port", "8000", "--model", "/models/m"]),
    ("mlc-llm", {}, ["/models/m", "--host", "0.0.0.0", "--port", "8000"]),
    ("mlc-llm", {"config": {"mode": "server", "modelLibPath": "/models/m/lib.so", "prefillChunkSize": 2048,
                            "gpuMemoryUtilization": "0.85", "contextWindowSize": 8192, "overridesRaw": "a=1;"},
                 "gpu_count": 2},
     ["/models/m", "--host", "0.0.0.0", "--port", "8000", "--mode", "server", "--model-lib", "/models/m/lib.so",
      "--overrides", "prefill_chunk_size=2048;gpu_memory_utilization=0.85;context_window_size=8192;"
                     "tensor_parallel_shards=2;a=1"]),
    ("llamacpp", {"model_path": "/models/m/q4.gguf"},
     ["--host", "0.0.0.0", "--port", "8080", "--model", "/models/m/q4.gguf", "--n-gpu-layers", "999"]),
    ("llamacpp", {"model_path": "/models/m/q4.gguf", "vendor": "cpu", "served_name": "smol",
                  "config": {"nGPULayers": 20, "contextSize": 4096, "threads": "4", "jinja": True, "metrics": "yes",
                             "flashAttention": True, "mmproj": "mm.gguf", "fitOff": True}},
     ["--host", "0.0.0.0", "--port", "8080", "--model", "/models/m/q4.gguf", "--alias", "smol", "--n-gpu-layers", "0",
      "--ctx-size", "4096", "--threads", "4", "--jinja", "--metrics", "--flash-attn", "on", "--mmproj",
      "/models/m/mm.gguf", "--fit", "off"]),
    ("llamacpp", {"config": {"nGPULayers": 20, "flashAttention": "auto", "mmproj": "/abs/mm.gguf", "parallel": 4,
                             "cacheTypeK": "q8_0", "reasoningBudget": 0}},
     ["--host", "0.0.0.0", "--port", "8080", "--model", "/models/m", "--n-gpu-layers", "20", "--parallel", "4",
      "--cache-type-k", "q8_0", "--reasoning-budget", "0", "--flash-attn", "auto", "--mmproj", "/abs/mm.gguf"]),
    ("diffusers", {"config": {"numInferenceSteps": 30}}, []),
    ("comfyui", {}, ["--listen", "0.0.0.0", "--port", "8188", "--enable-cors-header"]),
    ("comfyui", {"config": {"lowVram": True, "extraModelPathsConfig": "/models/extra.yaml"}},
     ["--listen", "0.0.0.0", "--port", "8188", "--enable-cors-header", "--extra-model-paths-config",
      "/models/extra.yaml", "--lowvram"]),
]


@pytest.mark.parametrize(("name", "kw", "want"), ARGS_CASES, ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(ARGS_CASES)])
def test_args(name, kw, want):
    assert get_backend(name).args(ctx(**kw)) == want


@pytest.mark.parametrize(("name", "config", "want"), [
    ("ollama", {}, []),
    ("vllm", {}, ["python3", "-m", "vllm.entrypoints.openai.api_server"]),
    ("mlc-llm", {}, ["python", "-m", "mlc_llm", "serve"]),
    ("llamacpp", {}, []),
    ("llamacpp", {"command": "/opt/src/llama.cpp/build/bin/llama-server"}, ["/opt/src/llama.cpp/build/bin/llama-server"]),
    ("comfyui", {}, ["python", "main.py"]),
    ("vllm", {"command": ["vllm", "serve"]}, ["vllm", "serve"]),
])
def test_command(name, config, want):
    assert get_backend(name).command(ctx(config=config)) == want


def test_env():
    assert get_backend("ollama").env(ctx(config={"keepAlive": "10m", "numParallel": 2, "flashAttention": True})) == {
        "OLLAMA_HOST": "0.0.0.0", "OLLAMA_KEEP_ALIVE": "10m", "OLLAMA_NUM_PARALLEL": "2", "OLLAMA_FLASH_ATTENTION": "1"}
    assert get_backend("vllm").env(ctx()) == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    env = get_backend("vllm").env(ctx(vendor="amd", arch="gfx1100", compile_cache=True,
                                      config={"hipVisibleDevices": "0", "env": {"VLLM_LOGGING_LEVEL": "DEBUG"}}))
    assert env["HSA_OVERRIDE_GFX_VERSION"] == "11.0.0" and env["PYTORCH_ROCM_ARCH"] == "gfx1100"
    assert env["VLLM_USE_TRITON_FLASH_ATTN"] == "0" and env["HIP_VISIBLE_DEVICES"] == "0"
    assert env["VLLM_CACHE_ROOT"] == "/cache/compile/vllm" and env["TRITON_CACHE_DIR"] == "/cache/compile/triton"
    assert env["VLLM_LOGGING_LEVEL"] == "DEBUG"
    assert get_backend("vllm").env(ctx(vendor="amd", arch="gfx906"))["HSA_ENABLE_SDMA"] == "0"
    assert "VLLM_USE_TRITON_FLASH_ATTN" not in get_backend("vllm").env(ctx(vendor="amd", arch="gfx942"))
    assert "XDG_CACHE_HOME" not in get_backend("llamacpp").env(ctx(compile_cache=True))
    assert get_backend("mlc-llm").env(ctx()) == {"MLC_GPU_SIZE_BYTES": "24696061952"}
    assert get_backend("mlc-llm").env(ctx(arch="sm_52")) == {"MLC_GPU_SIZE_BYTES": "5000000000",
                                                             "MLC_JIT_POLICY": "READONLY"}
    assert get_backend("mlc-llm").env(ctx(config={"jitPolicy": "ON", "gpuMemoryBytes": 1000}))["MLC_JIT_POLICY"] == "ON"
    d = get_backend("diffusers").env(ctx(source="HF://stabilityai/sdxl", vendor="amd", arch="gfx906",
                                         config={"numInferenceSteps": 30, "guidanceScale": 7.5, "useFp16": "1",
                                                 "cpuOffload": False}))
    assert {k: d[k] for k in ("MODEL_ID", "MODEL", "PORT", "NUM_INFERENCE_STEPS", "GUIDANCE_SCALE", "USE_FP16",
                              "USE_CPU_OFFLOAD", "ENABLE_ATTENTION_SLICING")} == {
        "MODEL_ID": "stabilityai/sdxl", "MODEL": "/models/m", "PORT": "8000", "NUM_INFERENCE_STEPS": "30",
        "GUIDANCE_SCALE": "7.5", "USE_FP16": "1", "USE_CPU_OFFLOAD": "0", "ENABLE_ATTENTION_SLICING": "1"}
    assert "PYTORCH_HIP_ALLOC_CONF" in d
    assert get_backend("comfyui").env(ctx()) == {"COMFYUI_OUTPUT_DIRECTORY": "/output"}


def test_capabilities_and_context_window():
    assert get_backend("vllm").capabilities({}) == Capabilities(tool_calling=True, image_generation=False)
    assert get_backend("llamacpp").capabilities({"jinja": "true", "mmproj": "x"}) == Capabilities(True, True, False)
    assert get_backend("llamacpp").capabilities({}) == Capabilities(False, False, False)
    assert get_backend("diffusers").capabilities({}).image_generation is True
    assert Capabilities(True, None, False).merged(Capabilities(None, True, None)) == Capabilities(True, True, False)
    assert get_backend("vllm").context_window({"maxModelLen": "4096"}) == 4096
    assert get_backend("mlc-llm").context_window({"contextWindowSize": 2048}) == 2048
    assert get_backend("llamacpp").context_window({"contextSize": "x"}) is None
    assert get_backend("ollama").context_window({}) is None


@pytest.mark.parametrize(("raw", "kind", "want"), [
    ("1", ConfigKind.BOOL, True), ("off", ConfigKind.BOOL, False), (0, ConfigKind.BOOL, False),
    ("42", ConfigKind.INT, 42), (42.0, ConfigKind.INT, 42), ("0.5", ConfigKind.FLOAT, 0.5), (2, ConfigKind.FLOAT, 2.0),
    (True, ConfigKind.STR, "true"), (5, ConfigKind.STR, "5"), ({"b": 1, "a": 2}, ConfigKind.JSON, '{"a":2,"b":1}'),
    ("--a 'b c'", ConfigKind.LIST, ["--a", "b c"]), ([1, "x"], ConfigKind.LIST, ["1", "x"]),
    ({"A": 1, "B": True}, ConfigKind.MAP, {"A": "1", "B": "true"}), ("", ConfigKind.INT, None), (None, ConfigKind.STR, None),
])
def test_read_config(raw, kind, want):
    assert read_config({"k": raw}, "k", kind) == want


@pytest.mark.parametrize(("raw", "kind"), [
    ("maybe", ConfigKind.BOOL), (True, ConfigKind.INT), ("4.5", ConfigKind.INT), ("x", ConfigKind.FLOAT),
    ([1], ConfigKind.STR), ({"a": [1]}, ConfigKind.MAP), ({"a": 1}, ConfigKind.LIST), ("'open", ConfigKind.LIST),
])
def test_read_config_errors(raw, kind):
    with pytest.raises(ConfigError) as e:
        read_config({"k": raw}, "k", kind)
    assert e.value.key.startswith("k") and e.value.reason == "InvalidConfig"


# ---- images ---------------------------------------------------------------------------------------

REG = {"DEFAULT_IMAGE_REGISTRY": "registry.example.lan/"}
IMAGE_CASES: list[tuple[str, str, str, dict[str, str], str, str, str, bool]] = [
    # backend, vendor, arch, env -> image, variant, origin, generic
    ("vllm", "nvidia", "sm_86", {}, "vllm/vllm-openai:latest", "default", "builtin", False),
    ("vllm", "amd", "gfx942", {}, "rocm/vllm:latest", "amd", "builtin", False),
    ("vllm", "amd", "gfx1100", {}, "rocm/vllm:latest", "amd", "builtin", True),
    ("vllm", "amd", "gfx1101", REG, "registry.example.lan/flexinfer/vllm:rocm-gfx1100", "gfx1100", "registry", False),
    ("vllm", "amd", "gfx906", REG, "registry.example.lan/flexinfer/vllm:rocm-gfx906", "gfx906", "registry", False),
    ("vllm", "amd", "gfx1100", {"DEFAULT_VLLM_IMAGE_GFX1100": "me/vllm:rdna3", **REG}, "me/vllm:rdna3", "gfx1100",
     "env", False),
    ("vllm", "amd", "gfx1100", {"DEFAULT_VLLM_IMAGE_AMD": "me/vllm:rocm"}, "me/vllm:rocm", "amd", "env", True),
    ("vllm", "nvidia", "", {"DEFAULT_VLLM_IMAGE": "me/vllm:cuda"}, "me/vllm:cuda", "default", "env", False),
    ("ollama", "amd", "", {}, "ollama/ollama:rocm", "amd", "builtin", False),
    ("ollama", "cpu", "", {}, "ollama/ollama:latest", "default", "builtin", True),
    ("ollama", "nvidia", "", {"DEFAULT_BACKEND_IMAGE": "legacy/ollama"}, "legacy/ollama", "default", "env", False),
    ("ollama", "nvidia", "", {"DEFAULT_BACKEND_IMAGE_NVIDIA": "nv/ollama", "DEFAULT_BACKEND_IMAGE": "x"}, "nv/ollama",
     "default", "env", False),
    ("ollama", "amd", "", {"DEFAULT_OLLAMA_IMAGE_AMD": "new", "DEFAULT_BACKEND_IMAGE_AMD": "old"}, "new", "amd", "env",
     False),
    ("llamacpp", "cpu", "", {}, "ghcr.io/ggml-org/llama.cpp:server", "cpu", "builtin", False),
    ("llamacpp", "nvidia", "sm_89", {}, "ghcr.io/ggml-org/llama.cpp:server-cuda", "default", "builtin", False),
    ("llamacpp", "nvidia", "sm_52", {}, "ghcr.io/ggml-org/llama.cpp:server-cuda", "default", "builtin", True),
    ("llamacpp", "nvidia", "sm_52", REG, "registry.example.lan/flexinfer/llamacpp:cuda-maxwell", "maxwell", "registry",
     False),
    ("llamacpp", "amd", "gfx906", REG, "registry.example.lan/library/llamacpp:rocm-gfx906-patched", "gfx906",
     "registry", False),
    ("llamacpp", "amd", "gfx90a", {}, "ghcr.io/ggml-org/llama.cpp:server-rocm", "amd", "builtin", False),
    ("mlc-llm", "nvidia", "sm_52", {"DEFAULT_MLC_IMAGE_MAXWELL": "me/mlc:maxwell"}, "me/mlc:maxwell", "maxwell", "env",
     False),
    ("mlc-llm", "amd", "", {}, "ghcr.io/mlc-ai/mlc-llm:rocm", "amd", "builtin", False),
    ("diffusers", "nvidia", "", REG, "registry.example.lan/library/diffusers-api:cuda", "default", "registry", False),
    ("comfyui", "nvidia", "", {}, "comfyanonymous/comfyui:latest", "default", "builtin", False),
    ("vllm-omni", "amd", "", {}, "rocm/vllm:latest", "amd", "builtin", False),
    ("vllm-omni", "amd", "", REG, "registry.example.lan/library/vllm-api:rocm-navi", "amd", "registry", False),
    ("vllm-omni", "nvidia", "", {"DEFAULT_VLLM_OMNI_IMAGE": "me/omni"}, "me/omni", "default", "env", False),
]


@pytest.mark.parametrize(("name", "vendor", "arch", "env", "image", "variant", "origin", "generic"), IMAGE_CASES,
                         ids=[f"{c[0]}-{c[1]}-{c[2]}-{i}" for i, c in enumerate(IMAGE_CASES)])
def test_images(name, vendor, arch, env, image, variant, origin, generic):
    got = get_backend(name).image(vendor, arch, env)
    assert (got.image, got.variant, got.origin, got.generic) == (image, variant, origin, generic)


def test_image_not_configured():
    with pytest.raises(ImageNotConfigured) as e:
        get_backend("diffusers").image("nvidia", "sm_89", {})
    assert e.value.reason == "ImageNotConfigured" and "DEFAULT_DIFFUSERS_IMAGE" in str(e.value)
    with pytest.raises(ImageNotConfigured, match="DEFAULT_COMFYUI_IMAGE_AMD"):
        get_backend("comfyui").image("amd", "", {})


def test_image_env_defaults_to_the_process_environment(monkeypatch):
    monkeypatch.setenv("DEFAULT_VLLM_IMAGE", "from/process:env")
    assert get_backend("vllm").image("nvidia").image == "from/process:env"
    assert get_backend("vllm").image("nvidia", env={}).image == "vllm/vllm-openai:latest"


def test_only_images_module_reads_the_environment():
    for f in (ROOT / "flexinfer" / "backends").glob("*.py"):
        if f.name != "images.py":
            assert "os.environ" not in f.read_text() and "getenv" not in f.read_text(), f


# ---- compatibility ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("backend", "arch", "level"), [
    ("vllm", "sm_52", Support.UNSUPPORTED), ("vllm", "sm_50", Support.UNSUPPORTED), ("vllm", "sm_86", Support.FULL),
    ("vllm", "gfx1100", Support.FULL), ("vllm", "gfx906", Support.FULL), ("vllm-omni", "sm_53", Support.UNSUPPORTED),
    ("llamacpp", "sm_52", Support.FULL), ("ollama", "sm_52", Support.FULL), ("mlc-llm", "gfx906", Support.EXPERIMENTAL),
    ("mlc-llm", "sm_52", Support.FULL), ("diffusers", "gfx906", Support.EXPERIMENTAL),
    ("diffusers", "sm_52", Support.UNSUPPORTED), ("comfyui", "sm_61", Support.FULL),
    ("comfyui", "SM_52", Support.UNSUPPORTED), ("vllm", "", Support.FULL), ("unknown", "sm_52", Support.FULL),
])
def test_support_level(backend, arch, level):
    assert support_level(backend, arch) is level


def test_vram_table():
    assert (arch_vram_mb("gfx1100"), arch_vram_mb("gfx906"), arch_vram_mb("sm_52"), arch_vram_mb("sm_89")) == (
        24576, 16384, 4096, None)
    assert vendor_of_arch("sm_86") == "nvidia" and vendor_of_arch("gfx1100") == "amd" and vendor_of_arch("") is None


@pytest.mark.parametrize(("estimate", "arch", "vram", "reason"), [
    (None, "gfx1100", None, None), (19000, "gfx1100", None, None),
    (20000, "gfx1100", None, "VRAMPressure"),  # 81 %
    (23500, "gfx1100", None, "VRAMInsufficient"),  # 95.6 %
    (23347, "gfx1100", None, "VRAMPressure"),  # exactly 95 % is still allowed
    (4000, "sm_52", None, "VRAMInsufficient"),
    (20000, "sm_89", None, None),  # unknown arch, unknown VRAM: no check
    (20000, "sm_89", 24576, "VRAMPressure"),
    (23500, "gfx1100", 49152, None),  # measured VRAM wins over the table (W7900)
])
def test_check_vram(estimate, arch, vram, reason):
    f = check_vram(estimate, arch, vram)
    assert (f.reason if f else None) == reason
    if f:
        assert f.level == ("error" if reason == "VRAMInsufficient" else "warning")


@pytest.mark.parametrize(("backend", "vendor", "arch", "kw", "want"), [
    ("vllm", "nvidia", "sm_86", {}, []),
    ("vllm", "nvidia", "sm_52", {}, [("error", "BackendUnsupported")]),
    ("vllm", "cpu", "", {}, [("error", "BackendUnsupported")]),
    ("llamacpp", "cpu", "", {"vram_estimate_mb": 999999}, []),
    ("diffusers", "amd", "gfx906", {"generic_image": True}, [("warning", "ExperimentalGPUSupport")]),
    ("diffusers", "amd", "gfx906", {}, []),
    ("llamacpp", "nvidia", "sm_52", {"source": "HF://org/model-f16-GGUF"}, [("error", "BackendUnsupported")]),
    ("mlc-llm", "nvidia", "sm_52", {"source": "HF://mlc-ai/x-q4f32_1-MLC"}, [("error", "BackendUnsupported")]),
    ("mlc-llm", "nvidia", "sm_52", {"source": "HF://mlc-ai/x-q4f32_1-MLC", "config": {"modelLibPath": "/m/lib.so"}},
     []),
    ("mlc-llm", "nvidia", "sm_52", {"source": "file:///models/x", "vram_estimate_mb": 3500},
     [("warning", "VRAMPressure")]),
    ("vllm", "amd", "gfx1100", {"vram_estimate_mb": 24000}, [("error", "VRAMInsufficient")]),
])
def test_check_placement(backend, vendor, arch, kw, want):
    got = check_placement(get_backend(backend), vendor, arch, **kw)
    assert [(f.level, f.reason) for f in got] == want


def test_pure_modules_import_no_kubernetes_client():
    code = ("import sys, flexinfer.backends, flexinfer.api, flexinfer.api.generate; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('kopf', 'kubernetes', 'kubernetes_asyncio')]; "
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_backend_validates_its_config_keys():
    for name, b in BACKENDS.items():
        b.validate_config({})
        with pytest.raises(ConfigError):
            b.validate_config({"extraArgs": {"not": "a list"}})
        assert set(b.config_keys) <= set(b.all_config_keys()), name
