"""Validate and default a value against one of our structural schemas, as the API server would.

Owns: the runtime check that typed views run on ``spec`` (strict: the first problem raises
``SpecError("InvalidSpec", "<path>: <problem>")``) and on ``status`` (lenient: bad fields are
dropped). It applies ``default``s, prunes unknown fields (except under
``x-kubernetes-preserve-unknown-fields``), treats ``null`` as absent, checks types, enums, ranges,
lengths, patterns, list uniqueness, and evaluates each CEL rule through its registered Python
predicate (``schema.CEL_CHECKS``). The API server does all this for real clusters; the operator
still needs it for objects it did not get through one (kmock, tests, old objects).

Must not: import kind modules or third-party validators (jsonschema is a test dependency only).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from flexinfer.api.common import INVALID_SPEC, SpecError, parse_time
from flexinfer.api.schema import CEL_CHECKS, Schema


class _Drop(Exception):
    """Lenient mode: drop the offending field."""


@lru_cache(maxsize=256)
def _regex(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


def _type_name(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list | tuple):
        return "array"
    if isinstance(v, Mapping):
        return "object"
    return type(v).__name__


class _Walker:
    def __init__(self, lenient: bool) -> None:
        self.lenient = lenient

    def fail(self, path: str, msg: str) -> Any:
        if self.lenient:
            raise _Drop(path)
        raise SpecError(INVALID_SPEC, f"{path}: {msg}")

    def walk(self, s: Schema, v: Any, path: str) -> Any:
        if s.get("x-kubernetes-int-or-string"):
            if isinstance(v, bool) or not isinstance(v, int | str):
                return self.fail(path, f"expected an integer or a string, got {_type_name(v)}")
            if isinstance(v, str) and "pattern" in s and not _regex(s["pattern"]).search(v):
                return self.fail(path, f"{v!r} is not a valid value")
            self.rules(s, v, path)
            return v
        t = s.get("type")
        out: Any
        if t == "object":
            out = self.walk_object(s, v, path)
        elif t == "array":
            out = self.walk_array(s, v, path)
        elif t == "string":
            out = self.walk_string(s, v, path)
        elif t in ("integer", "number"):
            out = self.walk_number(s, v, path, t)
        elif t == "boolean":
            if not isinstance(v, bool):
                return self.fail(path, f"expected a boolean, got {_type_name(v)}")
            out = v
        else:  # untyped: only under preserve-unknown-fields
            out = copy.deepcopy(v)
        self.rules(s, out, path)
        return out

    def rules(self, s: Schema, v: Any, path: str) -> None:
        for r in s.get("x-kubernetes-validations", ()):
            check = CEL_CHECKS.get(r["rule"])
            if check is None:
                raise KeyError(f"no Python predicate registered for CEL rule {r['rule']!r}")
            if not check(v):
                where = path + (r["fieldPath"] if r.get("fieldPath") else "")
                self.fail(where, r["message"])

    def walk_object(self, s: Schema, v: Any, path: str) -> dict[str, Any]:
        if not isinstance(v, Mapping):
            return self.fail(path, f"expected an object, got {_type_name(v)}")  # type: ignore[no-any-return]
        props: Mapping[str, Schema] = s.get("properties") or {}
        addl = s.get("additionalProperties")
        preserve = s.get("x-kubernetes-preserve-unknown-fields", False)
        out: dict[str, Any] = {}
        for k, val in v.items():
            sub: Schema | None = props.get(k)
            if sub is None:
                if isinstance(addl, dict):
                    sub = addl
                elif preserve:
                    out[k] = copy.deepcopy(val)
                    continue
                else:
                    continue  # pruned, as the API server does
            if val is None and not sub.get("nullable"):
                continue  # null means absent; a default may apply below
            try:
                out[k] = self.walk(sub, val, f"{path}.{k}")
            except _Drop:
                continue
        for k, sub in props.items():
            if k not in out and "default" in sub:
                try:
                    out[k] = self.walk(sub, copy.deepcopy(sub["default"]), f"{path}.{k}")
                except _Drop:
                    pass
        for k in s.get("required", ()):
            if k not in out:
                self.fail(f"{path}.{k}", "required")
        n = len(out)
        if "maxProperties" in s and n > s["maxProperties"]:
            self.fail(path, f"at most {s['maxProperties']} entries, got {n}")
        if "minProperties" in s and n < s["minProperties"]:
            self.fail(path, f"at least {s['minProperties']} entries, got {n}")
        return out

    def walk_array(self, s: Schema, v: Any, path: str) -> list[Any]:
        if not isinstance(v, list | tuple):
            return self.fail(path, f"expected an array, got {_type_name(v)}")  # type: ignore[no-any-return]
        if "maxItems" in s and len(v) > s["maxItems"]:
            self.fail(path, f"at most {s['maxItems']} items, got {len(v)}")
        if "minItems" in s and len(v) < s["minItems"]:
            self.fail(path, f"at least {s['minItems']} items, got {len(v)}")
        items = s.get("items") or {}
        out = []
        for i, x in enumerate(v):
            try:
                out.append(self.walk(items, x, f"{path}[{i}]"))
            except _Drop:
                continue
        lt = s.get("x-kubernetes-list-type")
        if lt == "set":
            seen: list[Any] = []
            for i, x in enumerate(out):
                if x in seen:
                    self.fail(f"{path}[{i}]", f"duplicate value {x!r}")
                seen.append(x)
        elif lt == "map":
            keys = s.get("x-kubernetes-list-map-keys", ())
            seen_keys: set[tuple[Any, ...]] = set()
            for i, x in enumerate(out):
                key = tuple(x.get(k) for k in keys)
                if key in seen_keys:
                    self.fail(f"{path}[{i}]", f"duplicate entry for {', '.join(keys)}={'/'.join(map(str, key))}")
                seen_keys.add(key)
        return out

    def walk_string(self, s: Schema, v: Any, path: str) -> str:
        if not isinstance(v, str):
            return self.fail(path, f"expected a string, got {_type_name(v)}")  # type: ignore[no-any-return]
        if "enum" in s and v not in s["enum"]:
            self.fail(path, f"{v!r} is not one of {', '.join(s['enum'])}")
        if "minLength" in s and len(v) < s["minLength"]:
            self.fail(path, "must not be empty" if s["minLength"] == 1 else f"shorter than {s['minLength']}")
        if "maxLength" in s and len(v) > s["maxLength"]:
            self.fail(path, f"longer than {s['maxLength']} characters")
        if "pattern" in s and not _regex(s["pattern"]).search(v):
            self.fail(path, f"{v!r} does not match {s['pattern']}")
        if s.get("format") == "date-time":
            try:
                parse_time(v)
            except SpecError:
                self.fail(path, f"{v!r} is not an RFC 3339 time")
        return v

    def walk_number(self, s: Schema, v: Any, path: str, t: str) -> int | float:
        ok = isinstance(v, int) and not isinstance(v, bool)
        if t == "number":
            ok = ok or isinstance(v, float)
        elif isinstance(v, float) and v.is_integer():
            v, ok = int(v), True  # JSON decoders may hand 3.0 for 3
        if not ok:
            return self.fail(path, f"expected {'an integer' if t == 'integer' else 'a number'}, "  # type: ignore[no-any-return]
                                   f"got {_type_name(v)}")
        if "minimum" in s and v < s["minimum"]:
            self.fail(path, f"{v} is below the minimum {s['minimum']}")
        if "maximum" in s and v > s["maximum"]:
            self.fail(path, f"{v} is above the maximum {s['maximum']}")
        if "enum" in s and v not in s["enum"]:
            self.fail(path, f"{v} is not one of {', '.join(map(str, s['enum']))}")
        return v  # type: ignore[no-any-return]


def validate(schema: Schema, value: Any, path: str = "spec") -> Any:
    """A defaulted, pruned copy of ``value``; raises ``SpecError("InvalidSpec")`` on the first problem."""
    return _Walker(lenient=False).walk(schema, value, path)


def validate_lenient(schema: Schema, value: Any, path: str = "status") -> Any:
    """Like ``validate`` but drops invalid fields instead of raising; None if the root is unusable."""
    try:
        return _Walker(lenient=True).walk(schema, value, path)
    except _Drop:
        return None


def defaults_of(schema: Schema) -> dict[str, Any]:
    """What an empty object of ``schema`` becomes after defaulting (for blocks left out of a spec)."""
    out = validate(schema, {}, "(defaults)")
    assert isinstance(out, dict)
    return out
