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

Speed (reliability plan E2/F20): a NodeList body is ~1 KiB per node (4.6 MiB for 5,000 nodes) and the
extender reads only each node's name, labels and annotations, and kube-scheduler sends the same
objects call after call. With ``msgspec`` installed (the ``kube`` extra) the body is *not* decoded
into Python objects: one pass splits ``Nodes.items`` into each item's raw JSON bytes
(:class:`WireNode`); an item the caller has seen before, byte for byte (``known``, the server's
facts cache), is not decoded at all; the others are decoded alone; the filter answer echoes the raw
bytes. Without msgspec, or for any body the fast path cannot read, the full ``orjson`` decode runs
(it also words every 400 message), so both paths accept and reject the same bodies.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

try:  # optional speed-up (kube extra); everything works without it
    import msgspec
except ImportError:  # pragma: no cover - exercised by FAST=False in the tests
    msgspec = None  # type: ignore[assignment]


class WireError(ValueError):
    """The request body is not a usable ExtenderArgs (→ HTTP 400)."""


class WireNode:
    """One ``Nodes.items`` entry: its name, and its JSON as received (``raw``, the fast path) and/or
    its decoded dict (``obj``; None on the fast path when the caller already knew this exact JSON)."""

    __slots__ = ("known", "name", "obj", "raw")

    def __init__(self, name: str, raw: bytes | None = None, obj: dict[str, Any] | None = None,
                 known: Any = None) -> None:
        self.name, self.raw, self.obj, self.known = name, raw, obj, known

    def doc(self) -> dict[str, Any]:
        """The node as a dict (decoded now if it was not)."""
        if self.obj is None:
            self.obj = orjson.loads(self.raw) if self.raw is not None else {}
        return self.obj

    def json(self) -> bytes:
        """The node's JSON as received (re-encoded only on the dict path)."""
        return self.raw if self.raw is not None else orjson.dumps(self.obj)


@dataclass(frozen=True, slots=True)
class ExtenderArgs:
    """A parsed request: the pod and either full node objects or node names."""

    pod: dict[str, Any]
    nodes: list[WireNode] | None = None
    node_names: list[str] | None = None

    @property
    def names(self) -> list[str]:
        """Candidate node names, in request order."""
        if self.nodes is not None:
            return [n.name for n in self.nodes]
        return list(self.node_names or [])


Known = Callable[[bytes], Any]
"""What the caller keeps for an item's exact JSON (an object with a ``name``), or None if new to it."""

FAST = msgspec is not None
"""Use the msgspec fast path (tests switch it off to check both paths agree)."""

if msgspec is not None:
    class _NodeList(msgspec.Struct, frozen=True):
        items: list[msgspec.Raw] | None = None

    class _Args(msgspec.Struct, frozen=True):
        Pod: msgspec.Raw = msgspec.Raw()
        Nodes: _NodeList | None = None

    _ARGS = msgspec.json.Decoder(_Args)


class _Fallback(Exception):
    """The fast path cannot read this body; the full decode decides (and words the 400)."""


def _unknown(raw: bytes) -> Any:
    return None


def _fast_parse(body: bytes, known: Known) -> ExtenderArgs:
    """One msgspec pass over the body keeps each item's bytes; items ``known`` knows are not decoded.
    Only the Go field names are matched here: anything else (lower-case keys, NodeNames, errors) falls
    back to the full decode."""
    try:
        args = _ARGS.decode(body)
    except msgspec.DecodeError:
        raise _Fallback from None
    if args.Nodes is None or args.Nodes.items is None or not args.Pod:
        raise _Fallback
    try:
        pod = orjson.loads(bytes(args.Pod))
    except orjson.JSONDecodeError:  # pragma: no cover - msgspec validated it
        raise _Fallback from None
    if not isinstance(pod, dict) or ("metadata" in pod and not isinstance(pod["metadata"], dict)):
        raise _Fallback
    nodes: list[WireNode] = []
    for item in args.Nodes.items:
        raw = bytes(item)
        seen = known(raw)
        if seen is not None:
            nodes.append(WireNode(seen.name, raw, known=seen))
            continue
        obj = orjson.loads(raw)
        meta = obj.get("metadata") if isinstance(obj, dict) else None
        name = meta.get("name") if isinstance(meta, dict) else None
        if not isinstance(name, str) or not name:
            raise _Fallback
        nodes.append(WireNode(name, raw, obj))
    return ExtenderArgs(pod=pod, nodes=nodes)


def _ci(obj: Mapping[str, Any]) -> dict[str, Any]:
    """Keys folded to lower case (Go's encoding/json matches field names case-insensitively)."""
    out: dict[str, Any] = {}
    for k, v in obj.items():
        out.setdefault(k.lower(), v)
    return out


def parse_args(body: bytes, known: Known = _unknown) -> ExtenderArgs:
    """Parse an ``ExtenderArgs`` body; raise :class:`WireError` on anything unusable.

    ``known`` lets the fast path skip decoding node items the caller has seen before."""
    if not body:
        raise WireError("empty body: expected ExtenderArgs JSON")
    if FAST:
        try:
            return _fast_parse(body, known)
        except _Fallback:
            pass
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
        nodes: list[WireNode] = []
        for i, node in enumerate(items):
            meta = node.get("metadata") if isinstance(node, dict) else None
            name = meta.get("name") if isinstance(meta, dict) else None
            if not isinstance(name, str) or not name:
                raise WireError(f"Nodes.items[{i}] has no metadata.name")
            nodes.append(WireNode(name, obj=node))
        return ExtenderArgs(pod=pod, nodes=nodes)
    if names_raw is not None:
        if not isinstance(names_raw, list) or not all(isinstance(n, str) and n for n in names_raw):
            raise WireError("ExtenderArgs.NodeNames must be an array of non-empty strings")
        return ExtenderArgs(pod=pod, node_names=list(names_raw))
    raise WireError("ExtenderArgs needs Nodes (nodeCacheCapable=false) or NodeNames (nodeCacheCapable=true)")


def filter_result(passed: Sequence[str], failed: Mapping[str, str], unresolvable: Mapping[str, str],
                  *, nodes: Sequence[WireNode] | None = None, error: str = "") -> bytes:
    """Encode ``ExtenderFilterResult``. ``nodes`` (the request's objects) echoes the Nodes form:
    the passing items' JSON exactly as received."""
    result: dict[str, Any] = {
        "Nodes": None,
        "NodeNames": list(passed),
        "FailedNodes": dict(failed),
        "FailedAndUnresolvableNodes": dict(unresolvable),
        "Error": error,
    }
    if nodes is None:
        return orjson.dumps(result)
    del result["Nodes"]
    keep = set(passed)
    items = [n.json() for n in nodes if n.name in keep]
    return b"".join((b'{"Nodes":{"metadata":{},"items":[', b",".join(items), b"]},", orjson.dumps(result)[1:]))


def priority_list(scores: Mapping[str, int], order: Sequence[str] | None = None) -> bytes:
    """Encode ``HostPriorityList`` (in ``order`` when given, else the mapping's order)."""
    names = order if order is not None else list(scores)
    return orjson.dumps([{"Host": n, "Score": int(scores[n])} for n in names if n in scores])


def error_result(message: str) -> bytes:
    """A body carrying only an error message (``{"Error": ...}``), for 4xx/5xx answers."""
    return orjson.dumps({"Error": message})
