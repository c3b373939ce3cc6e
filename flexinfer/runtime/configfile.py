"""Typed YAML config files: read with line marks, convert to msgspec types, report ``file:line: path``.

Owns: reading a YAML file with PyYAML's node API (so every value keeps its line), converting it to
``msgspec.Struct`` types with ``forbid_unknown_fields`` (one error per model entry, not only the
first), turning each problem into ``FILE:LINE: models[0].args: message`` with the closest known key
suggested for a misspelt one (:mod:`difflib`), the JSON Schema of a type, and macro expansion
(``${env.NAME}``, the user's ``macros:``; unknown ``${...}`` is an error, ``$${`` is a literal ``${``).
Must not: know what a model is, start anything, or touch the network; the formats live in
:mod:`flexinfer.runtime.localconfig` and :mod:`flexinfer.runtime.static`.
"""

from __future__ import annotations

import difflib
import os
import re
import shlex
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgspec
import yaml

T = TypeVar("T")
Path = tuple[str | int, ...]

MACRO_RE = re.compile(r"\$\$|\$\{([^}]*)\}")
MACRO_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
_AT_RE = re.compile(r"^(?P<msg>.*) - at `\$(?P<path>[^`]*)`$", re.S)
_STEP_RE = re.compile(r"\.([^.\[]+)|\[(\d+)\]|\[\.\.\.\]")
_UNKNOWN_RE = re.compile(r"^Object contains unknown field `(?P<key>[^`]*)`$")
_MISSING_RE = re.compile(r"^Object missing required field `(?P<key>[^`]*)`$")


class InventoryConfigError(ValueError):
    """The config file is malformed: one line per problem, each ``FILE:LINE: path: message``."""

    def __init__(self, problems: str | list[str]) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(self.problems))


def dotted(path: Path) -> str:
    """``("models", 0, "args")`` -> ``models[0].args``."""
    out = ""
    for step in path:
        out += f"[{step}]" if isinstance(step, int) else (f".{step}" if out else str(step))
    return out


@dataclass
class Source:
    """A parsed YAML file: the plain data and the node tree that knows every value's line."""

    path: str
    data: Any
    node: yaml.Node | None
    problems: list[str] = field(default_factory=list)

    def node_at(self, path: Path, *, key: bool = False) -> yaml.Node | None:
        """The deepest node on ``path`` (the key's node for the last step with ``key``)."""
        node = self.node
        for i, step in enumerate(path):
            nxt: yaml.Node | None = None
            if isinstance(node, yaml.MappingNode) and isinstance(step, str):
                for k, v in node.value:
                    if isinstance(k, yaml.ScalarNode) and k.value == step:
                        nxt = k if key and i == len(path) - 1 else v
            elif isinstance(node, yaml.SequenceNode) and isinstance(step, int) and step < len(node.value):
                nxt = node.value[step]
            if nxt is None:
                break
            node = nxt
        return node

    def line(self, path: Path, *, key: bool = False) -> int:
        node = self.node_at(path, key=key)
        return node.start_mark.line + 1 if node is not None else 1

    def where(self, path: Path, *, key: bool = False) -> str:
        """``FILE:LINE: path`` (``FILE:LINE`` for the whole document)."""
        head = f"{self.path}:{self.line(path, key=key)}"
        return f"{head}: {dotted(path)}" if path else head

    def error(self, path: Path, message: str, *, key: bool = False) -> None:
        self.problems.append(f"{self.where(path, key=key)}: {message}")

    def raise_problems(self) -> None:
        if self.problems:
            raise InventoryConfigError(self.problems)


