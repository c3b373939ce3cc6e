"""Container image choice per backend, vendor and GPU architecture.

Owns: the image variants (``default`` = CUDA/generic, ``cpu``, ``amd``, ``gfx1100``, ``gfx906``,
``maxwell``), the order in which they are tried, and the ``DEFAULT_<B>_IMAGE[_VARIANT]`` overrides.
This is the ONLY module of ``flexinfer.backends`` that reads the process environment, and it does so
only through ``environ(env)`` when the caller passes no mapping.

Images that only ever existed in the original's private registry are kept as *registry paths*: they
are used when ``DEFAULT_IMAGE_REGISTRY`` names a registry that mirrors them, and otherwise the next,
generic variant is used (``ImageChoice.generic`` tells the operator to warn).

Must not: import Kubernetes clients or CRD code.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

#: Prefix for the registry paths below, e.g. ``registry.example.lan``; unset: registry paths unused.
REGISTRY_ENV = "DEFAULT_IMAGE_REGISTRY"


@dataclass(frozen=True, slots=True)
class ImageDefault:
    """The built-in image of one variant: a public reference and/or a path in a private registry."""

    public: str | None = None
    registry_path: str | None = None


ImageTable = Mapping[str, ImageDefault]


@dataclass(frozen=True, slots=True)
class ImageChoice:
    """The image picked, the variant it belongs to and where it came from."""

    image: str
    variant: str
    origin: Literal["env", "registry", "builtin"]
    #: an arch-specific image was wanted but a generic one is used
    generic: bool = False


class ImageNotConfigured(LookupError):
    """No image is known for the backend on this vendor/arch; an env override is needed."""

    reason = "ImageNotConfigured"


def environ(env: Mapping[str, str] | None = None) -> Mapping[str, str]:
    """``env``, or the process environment when None: the one place backends read it."""
    return os.environ if env is None else env


def variant_chain(vendor: str, arch: str) -> list[str]:
    """Variants to try, most specific first."""
    arch = arch.lower()
    if vendor == "amd":
        chain = []
        if arch.startswith("gfx110"):
            chain.append("gfx1100")
        elif arch == "gfx906":
            chain.append("gfx906")
        return [*chain, "amd"]
    if vendor == "cpu":
        return ["cpu", "default"]
    if arch.startswith("sm_5"):
        return ["maxwell", "default"]
    return ["default"]


def env_var(env_name: str, variant: str) -> str:
    """``DEFAULT_VLLM_IMAGE`` for the default variant, ``DEFAULT_VLLM_IMAGE_GFX1100`` otherwise."""
    base = f"DEFAULT_{env_name}_IMAGE"
    return base if variant == "default" else f"{base}_{variant.upper()}"


_LEGACY_SUFFIX = {"default": ("_NVIDIA", ""), "amd": ("_AMD",), "cpu": ("",), "maxwell": ("_NVIDIA", "")}


def resolve_image(
    env_name: str,
    table: ImageTable,
    vendor: str,
    arch: str = "",
    env: Mapping[str, str] | None = None,
    *,
    legacy_env: str | None = None,
) -> ImageChoice:
    """Pick the image: per variant, the env override, then the registry path, then the public image.

    ``legacy_env`` (e.g. ``DEFAULT_BACKEND_IMAGE`` for Ollama) is consulted after the backend's own
    variable, with the original's ``_NVIDIA``/``_AMD`` suffixes.
    """
    e = environ(env)
    registry = e.get(REGISTRY_ENV, "").strip().rstrip("/")
    chain = variant_chain(vendor, arch)
    for i, variant in enumerate(chain):
        generic = i > 0
        names = [env_var(env_name, variant)]
        if legacy_env:
            names += [legacy_env + s for s in _LEGACY_SUFFIX.get(variant, ())]
        for name in names:
            value = e.get(name, "").strip()
            if value:
                return ImageChoice(value, variant, "env", generic)
        d = table.get(variant)
        if d is None:
            continue
        if d.registry_path and registry:
            return ImageChoice(f"{registry}/{d.registry_path}", variant, "registry", generic)
        if d.public:
            return ImageChoice(d.public, variant, "builtin", generic)
    raise ImageNotConfigured(
        f"no image for backend {env_name.lower()} on {vendor} {arch or '(any arch)'}: set "
        f"{env_var(env_name, chain[0])} or {REGISTRY_ENV}"
    )
