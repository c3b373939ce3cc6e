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

Speed (reliability plan E2/F20): a NodeList body is ~4 KiB per node (20.7 MiB for 5,000 realistic
nodes), the extender reads only each node's name, labels and annotations, and kube-scheduler sends
the same objects call after call. With ``msgspec`` the body is *not* decoded into Python objects: one
pass splits ``Nodes.items`` into each item's raw JSON (``msgspec.Raw``, a view into the body, no copy)
and :func:`parse_args` returns them in ``ExtenderArgs.items``; the caller (the facts cache,
``nodecache.py``) decodes only the items it has not seen, with :func:`item_doc`, and the filter
answer echoes the raw views. When the caller has the previous request's items (the same verb),
:func:`walk_items` reads the body against them instead (memcmp where each is expected; msgspec
only for the changed stretches; exact, see there), and :func:`parse_args` runs only when it
declines. Without msgspec, or for any body the fast path cannot read, the full
``orjson`` decode runs (it also words every 400 message), so both paths accept and reject the same
bodies.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
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
    """One ``Nodes.items`` entry of the full decode: its name and its decoded dict."""

    __slots__ = ("name", "obj")

    def __init__(self, name: str, obj: dict[str, Any]) -> None:
        self.name, self.obj = name, obj

    def doc(self) -> dict[str, Any]:
        """The node as a dict."""
        return self.obj

    def json(self) -> bytes:
        """The node's JSON (re-encoded)."""
        return orjson.dumps(self.obj)


@dataclass(frozen=True, slots=True)
class ExtenderArgs:
    """A parsed request: the pod and one of the node forms. ``items`` is the Nodes form as read by
    the fast path: each item's JSON as received (``msgspec.Raw``, a view into the body), not decoded;
    ``nodes`` is the Nodes form of the full decode; ``node_names`` the NodeNames form."""

    pod: dict[str, Any]
    nodes: list[WireNode] | None = None
    node_names: list[str] | None = None
    items: list[Any] | None = None

    @property
    def is_nodes_form(self) -> bool:
        return self.items is not None or self.nodes is not None

    @property
    def names(self) -> list[str]:
        """Candidate node names, in request order (decodes ``items``: for tests, not the hot path)."""
        if self.items is not None:
            return [item_doc(i, raw)[0] for i, raw in enumerate(self.items)]
        if self.nodes is not None:
            return [n.name for n in self.nodes]
        return list(self.node_names or [])


FAST = msgspec is not None
"""Use the msgspec fast path (tests switch it off to check both paths agree)."""

if msgspec is not None:
    class _NodeList(msgspec.Struct, frozen=True):
        items: list[msgspec.Raw] | None = None

    class _Args(msgspec.Struct, frozen=True):
        Pod: msgspec.Raw = msgspec.Raw()
        Nodes: _NodeList | None = None

    _ARGS = msgspec.json.Decoder(_Args)
    _SEGMENT = msgspec.json.Decoder(list[list[list[msgspec.Raw]]])  # items at their depth in the body

_SENTINEL = b'"%s"' % secrets.token_hex(16).encode()
"""A string no sender can know (random per process): the walk's check that the array it read is the
``Nodes.items`` the decoder uses."""
WALK_WINDOW = 64 << 10  # the slack past where the walk expects the next known item (2x the stretch + this)
WALK_ANCHORS = 8  # how many known items after a changed one it tries as that anchor
WALK_STRETCHES = 256  # more stretches of new items than this: the msgspec split is as cheap; decline


class _Fallback(Exception):
    """The fast path cannot read this body; the full decode decides (and words the 400)."""


def item_doc(i: int, raw: Any) -> tuple[str, dict[str, Any]]:
    """Decode ``Nodes.items[i]`` (its JSON as received): (metadata.name, the dict). Raises
    :class:`WireError` with the full decode's message when the item has no usable name."""
    try:
        obj = orjson.loads(memoryview(raw))
    except orjson.JSONDecodeError as exc:  # pragma: no cover - msgspec validated it
        raise WireError(f"invalid JSON in Nodes.items[{i}]: {exc}") from None
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    name = meta.get("name") if isinstance(meta, dict) else None
    if not isinstance(name, str) or not name:
        raise WireError(f"Nodes.items[{i}] has no metadata.name")
    return name, obj


