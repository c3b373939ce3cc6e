"""The backend registry: canonical names, aliases and ``get_backend``.

Owns: the one table of backend instances and the alias map (``llama.cpp`` -> ``llamacpp``, ``mlc`` ->
``mlc-llm``, ``comfy`` -> ``comfyui``, ``vllm-diffusion`` -> ``vllm-omni``, ...). Names are matched
case-insensitively after trimming. A duplicate name or alias is a programming error and fails at
import, the way the original manager refused to start.

Must not: import Kubernetes clients or CRD code.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from flexinfer.backends.base import Backend
from flexinfer.backends.imagegen import ComfyUI, Diffusers, VLLMOmni
from flexinfer.backends.llm import MLCLLM, VLLM, LlamaCpp, Ollama


class UnknownBackendError(LookupError):
    """No backend has this name or alias."""

    reason = "UnknownBackend"

    def __init__(self, name: str) -> None:
        super().__init__(f"unknown backend {name!r}; known: {', '.join(BACKEND_NAMES)}")
        self.name = name


def _build(backends: tuple[Backend, ...]) -> tuple[Mapping[str, Backend], Mapping[str, str]]:
    by_name: dict[str, Backend] = {}
    alias: dict[str, str] = {}
    for b in backends:
        for n in (b.name, *b.aliases):
            key = n.lower()
            if key in alias:
                raise RuntimeError(f"backend name {n!r} registered twice ({alias[key]} and {b.name})")
            alias[key] = b.name
        by_name[b.name] = b
    return MappingProxyType(by_name), MappingProxyType(alias)


#: canonical name -> backend; in the order the original listed them
BACKENDS, ALIASES = _build((Ollama(), VLLM(), MLCLLM(), LlamaCpp(), Diffusers(), ComfyUI(), VLLMOmni()))
#: canonical names
BACKEND_NAMES: tuple[str, ...] = tuple(BACKENDS)
#: every accepted spelling (canonical names and aliases), sorted
ACCEPTED_NAMES: tuple[str, ...] = tuple(sorted(ALIASES))


def canonical_name(name: str) -> str:
    """The canonical name for ``name`` or an alias of it; raises ``UnknownBackendError``."""
    try:
        return ALIASES[name.strip().lower()]
    except KeyError:
        raise UnknownBackendError(name) from None


def get_backend(name: str) -> Backend:
    """The backend called ``name`` (aliases resolved); raises ``UnknownBackendError``."""
    return BACKENDS[canonical_name(name)]
