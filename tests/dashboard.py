"""The chart's Grafana dashboards read for tests: every PromQL expression, parsed by a real PromQL parser.

``promql_parser`` (PyPI ``promql-parser``: Python bindings of the Rust ``promql-parser`` crate of
GreptimeDB, which follows Prometheus' own grammar) turns each expression into an AST; :func:`uses`
walks it for the series each expression reads (metric name, the labels it matches on, the labels it
groups ``by``). :func:`scrape` reads a real ``/metrics`` page with prometheus_client's parser, and
:func:`missing` says what of a dashboard a scrape does not have: a panel reading a name no component
exports, or grouping by a label the series does not carry, is a dead panel.
"""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import promql_parser
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]
DASHBOARDS = ROOT / "charts" / "flexinfer" / "dashboards"
#: Grafana's interval variables become a plain duration; any other variable a plain word (they are only
#: used inside label matchers' strings)
_INTERVAL = re.compile(r"\$(__rate_interval|__interval|__range)\b|\$\{(__rate_interval|__interval|__range)\}")
_VARIABLE = re.compile(r"\$\{\w+(?::\w+)?\}|\$\w+")
_LABEL_VALUES = re.compile(r"^\s*label_values\((?P<selector>.+),\s*(?P<label>\w+)\s*\)\s*$")


@dataclass
class Use:
    """One series an expression reads: the sample name, and the labels it matches and groups by."""

    name: str
    labels: set[str] = field(default_factory=set)


def dashboards() -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text()) for p in sorted(DASHBOARDS.glob("*.json"))}


def _panels(panels: Iterable[Mapping[str, Any]]) -> Iterator[Mapping[str, Any]]:
    for p in panels:
        yield p
        yield from _panels(p.get("panels") or ())


def expressions(dash: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(where, PromQL) for every target of every panel and every query variable (``label_values``)."""
    out = []
    for p in _panels(dash.get("panels") or ()):
        for t in p.get("targets") or ():
            out.append((f"panel {p.get('title')!r} {t.get('refId')}", str(t["expr"])))
    for v in (dash.get("templating") or {}).get("list") or ():
        if v.get("type") == "query":
            q = v["query"]["query"] if isinstance(v["query"], Mapping) else v["query"]
            m = _LABEL_VALUES.match(q)
            assert m, f"variable {v['name']!r}: only label_values(selector, label) is understood, got {q!r}"
            out.append((f"variable {v['name']!r}", f"group by ({m['label']}) ({m['selector']})"))
    return out


def to_promql(expr: str) -> str:
    """Grafana's variables replaced by what Prometheus would receive."""
    return _VARIABLE.sub("x", _INTERVAL.sub("5m", expr))


def parse(expr: str) -> Any:
    """The AST of a dashboard expression (ValueError on a syntax or type error)."""
    return promql_parser.parse(to_promql(expr))


def uses(node: Any, grouping: frozenset[str] = frozenset()) -> list[Use]:
    """Every vector selector under ``node``, with the labels matched on it and grouped by above it."""
    kind = type(node).__name__
    if kind == "VectorSelector":
        matchers = node.matchers.matchers
        name = node.name or next((m.value for m in matchers if m.name == "__name__"), None)
        assert name, f"a selector without a metric name: {node}"
        return [Use(name, {m.name for m in matchers if m.name != "__name__"} | set(grouping))]
    if kind == "MatrixSelector":
        return uses(node.vector_selector, grouping)
    if kind == "AggregateExpr":
        mod = node.modifier
        by = set(mod.labels) if mod is not None and str(mod.type).endswith("By") else set()
        found = uses(node.expr, grouping | by)
        return found + (uses(node.param, grouping) if node.param is not None else [])
    if kind == "BinaryExpr":
        return uses(node.lhs, grouping) + uses(node.rhs, grouping)
    if kind == "Call":
        return [u for a in node.args for u in uses(a, grouping)]
    if kind in ("ParenExpr", "UnaryExpr", "SubqueryExpr"):
        return uses(node.expr, grouping)
    assert kind in ("NumberLiteral", "StringLiteral"), kind
    return []


def dashboard_uses() -> list[tuple[str, Use]]:
    """(where, use) over every dashboard of the chart."""
    out = []
    for fname, dash in dashboards().items():
        for where, expr in expressions(dash):
            out += [(f"{fname} {where}", u) for u in uses(parse(expr))]
    return out


Samples = dict[str, list[dict[str, str]]]


def parse_scrape(text: str) -> Samples:
    """sample name -> the label sets of its samples."""
    out: Samples = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append(dict(s.labels))
    return out


def scrape(url: str, timeout: float = 5.0) -> Samples:
    """GET ``url`` (a ``/metrics`` page) over a real socket."""
    with urllib.request.urlopen(url, timeout=timeout) as r:
        assert r.status == 200
        return parse_scrape(r.read().decode())


def value(text: str, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` whose labels include ``labels`` (0 when none)."""
    total = 0.0
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


def missing(samples: Samples, wanted: Iterable[tuple[str, Use]]) -> list[str]:
    """What the dashboard reads and the scrape does not have (empty: no dead panel)."""
    problems = []
    for where, use in wanted:
        got = samples.get(use.name)
        if not got:
            problems.append(f"{where}: {use.name} not exported")
            continue
        carried = set().union(*(set(s) for s in got))
        lacking = use.labels - carried
        if lacking:
            problems.append(f"{where}: {use.name} has no label(s) {sorted(lacking)}")
    return problems
