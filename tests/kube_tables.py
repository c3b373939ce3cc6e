"""Server-side printing for the test emulator: ``meta.k8s.io/v1`` ``Table`` answers built from a CRD's
``additionalPrinterColumns`` (as the apiextensions-apiserver's table convertor builds them), the JSONPath
subset those columns use, and the ``/openapi/v3`` documents kubectl's client-side validation fetches.

Columns: ``Name`` (format ``name``) first, then the CRD's columns; a CRD without columns gets ``Age``
(``.metadata.creationTimestamp``), and so does a builtin resource (kube's own column sets are not
emulated). A cell takes the **first** JSONPath result: ``string`` columns print it (lists and maps as
JSON), ``integer``/``number``/``boolean`` need that JSON type, ``date`` becomes an age (``5m``,
``3h12m``... as ``duration.HumanDuration``); anything missing or of the wrong type is ``null``, which
kubectl prints as ``<none>``.

JSONPath: ``.a.b``, ``['a.b']``, ``[n]`` (negative too), ``[*]``, ``..a`` (recursive), and filters
``[?(@.x=="v")]``, ``!=``, ``<``, ``>``, ``[?(@.x)]`` (existence) — what printer columns use.
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

_TOKEN = re.compile(r"""
    \.\.(?P<rec>[A-Za-z0-9_\-$]+)           # ..name
  | \.(?P<field>[A-Za-z0-9_\-$]+)           # .name
  | \[\s*'(?P<q1>[^']*)'\s*\]               # ['name']
  | \[\s*"(?P<q2>[^"]*)"\s*\]               # ["name"]
  | \[\s*(?P<idx>-?\d+)\s*\]                # [0]
  | \[\s*\*\s*\]                            # [*]
  | \[\s*\?\(\s*(?P<flt>[^\]]*?)\s*\)\s*\]  # [?(...)]
  | (?P<dot>\.)$                            # a lone "." at the end (the object itself)
""", re.VERBOSE)
_FILTER = re.compile(r"""^@(?P<path>(?:\.[A-Za-z0-9_\-$]+)+)\s*(?:(?P<op>==|!=|<=|>=|<|>)\s*(?P<val>.+))?$""")


def _children(v: Any) -> Iterator[Any]:
    if isinstance(v, Mapping):
        yield from v.values()
    elif isinstance(v, list):
        yield from v


def _recurse(v: Any, name: str) -> Iterator[Any]:
    if isinstance(v, Mapping) and name in v:
        yield v[name]
    for c in _children(v):
        yield from _recurse(c, name)


def _literal(text: str) -> Any:
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    try:
        return json.loads(text)
    except ValueError:
        return text


def _filter_ok(item: Any, expr: str) -> bool:
    m = _FILTER.match(expr)
    if m is None:
        raise ValueError(f"unsupported JSONPath filter {expr!r}")
    cur: Any = item
    for part in m.group("path").split(".")[1:]:
        if not isinstance(cur, Mapping) or part not in cur:
            return False
        cur = cur[part]
    op = m.group("op")
    if op is None:
        return True
    want = _literal(m.group("val"))
    try:
        return bool({"==": cur == want, "!=": cur != want}.get(op) if op in ("==", "!=") else
                    {"<": cur < want, ">": cur > want, "<=": cur <= want, ">=": cur >= want}[op])
    except TypeError:
        return False


def jsonpath(obj: Any, path: str) -> list[Any]:
    """Every value ``path`` (``.status.phase``, ``{.spec.x}``) selects in ``obj``, in order."""
    path = path.strip()
    if path.startswith("{") and path.endswith("}"):
        path = path[1:-1].strip()
    if path.startswith("$"):
        path = path[1:]
    current: list[Any] = [obj]
    pos = 0
    while pos < len(path):
        m = _TOKEN.match(path, pos)
        if m is None:
            raise ValueError(f"unsupported JSONPath {path!r} at {pos}")
        pos = m.end()
        nxt: list[Any] = []
        for v in current:
            if m.group("rec") is not None:
                nxt.extend(_recurse(v, m.group("rec")))
            elif m.group("dot") is not None:
                nxt.append(v)
            elif (key := m.group("field") or m.group("q1") or m.group("q2")) is not None:
                if isinstance(v, Mapping) and key in v:
                    nxt.append(v[key])
            elif m.group("idx") is not None:
                i = int(m.group("idx"))
                if isinstance(v, list) and -len(v) <= i < len(v):
                    nxt.append(v[i])
            elif m.group("flt") is not None:
                nxt.extend(c for c in _children(v) if _filter_ok(c, m.group("flt")))
            else:  # [*]
                nxt.extend(_children(v))
        current = nxt
    return current


def human_duration(seconds: float) -> str:
    """``k8s.io/apimachinery/pkg/util/duration.HumanDuration``."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 60 * 2:
        return f"{s}s"
    m = s // 60
    if m < 10:
        return f"{m}m{s % 60}s" if s % 60 else f"{m}m"
    if m < 60 * 3:
        return f"{m}m"
    h = s // 3600
    if h < 8:
        return f"{h}h{m % 60}m" if m % 60 else f"{h}h"
    if h < 48:
        return f"{h}h"
    if h < 24 * 8:
        return f"{h // 24}d{h % 24}h" if h % 24 else f"{h // 24}d"
    if h < 24 * 365 * 2:
        return f"{h // 24}d"
    if h < 24 * 365 * 8:
        dy = (h // 24) % 365
        return f"{h // 24 // 365}y{dy}d" if dy else f"{h // 24 // 365}y"
    return f"{h // 24 // 365}y"


def _age(value: Any, now: datetime.datetime | None = None) -> str | None:
    if not isinstance(value, str):
        return None
    try:
        t = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    now = now or datetime.datetime.now(tz=datetime.UTC)
    return human_duration((now - t).total_seconds())


def cell(column: Mapping[str, Any], obj: Mapping[str, Any]) -> Any:
    """One Table cell, like ``tableconvertor.ConvertToTable`` (first result only)."""
    try:
        results = jsonpath(obj, column["jsonPath"])
    except ValueError:
        return None
    if not results:
        return None
    value = results[0]
    kind = column.get("type", "string")
    if kind == "string":
        if value is None:
            return None
        if isinstance(value, bool):
            return "true" if value else "false"
        return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    if kind == "integer":
        return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
    if kind == "number":
        return value if isinstance(value, int | float) and not isinstance(value, bool) else None
    if kind == "boolean":
        return value if isinstance(value, bool) else None
    if kind == "date":
        return _age(value)
    return None


NAME_COLUMN = {"name": "Name", "type": "string", "format": "name", "priority": 0,
               "description": "Name must be unique within a namespace."}
AGE = {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}


def table(objects: Sequence[Mapping[str, Any]], columns: Sequence[Mapping[str, Any]] | None, *,
          resource_version: str = "", include_object: str = "PartialObjectMetadata") -> dict[str, Any]:
    """A ``meta.k8s.io/v1`` Table of ``objects`` with the CRD ``columns`` (None: Name and Age only)."""
    cols = list(columns) if columns else [AGE]
    defs = [NAME_COLUMN] + [{"name": c["name"], "type": c.get("type", "string"), "format": c.get("format", ""),
                             "description": c.get("description", ""), "priority": int(c.get("priority", 0))}
                            for c in cols]
    rows = []
    for obj in objects:
        meta = obj.get("metadata") or {}
        row: dict[str, Any] = {"cells": [meta.get("name")] + [cell(c, obj) for c in cols]}
        if include_object == "Object":
            row["object"] = obj
        elif include_object != "None":
            row["object"] = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": meta}
        rows.append(row)
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": resource_version},
            "columnDefinitions": defs, "rows": rows}