def read_yaml(path: str) -> Source:
    """The file's data and node tree; unreadable or invalid YAML and duplicate keys are errors."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise InventoryConfigError(f"cannot read {path}: {exc.strerror}") from None
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f"{path}:{mark.line + 1}" if mark is not None else path
        raise InventoryConfigError(f"{at}: not valid YAML: {getattr(exc, 'problem', None) or exc}") from None
    finally:
        loader.dispose()
    src = Source(path, data, node)
    _duplicate_keys(src, node, ())
    src.raise_problems()
    return src


def _duplicate_keys(src: Source, node: yaml.Node | None, path: Path) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for k, v in node.value:
            name = k.value if isinstance(k, yaml.ScalarNode) else "?"
            if name in seen:
                src.problems.append(f"{src.path}:{k.start_mark.line + 1}: {dotted((*path, name))}: "
                                    "given twice (YAML keeps only the last)")
            seen.add(name)
            _duplicate_keys(src, v, (*path, name))
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _duplicate_keys(src, item, (*path, i))


def _known_keys(info: msgspec.inspect.Type, steps: Iterable[str | int | None]) -> list[str]:
    """The field names of the struct at the end of ``steps`` (None: a dict's value)."""
    for step in (*steps, "<end>"):
        while isinstance(info, msgspec.inspect.Metadata):  # Annotated[..., Meta(...)]
            info = info.type
        while isinstance(info, msgspec.inspect.UnionType):  # the struct (or list) member of a union
            want = msgspec.inspect.ListType if isinstance(step, int) else (
                msgspec.inspect.StructType if step == "<end>" or isinstance(step, str) else msgspec.inspect.DictType)
            members = [t for t in info.types if isinstance(t, want)]
            if not members:
                return []
            info = members[0]
            while isinstance(info, msgspec.inspect.Metadata):
                info = info.type
        if step == "<end>":
            break
        if isinstance(info, msgspec.inspect.StructType) and isinstance(step, str):
            match = [f.type for f in info.fields if f.encode_name == step]
            if not match:
                return []
            info = match[0]
        elif isinstance(info, msgspec.inspect.ListType) and isinstance(step, int):
            info = info.item_type
        elif isinstance(info, msgspec.inspect.DictType) and step is None:
            info = info.value_type
        else:
            return []
    return [f.encode_name for f in info.fields] if isinstance(info, msgspec.inspect.StructType) else []


def _value_at(data: Any, path: Path) -> Any:
    for step in path:
        try:
            data = data[step]
        except (KeyError, IndexError, TypeError):
            return None
    return data


def describe(src: Source, exc: msgspec.ValidationError, type_: Any, base: Path = ()) -> str:
    """One msgspec validation error as ``FILE:LINE: path: message`` (with a key suggestion)."""
    m = _AT_RE.match(str(exc))
    msg, raw = (m.group("msg"), m.group("path")) if m else (str(exc), "")
    steps: list[str | int | None] = []
    for s in _STEP_RE.finditer(raw):
        steps.append(s.group(1) if s.group(1) is not None else (int(s.group(2)) if s.group(2) else None))
    path: Path = (*base, *(s for s in steps if s is not None))
    if None in steps:  # a dict's value: msgspec does not say which key; point at the mapping
        path = (*base, *steps[:steps.index(None)])  # type: ignore[arg-type]
    if u := _UNKNOWN_RE.match(msg):
        key = u.group("key")
        known = _known_keys(msgspec.inspect.type_info(type_), steps)
        close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else (f" (known: {', '.join(known)})" if known else "")
        return f"{src.where((*path, key), key=True)}: unknown key {key!r}{hint}"
    if r := _MISSING_RE.match(msg):
        return f"{src.where(path)}: missing required key {r.group('key')!r}"
    value = _value_at(src.data, path)
    if value is not None and not isinstance(value, dict | list):
        msg += f" {value!r}" if ", got" in msg else f", got {value!r}"
    return f"{src.where(path)}: {msg.replace('`', '')}"


def convert(src: Source, data: Any, type_: type[T], base: Path = ()) -> T | None:
    """``data`` (found at ``base`` of ``src``) as ``type_``; None and one problem recorded on failure."""
    try:
        return msgspec.convert(data, type_)
    except msgspec.ValidationError as exc:
        src.problems.append(describe(src, exc, type_, base))
        return None


def schema(type_: Any, title: str) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a config type, as committed under ``schemas/``."""
    out = msgspec.json.schema(type_)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": title, **out}


def suggest(word: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(known), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


Resolver = Callable[[str], str | None]


def expand(text: str, resolve: Resolver, keep: frozenset[str] = frozenset(),
           only_in: tuple[frozenset[str], str] = (frozenset(), "")) -> tuple[str, list[str]]:
    """Replace ``${env.NAME}`` and the macros ``resolve`` knows; names in ``keep`` stay as they are
    (the built-ins filled in at start); names in ``only_in[0]`` are refused here with the note
    ``only_in[1]``. Returns the text and the problems (unknown or unset names)."""
    problems: list[str] = []

    def sub(m: re.Match[str]) -> str:
        name = m.group(1)
        if name is None:
            return "$$"  # an escaped dollar, turned into one at the end
        if name in keep:
            return m.group(0)
        if name.startswith("env."):
            var = name[4:]
            if var not in os.environ:
                problems.append(f"environment variable {var!r} is not set (used as ${{{name}}})")
                return ""
            return os.environ[var].replace("$", "$$")
        value = resolve(name)
        if value is None and name in only_in[0]:
            problems.append(f"the built-in macro ${{{name}}} {only_in[1]}")
            return ""
        if value is None:
            known = sorted(keep)
            hint = suggest(name, known)
            if not hint and MACRO_NAME_RE.fullmatch(name):
                hint = f"; for the environment variable write ${{env.{name}}}"
            problems.append(f"unknown macro ${{{name}}}{hint}")
            return ""
        return value  # a user macro's text is already expanded ($$ and the kept built-ins stay)

    return MACRO_RE.sub(sub, text), problems


def unescape(value: Any) -> Any:
    """``$$`` -> ``$`` in every string of a value (for strings that no later step expands)."""
    if isinstance(value, str):
        return value.replace("$$", "$")
    if isinstance(value, list):
        return [unescape(v) for v in value]
    if isinstance(value, dict):
        return {k: unescape(v) for k, v in value.items()}
    return value


def expand_tree(src: Source, value: Any, path: Path, resolve: Resolver, keep: frozenset[str] = frozenset(),
                only_in: tuple[frozenset[str], str] = (frozenset(), "")) -> Any:
    """``expand`` on every string of a YAML value (mapping keys are left alone); problems go to src."""
    if isinstance(value, str):
        out, problems = expand(value, resolve, keep, only_in)
        for p in problems:
            src.error(path, p)
        return out
    if isinstance(value, list):
        return [expand_tree(src, v, (*path, i), resolve, keep, only_in) for i, v in enumerate(value)]
    if isinstance(value, dict):
        return {k: expand_tree(src, v, (*path, k), resolve, keep, only_in) for k, v in value.items()}
    return value


def user_macros(src: Source, raw: Any, reserved: frozenset[str]) -> dict[str, str]:
    """The top-level ``macros:`` (name -> text); a macro may use ``${env.X}``, earlier macros and the
    ``reserved`` built-ins (left in place for the start)."""
    out: dict[str, str] = {}
    if raw is None:
        return out
    if not isinstance(raw, Mapping):
        src.error(("macros",), "must be a mapping of NAME: value")
        return out
    for name, value in raw.items():
        path: Path = ("macros", str(name))
        if not isinstance(name, str) or not MACRO_NAME_RE.fullmatch(name):
            src.error(path, "a macro name is letters, digits, _ and - (starting with a letter or _)", key=True)
            continue
        if name in reserved:
            src.error(path, f"{name} is a built-in macro and cannot be redefined", key=True)
            continue
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            src.error(path, "a macro's value must be a string or a number")
            continue
        text, problems = expand(str(value), out.get, reserved)  # the built-ins are filled in later
        for p in problems:
            src.error(path, p)
        out[name] = text
    return out


def shell_words(text: str) -> list[str]:
    """A command written as one string: shell words (quotes), ``#`` comment lines and trailing
    comments, line breaks and ``\\`` continuations allowed (llama-swap's ``cmd``)."""
    lines = [ln for ln in text.replace("\\\n", " ").splitlines() if not ln.strip().startswith("#")]
    return shlex.split("\n".join(lines), comments=True)
