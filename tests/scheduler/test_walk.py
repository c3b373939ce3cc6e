"""F20: the NodeList walk (``wire.walk_items``) reads exactly what the msgspec split reads.

- For every kind of change between two requests (items changed in place, alone, adjacent, in long
  runs, first and last; items added, removed, reordered; a subset; whitespace; a Pod with its own
  ``items`` arrays and a node's JSON inside it; duplicate ``Nodes`` keys; other tails; malformed
  items and tails), the walk either gives the same Pod and the same items byte for byte as
  ``wire.parse_args`` (and says truly which items are the previous request's), or declines (None);
  it never accepts a body ``parse_args`` rejects.
- The same under hypothesis-generated edit sequences.
- Through ``ExtenderApp.dispatch``, on both decoders (msgspec fast path and the full orjson decode)
  and on the walk: the filter answer's ``Nodes.items`` are the passing input nodes, in order, node by
  node (decoded and compared with the input's); on the fast path byte-identical to the request's
  item bytes; and a malformed body is a 400 with a message, never a 500.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flexinfer.scheduler import wire
from flexinfer.scheduler.server import make_app
from flexinfer.scheduler.settings import ExtenderSettings
from tests.scheduler.helpers import make_node, make_pod

pytestmark = pytest.mark.skipif(not wire.FAST, reason="the walk is part of the msgspec fast path")

POD = make_pod(vram_mb=8000)
Split = msgspec.json.Decoder(list[msgspec.Raw])


class _EchoList(msgspec.Struct):
    items: list[msgspec.Raw]


class _Echo(msgspec.Struct):
    Nodes: _EchoList


EchoDecoder = msgspec.json.Decoder(_Echo)


def _nodes(n: int, tag: str = "") -> list[dict[str, Any]]:
    return [make_node(f"n{i}{tag}", free=1000 + 4000 * (i % 5)) for i in range(n)]


def _body(nodes: list[Any], pod: dict[str, Any] | None = None, tail: bytes = b"}") -> bytes:
    head = orjson.dumps({"Pod": pod or POD})[:-1] + b',"Nodes":{"metadata":{"resourceVersion":"9"},"items":['
    return head + b",".join(orjson.dumps(x) for x in nodes) + b"]}" + tail


def _prev(body: bytes) -> list[Any]:
    items = wire.parse_args(body).items
    assert items is not None
    return [msgspec.Raw(bytes(x)) for x in items]  # owned copies, as the cache keeps them


def _check(body: bytes, prev: list[Any]) -> tuple[Any, list[int]] | None:
    """The walk agrees with parse_args, or declines; returns what it gave."""
    walked = wire.walk_items(body, prev)
    try:
        ref = wire.parse_args(body)
    except wire.WireError:
        assert walked is None, "the walk accepted a body parse_args rejects"
        return None
    if walked is None:
        return None
    args, known = walked
    assert ref.items is not None and args.items is not None
    assert [bytes(x) for x in args.items] == [bytes(x) for x in ref.items]
    assert args.pod == ref.pod
    assert len(known) == len(args.items)
    for i, k in enumerate(known):
        if k >= 0:
            assert bytes(prev[k]) == bytes(args.items[i]) and args.items[i] is prev[k]
    return walked


def _changed(node: dict[str, Any], rv: str) -> dict[str, Any]:
    out = orjson.loads(orjson.dumps(node))
    out["metadata"]["resourceVersion"] = rv
    return out


BASE = _nodes(30)


def _edit(fn: Callable[[list[Any]], list[Any]]) -> list[Any]:
    return fn([orjson.loads(orjson.dumps(x)) for x in BASE])


# name -> (body, how many items the walk must find as the previous request's; None: it may decline).
# An item right after an insertion or a removal is read as new by the walk (the cache then finds it
# by its hash): fewer known items, the same items.
CASES: dict[str, tuple[bytes, int | None]] = {
    "same": (_body(BASE), 30),
    "one changed": (_body(_edit(lambda xs: [*xs[:7], _changed(xs[7], "2"), *xs[8:]])), 29),
    "first changed": (_body(_edit(lambda xs: [_changed(xs[0], "2"), *xs[1:]])), 29),
    "last changed": (_body(_edit(lambda xs: [*xs[:-1], _changed(xs[-1], "2")])), 29),
    "two adjacent": (_body(_edit(lambda xs: xs[:4] + [_changed(x, "2") for x in xs[4:6]] + xs[6:])), 28),
    "a run of 12": (_body(_edit(lambda xs: xs[:4] + [_changed(x, "2") for x in xs[4:16]] + xs[16:])), None),
    "inserted": (_body(_edit(lambda xs: [*xs[:10], make_node("new", free=9000), *xs[10:]])), 29),  # n10: by hash
    "inserted first": (_body(_edit(lambda xs: [make_node("new", free=9000), *xs])), 29),  # n0: by hash
    "appended": (_body(_edit(lambda xs: [*xs, make_node("new", free=9000)])), None),
    "removed": (_body(_edit(lambda xs: xs[:10] + xs[12:])), 27),  # n12: by hash
    "removed last": (_body(_edit(lambda xs: xs[:-1])), 29),
    "reversed": (_body(_edit(lambda xs: xs[::-1])), None),
    "subset": (_body(_edit(lambda xs: xs[2::3])), None),
    "empty": (_body([]), None),
    "indented": (orjson.dumps({"Pod": POD, "Nodes": {"items": BASE}}, option=orjson.OPT_INDENT_2), None),
    "tail NodeNames null": (_body(BASE, tail=b',"NodeNames":null}'), 30),
    "tail NodeNames []": (_body(BASE, tail=b',"NodeNames":[]}'), None),
    "pod with items and a node": (_body(BASE, pod={**POD, "spec": {
        "volumes": [{"configMap": {"items": [BASE[0]]}}], "containers": POD["spec"]["containers"]}}), None),
    "duplicate Nodes, the last used": (_body(BASE)[:-1] + b',"Nodes":{"items":[]}}', None),
    "duplicate Nodes, the first walked": (orjson.dumps({"Pod": POD})[:-1] + b',"Nodes":{"items":[]},'
                                          + _body(BASE)[len(orjson.dumps({"Pod": POD})):], None),
    "malformed changed item": (_body(BASE).replace(b'"name":"n7"', b'"name":n7"', 1), None),
    "malformed tail": (_body(BASE, tail=b',}'), None),
    "a changed item that is no object": (_body(_edit(lambda xs: [*xs[:3], [1, 2], *xs[4:]])), None),  # type: ignore[list-item]
    "trailing comma": (_body(BASE)[:-3] + b",]}}", None),
    "two commas": (_body(BASE).replace(b"},{", b"},,{", 1), None),
}


@pytest.mark.parametrize("name", list(CASES))
def test_walk_reads_what_parse_args_reads(name: str) -> None:
    body, expect_known = CASES[name]
    walked = _check(body, _prev(_body(BASE)))
    if expect_known is not None:
        assert walked is not None, "the walk declined an ordinary change"
        assert sum(k >= 0 for k in walked[1]) == expect_known


def test_the_walk_needs_the_sentinel_in_the_right_place() -> None:
    """A body that holds the walk's own sentinel string elsewhere is still read right (or declined)."""
    body = _body(BASE, pod={**POD, "metadata": {**POD["metadata"], "annotations": {"x": "y"}}})
    sneaky = body.replace(b'"x":"y"', b'"x":' + wire._SENTINEL, 1)
    _check(sneaky, _prev(_body(BASE)))