def wants_table(accept: str | None) -> bool:
    """Whether an ``Accept`` header asks for ``as=Table`` (kubectl's get/describe do)."""
    return bool(accept) and any("as=Table" in part and "g=meta.k8s.io" in part for part in (accept or "").split(","))


def _strip_x(schema: Any) -> Any:
    if isinstance(schema, Mapping):
        return {k: _strip_x(v) for k, v in schema.items()}
    if isinstance(schema, list):
        return [_strip_x(v) for v in schema]
    return schema


def openapi_v3_root(crds: Mapping[tuple[str, str], Any]) -> dict[str, Any]:
    """``/openapi/v3``: one path per served group/version of the registered CRDs."""
    return {"paths": {f"apis/{g}/{v}": {"serverRelativeURL": f"/openapi/v3/apis/{g}/{v}?hash=emulator"}
                      for (g, v) in sorted({(g, v) for (g, v) in crds})}}


def openapi_v3_group(group: str, version: str, crds: Mapping[tuple[str, str], Any]) -> dict[str, Any] | None:
    """``/openapi/v3/apis/<group>/<version>``: the CRDs' schemas with their GroupVersionKind, and the
    object paths whose operations take ``fieldValidation`` (kubectl then validates on the server, which
    the emulator does not, instead of downloading ``/openapi/v2``)."""
    schemas: dict[str, Any] = {}
    paths: dict[str, Any] = {}
    param = [{"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": True}}]
    for (g, v), entries in crds.items():
        if (g, v) != (group, version):
            continue
        for kind, schema, plural, namespaced in entries:
            gvk = {"group": g, "version": v, "kind": kind}
            base = f"/apis/{g}/{v}/namespaces/{{namespace}}/{plural}" if namespaced else f"/apis/{g}/{v}/{plural}"
            op = {"parameters": param, "x-kubernetes-group-version-kind": gvk}
            paths[base] = {"post": op}
            paths[base + "/{name}"] = {"put": op, "patch": op}
            rev = ".".join(reversed(g.split(".")))
            body = dict(_strip_x(schema or {"type": "object", "x-kubernetes-preserve-unknown-fields": True}))
            props = dict(body.get("properties") or {})
            props.setdefault("apiVersion", {"type": "string"})
            props.setdefault("kind", {"type": "string"})
            props.setdefault("metadata", {"type": "object"})
            body["properties"] = props
            body["x-kubernetes-group-version-kind"] = [{"group": g, "version": v, "kind": kind}]
            schemas[f"{rev}.{v}.{kind}"] = body
    if not schemas:
        return None
    return {"openapi": "3.0.0", "info": {"title": "Kubernetes CRD Swagger", "version": "v0.1.0"},
            "paths": paths, "components": {"schemas": schemas}}
