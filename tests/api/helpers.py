"""Shared helpers of the API tests: schema walking and jsonschema-ready copies."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CRDS = ROOT / "crds"
EXAMPLES = ROOT / "examples"


def strip_k8s(schema: Any) -> Any:
    """A copy without ``x-kubernetes-*`` keys, for jsonschema."""
    if isinstance(schema, dict):
        return {k: strip_k8s(v) for k, v in schema.items() if not k.startswith("x-kubernetes-")}
    if isinstance(schema, list):
        return [strip_k8s(v) for v in schema]
    return schema


def nodes(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema node with its path (``.spec.gpu.priority``, ``.status.conditions[]``)."""
    yield path, schema
    for k, sub in (schema.get("properties") or {}).items():
        yield from nodes(sub, f"{path}.{k}")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from nodes(schema["additionalProperties"], f"{path}{{}}")
    if isinstance(schema.get("items"), dict):
        yield from nodes(schema["items"], f"{path}[]")


def resolve(schema: dict[str, Any], json_path: str) -> dict[str, Any] | None:
    """The schema node a printer-column JSONPath points at (``[?(...)]`` filters step into items)."""
    node: dict[str, Any] | None = schema
    rest = json_path.lstrip(".")
    while rest and node is not None:
        if rest.startswith("[?("):
            end = rest.index(")]") + 2
            node = node.get("items")
            rest = rest[end:].lstrip(".")
            continue
        seg, _, rest = rest.partition(".")
        if "[" in seg:
            seg, _, filt = seg.partition("[")
            rest = "[" + filt + ("." + rest if rest else "")
        node = (node.get("properties") or {}).get(seg)
    return node