_ops = st.lists(st.tuples(st.sampled_from(["change", "insert", "delete", "swap"]), st.integers(0, 39)),
                max_size=8)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_ops, st.booleans())
def test_walk_agrees_under_generated_edits(ops: list[tuple[str, int]], corrupt: bool) -> None:
    nodes = [orjson.loads(orjson.dumps(x)) for x in BASE]
    for op, i in ops:
        i %= max(1, len(nodes))
        if op == "change" and nodes:
            nodes[i] = _changed(nodes[i], str(i + 100))
        elif op == "insert":
            nodes.insert(i, make_node(f"x{i}", free=5000))
        elif op == "delete" and nodes:
            del nodes[i]
        elif op == "swap" and len(nodes) > 1:
            nodes[i], nodes[i - 1] = nodes[i - 1], nodes[i]
    body = _body(nodes)
    if corrupt and ops:
        at = (ops[0][1] * 997) % len(body)
        body = body[:at] + b"\x00" + body[at + 1:]
    _check(body, _prev(_body(BASE)))


@contextlib.contextmanager
def _decoder(fast: bool) -> Iterator[None]:
    old = wire.FAST
    wire.FAST = fast
    try:
        yield
    finally:
        wire.FAST = old


@pytest.mark.parametrize("fast", [True, False], ids=["msgspec", "orjson"])
def test_filter_echoes_the_passing_nodes_as_received(fast: bool) -> None:
    app = make_app(ExtenderSettings(), "flexinfer-system")
    rounds = [BASE, _edit(lambda xs: [*xs[:7], _changed(xs[7], "2"), *xs[8:]]),
              _edit(lambda xs: [make_node("new", free=9000), *xs[:20], *xs[22:]])]
    with _decoder(fast):
        for nodes in rounds:  # the first is split by msgspec, the next ones walked (fast)
            body = _body(nodes)
            reply = app.dispatch("POST", "/filter", body)
            assert reply.status == 200
            res = orjson.loads(reply.body)
            passed = res["NodeNames"]
            assert passed and set(passed) | set(res["FailedNodes"]) == {x["metadata"]["name"] for x in nodes}
            by_name = {x["metadata"]["name"]: x for x in nodes}
            echoed = res["Nodes"]["items"]
            assert [x["metadata"]["name"] for x in echoed] == passed
            for got in echoed:  # node by node, the decoded echo is the decoded input
                assert got == by_name[got["metadata"]["name"]]
            if fast:  # and on the fast path the very bytes of the request
                raw_in = {orjson.loads(bytes(r))["metadata"]["name"]: bytes(r) for r in Split.decode(
                    orjson.dumps(nodes))}
                answer_items = EchoDecoder.decode(reply.body).Nodes.items
                assert [bytes(r) for r in answer_items] == [raw_in[n] for n in passed]