def _fast_parse(body: bytes) -> ExtenderArgs:
    """One msgspec pass over the body splits ``Nodes.items`` into raw views without decoding them
    (the caller looks each up in its facts cache and decodes only new ones with :func:`item_doc`).
    Only the Go field names are matched here: anything else (lower-case keys, NodeNames, errors)
    falls back to the full decode."""
    try:
        args = _ARGS.decode(body)
    except msgspec.DecodeError:
        raise _Fallback from None
    return _checked(args, args.Nodes.items if args.Nodes is not None else None)


def _checked(args: Any, items: list[Any] | None) -> ExtenderArgs:
    """An ``ExtenderArgs`` from a msgspec decode; :class:`_Fallback` when the Pod is unusable."""
    if args.Nodes is None or args.Nodes.items is None or not args.Pod:
        raise _Fallback
    try:
        pod = orjson.loads(memoryview(args.Pod))
    except orjson.JSONDecodeError:  # pragma: no cover - msgspec validated it
        raise _Fallback from None
    if not isinstance(pod, dict) or ("metadata" in pod and not isinstance(pod["metadata"], dict)):
        raise _Fallback
    return ExtenderArgs(pod=pod, items=items)


def _segment(body: bytes, p: int, q: int) -> list[Any]:
    """The items in ``body[p:q]`` (one or more, comma-separated), validated by msgspec at the depth
    they have in the body; :class:`_Fallback` when that is not exactly a list of JSON values."""
    if q <= p:
        raise _Fallback
    try:
        outer = _SEGMENT.decode(b"".join((b"[[[", memoryview(body)[p:q], b"]]]")))
    except msgspec.DecodeError:
        raise _Fallback from None
    if len(outer) != 1 or len(outer[0]) != 1 or not outer[0][0]:
        raise _Fallback
    return outer[0][0]


def _anchor(body: bytes, prev: Sequence[Any], k: int, p: int) -> tuple[int, int]:
    """(j, q): the first of ``prev[k:k + WALK_ANCHORS]`` found as ``,<item>`` in ``body`` at ``q``,
    searched up to twice as far as the previous items before it reached, plus ``WALK_WINDOW`` (so a
    failed search costs about the stretch, never the whole body); ``(len(prev), -1)`` when none is."""
    find = body.find
    reach = len(prev[k - 1]) if k else 0  # the item being replaced
    for j in range(k, min(len(prev), k + WALK_ANCHORS)):
        e = prev[j]
        q = find(b"," + e, p, p + 2 * reach + WALK_WINDOW + len(e))
        if q != -1:
            return j, q
        reach += len(e)
    return len(prev), -1


def walk_items(body: bytes, prev: Sequence[Any]) -> tuple[ExtenderArgs, list[int]] | None:
    """The NodeList fast path when the caller knows the items of the previous request: walk the
    body comparing it with those items where they are expected (kube-scheduler sends the same Node
    objects in the same order call after call), instead of scanning every byte with msgspec.

    Returns ``(args, known)``: ``args.items`` as :func:`parse_args` would give them (byte for byte;
    an item equal to ``prev[k]`` *is* ``prev[k]``, the caller's own copy) and ``known[i]`` = ``k``
    for those, -1 for the others (new or changed items, split and validated by msgspec). None when
    the body does not fit that picture (the caller then runs :func:`parse_args`).

    Exact, never a guess: an item is a JSON object, so when the body holds the bytes of a known
    (complete, valid) item where an item starts, that is the item; the bytes between known items are
    validated as items by msgspec; and the body without its items, with a random string
    (:data:`_SENTINEL`) in their place, must decode to an ``ExtenderArgs`` whose ``Nodes.items`` is
    exactly that string: so the array walked is the one the decoder uses, and the rest of the body
    is valid JSON (else the msgspec/orjson paths decide, and word the 400)."""
    if not FAST or not prev:
        return None
    try:
        return _walk(body, prev)
    except _Fallback:
        return None


