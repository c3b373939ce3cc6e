#!/usr/bin/env python3
"""Rewrite the values table of charts/flexinfer/README.md from the `# --` comments of values.yaml.

Every key of values.yaml (outside list items) must have a `# -- description` comment right above it;
the table lists each key's dotted path, type, default and description between the markers
<!-- values-table:start --> and <!-- values-table:end -->.

    scripts/chart-values-table.py            # rewrite the table
    scripts/chart-values-table.py --check    # exit 1 when the table is stale or a value has no comment
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

START, END = "<!-- values-table:start -->", "<!-- values-table:end -->"
KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_.\-/]+):(?:\s|$)")


def documented_keys(text: str) -> tuple[list[tuple[str, str]], list[str]]:
    """``([(dotted path, description)], [paths without a comment])`` in file order."""
    rows: list[tuple[str, str]] = []
    missing: list[str] = []
    stack: list[tuple[int, str]] = []
    comment: list[str] = []
    list_indent: int | None = None  # inside a block list item: keys there are data, not values
    for line in text.splitlines():
        stripped = line.strip()
        indent = len(line) - len(line.lstrip(" "))
        if not stripped:
            comment = []
            continue
        if list_indent is not None:
            if indent > list_indent or (indent == list_indent and stripped.startswith("- ")):
                continue
            list_indent = None
        if stripped.startswith("#"):
            body = stripped[1:].strip()
            if body.startswith("--"):
                comment = [body[2:].strip()]
            elif comment:
                comment.append(body)
            continue
        if stripped.startswith("- "):
            list_indent = indent
            comment = []
            continue
        m = KEY.match(line)
        if not m:
            comment = []
            continue
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, m["key"]))
        path = ".".join(k for _, k in stack)
        if comment:
            rows.append((path, " ".join(comment)))
        else:
            missing.append(path)
        comment = []
    return rows, missing


def _lookup(values: Any, path: str) -> Any:
    for part in path.split("."):
        values = values[part]
    return values


def _type(v: Any) -> str:
    return {bool: "bool", int: "int", float: "float", str: "string", list: "list", dict: "object"}.get(
        type(v), type(v).__name__)


def _default(v: Any) -> str:
    if isinstance(v, dict) and v:
        return ""
    text = json.dumps(v, separators=(", ", ": "))
    return "`" + text.replace("|", "\\|") + "`"


def table(values_text: str) -> tuple[str, list[str]]:
    rows, missing = documented_keys(values_text)
    values = yaml.safe_load(values_text)
    out = ["| Key | Type | Default | Description |", "|---|---|---|---|"]
    for path, desc in rows:
        v = _lookup(values, path)
        cell = desc.replace("|", "\\|")
        out.append(f"| `{path}` | {_type(v)} | {_default(v)} | {cell} |")
    return "\n".join(out) + "\n", missing


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--chart", type=Path, default=Path(__file__).resolve().parents[1] / "charts" / "flexinfer")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 when the table is stale")
    args = p.parse_args(argv)
    readme = args.chart / "README.md"
    body, missing = table((args.chart / "values.yaml").read_text())
    if missing:
        print("values without a `# --` comment: " + ", ".join(missing))
        return 1
    text = readme.read_text()
    if START not in text or END not in text:
        print(f"{readme}: the markers {START} / {END} are missing")
        return 1
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    new = f"{head}{START}\n{body}{END}{tail}"
    if args.check:
        if new != text:
            print(f"{readme}: the values table is stale: run scripts/chart-values-table.py")
            return 1
        return 0
    if new != text:
        readme.write_text(new)
        print(f"{readme}: values table rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main())
