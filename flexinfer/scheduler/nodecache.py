"""Node facts of NodeList requests, cached by the node's exact JSON.

Owns: :class:`NodeFactsCache`, which turns the :class:`~flexinfer.scheduler.wire.WireNode` items of a
``nodeCacheCapable: false`` request into :class:`~flexinfer.scheduler.logic.NodeFacts`. kube-scheduler
sends the same Node objects from its informer cache on every call, so facts computed once for an
item's bytes hold for as long as those bytes come back: a changed node (new resourceVersion,
annotations, anything) is different bytes, is decoded and parsed again, and can never be served stale
facts (reliability plan F20). Two bounded generations keep memory at most ``2 × max_entries`` items:
when the current one is full it becomes the previous one; a hit in the previous one is moved forward.
Must not: do I/O, or key facts by anything less than the whole item.
"""

from __future__ import annotations

from collections.abc import Iterable

from flexinfer.scheduler.logic import NodeFacts, node_facts
from flexinfer.scheduler.wire import WireNode


class NodeFactsCache:
    """item JSON → facts; hits and misses are counted for tests and the bench."""

    def __init__(self, max_entries: int = 20000) -> None:
        self.max_entries = max_entries
        self.current: dict[bytes, NodeFacts] = {}
        self.previous: dict[bytes, NodeFacts] = {}
        self.hits = 0
        self.misses = 0

    def get(self, raw: bytes) -> NodeFacts | None:
        """Facts for this exact item JSON (:func:`flexinfer.scheduler.wire.parse_args` ``known``)."""
        f = self.current.get(raw)
        if f is None:
            f = self.previous.pop(raw, None)
            if f is not None:
                self._put(raw, f)
        return f

    def _put(self, raw: bytes, f: NodeFacts) -> None:
        if len(self.current) >= self.max_entries:
            self.previous, self.current = self.current, {}
        self.current[raw] = f

    def facts(self, nodes: Iterable[WireNode]) -> list[NodeFacts]:
        """Facts for each node, in order."""
        out: list[NodeFacts] = []
        hits = 0
        for n in nodes:
            raw = n.raw
            if raw is not None:
                f = n.known if isinstance(n.known, NodeFacts) else self.get(raw)
                if f is not None:
                    out.append(f)
                    hits += 1
                    continue
            f = node_facts(n.doc())
            if raw is not None:
                self._put(raw, f)
            out.append(f)
        self.hits += hits
        self.misses += len(out) - hits
        return out
