"""The kube-scheduler extender v1 wire format (``k8s.io/kube-scheduler/extender/v1``).

The Go structs have no JSON tags, so the keys are the Go field names (``Pod``, ``Nodes``,
``NodeNames``, ``FailedNodes``, ``Host``, ``Score``, ...). Go's decoder matches keys without regard
to case, so this parser does too; the encoder writes the exact Go names. The embedded ``v1.Pod`` and
``v1.NodeList`` do have JSON tags (``metadata``, ``items``).

Request: ``ExtenderArgs{Pod, Nodes *v1.NodeList (nodeCacheCapable=false), NodeNames *[]string
(nodeCacheCapable=true)}``. Filter answer: ``ExtenderFilterResult{Nodes, NodeNames, FailedNodes,
FailedAndUnresolvableNodes, Error}``. Prioritize answer: ``HostPriorityList`` = ``[{Host, Score}]``.

Every malformed body raises :class:`WireError` with a message for a 400; nothing here raises
anything else on bad input. No logic, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson


class WireError(ValueError):
    """The request body is not a usable ExtenderArgs (→ HTTP 400)."""


@dataclass(frozen=True, slots=True)
class ExtenderArgs:
    """A parsed request: the pod and either full node objects or node names."""

    pod: dict[str, Any]
    nodes: list[dict[str, Any]] | None = None
    node_names: list[str] | None = None

    @property
    def names(self) -> list[str]:
        """Candidate node names, in request order."""
        if self.nodes is not None:
            return [n["metadata"]["name"] for n in self.nodes]
        return list(self.node_names or [])


def _ci(obj: Mapping[str, Any]) -> dict[str, Any]:
    """Keys folded to lower case (Go's encoding/json matches field names case-insensitively)."""
    out: dict[str, Any] = {}
    for k, v in obj.items():
        out.setdefault(k.lower(), v)
    return out


def parse_args(body: bytes) -> ExtenderArgs:
    """Parse an ``ExtenderArgs`` body; raise :class:`WireError` on anything unusable."""
    if not body:
        raise WireError("empty body: expected ExtenderArgs JSON")
    try:
        raw = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise WireError(f"invalid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise WireError("ExtenderArgs must be a JSON object")
    args = _ci(raw)
    pod = args.get("pod")
    if not isinstance(pod, dict):
        raise WireError("ExtenderArgs.Pod must be an object")
    if "metadata" in pod and not isinstance(pod["metadata"], dict):
        raise WireError("Pod.metadata must be an object")
    nodes_raw, names_raw = args.get("nodes"), args.get("nodenames")
    if nodes_raw is not None:
        if not isinstance(nodes_raw, dict):
            raise WireError("ExtenderArgs.Nodes must be a NodeList object")
        items = _ci(nodes_raw).get("items")
        if items is None:
            items = []
        if not isinstance(items, list):
            raise WireError("Nodes.items must be an array")
        nodes: list[dict[str, Any]] = []
        for i, node in enumerate(items):
            meta = node.get("metadata") if isinstance(node, dict) else None
            name = meta.get("name") if isinstance(meta, dict) else None
            if not isinstance(name, str) or not name:
                raise WireError(f"Nodes.items[{i}] has no metadata.name")
            nodes.append(node)
        return ExtenderArgs(pod=pod, nodes=nodes)
    if names_raw is not None:
        if not isinstance(names_raw, list) or not all(isinstance(n, str) and n for n in names_raw):
            raise WireError("ExtenderArgs.NodeNames must be an array of non-empty strings")
        return ExtenderArgs(pod=pod, node_names=list(names_raw))
    raise WireError("ExtenderArgs needs Nodes (nodeCacheCapable=false) or NodeNames (nodeCacheCapable=true)")


def filter_result(passed: Sequence[str], failed: Mapping[str, str], unresolvable: Mapping[str, str],
                  *, nodes: Sequence[Mapping[str, Any]] | None = None, error: str = "") -> bytes:
    """Encode ``ExtenderFilterResult``. ``nodes`` (the request's objects) echoes the Nodes form."""
    result: dict[str, Any] = {
        "Nodes": None,
        "NodeNames": list(passed),
        "FailedNodes": dict(failed),
        "FailedAndUnresolvableNodes": dict(unresolvable),
        "Error": error,
    }
    if nodes is not None:
        keep = set(passed)
        result["Nodes"] = {"metadata": {}, "items": [n for n in nodes if n["metadata"]["name"] in keep]}
    return orjson.dumps(result)


def priority_list(scores: Mapping[str, int], order: Sequence[str] | None = None) -> bytes:
    """Encode ``HostPriorityList`` (in ``order`` when given, else the mapping's order)."""
    names = order if order is not None else list(scores)
    return orjson.dumps([{"Host": n, "Score": int(scores[n])} for n in names if n in scores])


def error_result(message: str) -> bytes:
    """A body carrying only an error message (``{"Error": ...}``), for 4xx/5xx answers."""
    return orjson.dumps({"Error": message})
