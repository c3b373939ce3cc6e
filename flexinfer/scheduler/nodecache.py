"""Node facts of NodeList requests, cached by the node's exact JSON.

Owns: :class:`NodeFactsCache`, which turns the ``Nodes.items`` of a ``nodeCacheCapable: false``
request (raw JSON views, :attr:`flexinfer.scheduler.wire.ExtenderArgs.items`) into
:class:`~flexinfer.scheduler.logic.NodeFacts`. kube-scheduler sends the same Node objects from its
informer cache on every call, so facts computed once for an item's bytes hold for as long as those
bytes come back: a changed node (new resourceVersion, annotations, anything) is different bytes, is
decoded and parsed again, and can never be served stale facts (reliability plan F20).

Lookup cost (5,000 items of ~4 KiB per call): each item is hashed where it lies in the request body
(xxh3-128 with a per-process random seed, ~1 µs for 4 KiB, no copy), the hash finds the entry, and
the entry's own copy of the item's bytes is compared with the item (one memcmp): a hit is exact,
never a hash guess. Keying by ``name`` + ``resourceVersion`` instead would need the item decoded to
find them (msgspec: ~45 ms for 5,000 items, more than hashing all of them) and would trust that the
sender never reuses a resourceVersion. Only new items are copied (the entry keeps its own bytes,
never a view that would pin a whole request body). Two bounded generations keep memory at most
``2 × max_entries`` items: when the current one is full it becomes the previous one; a hit in the
previous one is moved forward. Entries are plain tuples of atomic values, which the garbage
collector untracks: the cache costs a full collection nothing however many nodes it holds.

When :func:`~flexinfer.scheduler.wire.walk_items` read the request against the slot's previous one
(the common case), ``known`` says which items are byte-identical to which previous ones: those are
hits without hashing or comparing again.

Must not: do I/O, or key facts by anything less than the whole item.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from operator import eq
from typing import Any, cast

from msgspec import Raw
from xxhash import xxh3_128_intdigest

from flexinfer.scheduler.logic import NodeFacts, node_facts
from flexinfer.scheduler.wire import WireNode, item_doc

Entry = tuple[Any, NodeFacts]
"""(the item's JSON, owned: ``msgspec.Raw``; its facts). Neither is a GC-tracked type (``NodeFacts``
is a ``gc=False`` struct), so the collector untracks the entries and the generations: the cache
costs a full collection nothing however many nodes it holds (as tracked objects, 20-30 ms)."""


def _owned(raw: Any) -> Any:
    """A copy of ``raw`` that owns its bytes and compares equal (``==``, memcmp) to views of them."""
    if isinstance(raw, Raw):
        return raw.copy()
    return Raw(bytes(raw))


class NodeFactsCache:
    """item JSON → facts; hits and misses are counted for tests and the bench."""

    def __init__(self, max_entries: int = 20000) -> None:
        self.max_entries = max_entries
        self.seed = random.SystemRandom().getrandbits(64)
        self.current: dict[int, Entry] = {}
        self.previous: dict[int, Entry] = {}
        self.last: dict[str, list[Entry]] = {}  # per slot, the entries of its previous request
        self.hits = 0
        self.misses = 0

    def previous_items(self, slot: str = "") -> list[Any]:
        """The items of the previous request of ``slot`` (owned copies), for
        :func:`flexinfer.scheduler.wire.walk_items`."""
        return [e[0] for e in self.last.get(slot, ())]

    def _put(self, key: int, entry: Entry) -> None:
        if len(self.current) >= self.max_entries:
            self.previous, self.current = self.current, {}
        self.current[key] = entry

    def _slow(self, i: int, raw: Any, key: int) -> Entry:
        """Not in the current generation (or a hash twin there): the previous one, else decode and
        parse the item."""
        entry = self.previous.pop(key, None)
        if entry is None or entry[0] != raw:
            entry = (_owned(raw), node_facts(item_doc(i, raw)[1]))
            self.misses += 1
        self._put(key, entry)
        return entry

    def resolve(self, items: Sequence[Any], slot: str = "", known: Sequence[int] | None = None) -> list[NodeFacts]:
        """Facts of each raw item, in order (``NodeFacts.name`` is the item's ``metadata.name``).
        Raises :class:`~flexinfer.scheduler.wire.WireError` for a new item without a name.

        ``known`` (from :func:`~flexinfer.scheduler.wire.walk_items`): ``known[i] = k`` when item
        ``i`` is byte-identical to item ``k`` of the previous request of ``slot``, -1 when not.
        Without it, column-wise, so that the per-item work runs in C (``map``): each item is
        compared with the item at its position in the previous request of the same ``slot`` (the
        verb: kube-scheduler sends its nodes in the same order call after call, and ``/filter``
        gets all of them while ``/prioritize`` gets the survivors): equal bytes are a hit without
        hashing, and a different item differs in its first bytes (its name), so the compare stops
        early. The others are hashed and looked up, the hash twin's bytes compared, and only real
        misses decoded."""
        n = len(items)
        last = self.last.get(slot, [])
        entries: list[Entry | None]
        if known is not None:
            entries = [last[k] if k >= 0 else None for k in known]
            todo = [i for i, k in enumerate(known) if k < 0]
        else:
            entries = list(last[:n])
            entries += [None] * (n - len(entries))
            if last:
                same = list(map(eq, [e[0] if e is not None else None for e in entries], items))
                todo = [i for i, ok in enumerate(same) if not ok]
            else:
                todo = list(range(n))
        if todo:
            misses = self.misses
            h, seed, get = xxh3_128_intdigest, self.seed, self.current.get
            for i in todo:
                raw = items[i]
                key = h(raw, seed)
                entry = get(key)
                if entry is None or entry[0] != raw:
                    entry = self._slow(i, raw, key)
                    get = self.current.get  # the generation may have turned over
                entries[i] = entry
            self.hits += len(todo) - (self.misses - misses)
        self.hits += n - len(todo)
        found = cast("list[Entry]", entries)
        self.last[slot] = found
        return [e[1] for e in found]

    def facts(self, nodes: Iterable[WireNode]) -> list[NodeFacts]:
        """Facts of each node of the full decode (parsed every call: the slow path), in order."""
        out = [node_facts(n.doc()) for n in nodes]
        self.misses += len(out)
        return out