def _walk(body: bytes, prev: Sequence[Any]) -> tuple[ExtenderArgs, list[int]]:
    start = body.find(prev[0])
    if start < 1 or body[start - 1] != 0x5B:  # the first item changed, or a surprise
        j, q = _anchor(body, prev, 1, 0)
        if q == -1:
            raise _Fallback
        start = body.rfind(b'"items":[', 0, q) + 9  # kube-scheduler's encoding; checked below
        if start < 9:
            raise _Fallback
    n, size = len(prev), len(body)
    items: list[Any] = []
    known: list[int] = []
    startswith = body.startswith
    p = start
    k = 0
    stretches = 0
    while True:
        e = prev[k] if k < n else None
        if e is not None and startswith(e, p):
            items.append(e)
            known.append(k)
            q = p + len(e)
            k += 1
        else:  # new items up to the next known one (or the array's end)
            stretches += 1
            if stretches > WALK_STRETCHES:
                raise _Fallback
            j, q = _anchor(body, prev, k + 1, p) if k + 1 < n else (n, -1)
            if q == -1:
                q = body.rfind(b"]", p)
            new = _segment(body, p, q)
            items += new
            known += [-1] * len(new)
            k = j
        c = body[q] if q < size else -1
        if c == 0x2C:  # ","
            p = q + 1
            continue
        if c != 0x5D:  # "]"
            raise _Fallback
        break
    try:
        args = _ARGS.decode(b"".join((memoryview(body)[:start], _SENTINEL, memoryview(body)[q:])))
    except msgspec.DecodeError:
        raise _Fallback from None
    got = args.Nodes.items if args.Nodes is not None else None
    if got is None or len(got) != 1 or got[0] != msgspec.Raw(_SENTINEL):
        raise _Fallback
    return _checked(args, items), known


def _ci(obj: Mapping[str, Any]) -> dict[str, Any]:
    """Keys folded to lower case (Go's encoding/json matches field names case-insensitively)."""
    out: dict[str, Any] = {}
    for k, v in obj.items():
        out.setdefault(k.lower(), v)
    return out


def parse_args(body: bytes) -> ExtenderArgs:
    """Parse an ``ExtenderArgs`` body; raise :class:`WireError` on anything unusable (on the fast
    path an item's name is checked when the caller decodes it: :func:`item_doc`)."""
    if not body:
        raise WireError("empty body: expected ExtenderArgs JSON")
    if FAST:
        try:
            return _fast_parse(body)
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
            nodes.append(WireNode(name, node))
        return ExtenderArgs(pod=pod, nodes=nodes)
    if names_raw is not None:
        if not isinstance(names_raw, list) or not all(isinstance(n, str) and n for n in names_raw):
            raise WireError("ExtenderArgs.NodeNames must be an array of non-empty strings")
        return ExtenderArgs(pod=pod, node_names=list(names_raw))
    raise WireError("ExtenderArgs needs Nodes (nodeCacheCapable=false) or NodeNames (nodeCacheCapable=true)")


def filter_result(passed: Sequence[str], failed: Mapping[str, str], unresolvable: Mapping[str, str],
                  *, echo: tuple[Sequence[str], Sequence[Any]] | None = None, error: str = "") -> bytes:
    """Encode ``ExtenderFilterResult``. ``echo`` = (name, JSON as received) of every request item,
    for the Nodes form: the passing items are echoed exactly as received, joined in one copy (the
    ``Nodes`` key goes last, so the items are the tail of the answer)."""
    result: dict[str, Any] = {
        "Nodes": None,
        "NodeNames": passed,
        "FailedNodes": failed,
        "FailedAndUnresolvableNodes": unresolvable,
        "Error": error,
    }
    if echo is None:
        return orjson.dumps(result)
    del result["Nodes"]
    head = orjson.dumps(result)[:-1] + b',"Nodes":{"metadata":{},"items":['
    keep = set(passed)
    names, raws = echo
    items: list[Any] = [raw for name, raw in zip(names, raws, strict=True) if name in keep]
    if not items:
        return head + b"]}}"
    # one copy of the items: the head rides on the first, the tail on the last
    items[-1] = b"".join((items[-1], b"]}}"))
    items[0] = head + items[0]
    return b",".join(items)



def priority_list(scores: Mapping[str, int], order: Sequence[str] | None = None) -> bytes:
    """Encode ``HostPriorityList`` (in ``order`` when given, else the mapping's order)."""
    names = order if order is not None else list(scores)
    return orjson.dumps([{"Host": n, "Score": scores[n]} for n in names if n in scores])


def error_result(message: str) -> bytes:
    """A body carrying only an error message (``{"Error": ...}``), for 4xx/5xx answers."""
    return orjson.dumps({"Error": message})