@pytest.mark.parametrize("path", ["/filter", "/score"])
def test_malformed_bodies_are_400_on_the_walk_too(path: str) -> None:
    app = make_app(ExtenderSettings(), "flexinfer-system")
    assert app.dispatch("POST", path, _body(BASE)).status == 200  # now the walk has a previous request
    for bad in (CASES["malformed changed item"][0], CASES["malformed tail"][0], CASES["trailing comma"][0],
                CASES["a changed item that is no object"][0], b"", b"{", _body(BASE)[:-5]):
        reply = app.dispatch("POST", path, bad)
        assert reply.status == 400, (bad[-40:], reply)
        assert orjson.loads(reply.body)["Error"]


def test_many_changed_stretches_decline_to_the_split() -> None:
    """More stretches of new items than ``WALK_STRETCHES``: the walk declines (the msgspec split is as
    cheap then), so its extra work stays bounded; a few runs of 7 changed items are still walked."""
    many = _nodes(2 * wire.WALK_STRETCHES + 4)
    prev = _prev(_body(many))
    every_other = [_changed(x, "2") if i % 2 else x for i, x in enumerate(many)]
    assert wire.walk_items(_body(every_other), prev) is None
    assert wire.parse_args(_body(every_other)).items is not None
    runs = [_changed(x, "2") if i % 8 < 7 and i < 64 else x for i, x in enumerate(many)]
    walked = _check(_body(runs), prev)
    assert walked is not None and sum(k >= 0 for k in walked[1]) == len(many) - 56
