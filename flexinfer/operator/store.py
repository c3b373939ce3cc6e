"""The operator's read model of the cluster: kopf indices plus the operator's own recent writes.

Owns: looking objects up by (kind, namespace, name) and listing them by namespace, from the kopf
indices that the watches keep current (``{(namespace, name): body}`` and ``{namespace: body}`` per
kind), corrected by an *overlay* of what this operator wrote and the watch has not delivered yet.

Why the overlay: after a create or a patch, the watch event arrives a little later. A reconcile that
runs in between (triggered by another event) would otherwise see the old object and write the same
change again. Each write records the answer and the resourceVersions it supersedes; the overlay entry
is dropped as soon as the watch delivers any other version (ours or a newer one), so a stale overlay
can cost at most one redundant write, never a lost update. A version known to be older than our
answer keeps the overlay too: one whose resourceVersion is a smaller decimal number (etcd revisions
are; this is the lagging event of a concurrent write, e.g. kopf's own annotation patch, which would
otherwise cost that redundant write, F19). Other resourceVersions are not ordered (opaque strings).
``seen`` also tells whether a watch event is the echo of an object
the operator itself created (nothing else can be in a create's answer, so no reconcile is needed; the
echo of a patch may carry someone else's concurrent change and is not reported as one).

Must not: talk to the API server (the reconcilers write through ``KubeClient`` and report here).
"""

from __future__ import annotations

import builtins
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from flexinfer.operator.api_resources import Kind

Key = tuple[str, str]  # (namespace or "", name)
Body = Mapping[str, Any]
Index = Mapping[Any, Iterable[Body]]


def obj_key(namespace: str | None, name: str) -> Key:
    return (namespace or "", name)


def rv_of(body: Mapping[str, Any] | None) -> str:
    return str(((body or {}).get("metadata") or {}).get("resourceVersion") or "")


def _older(rv: str, than: str) -> bool:
    """``rv`` is known to precede ``than``: both are decimal numbers and ``rv`` is the smaller."""
    return rv.isdigit() and than.isdigit() and int(rv) < int(than)


def _key_of(body: Mapping[str, Any]) -> Key:
    md = body.get("metadata") or {}
    return obj_key(md.get("namespace"), str(md.get("name") or ""))


@dataclass
class _Pending:
    body: dict[str, Any] | None  # None: deleted by us
    stale: set[str] = field(default_factory=set)


class Store:
    """Index-backed lookups with an overlay of own writes (see the module docstring)."""

    def __init__(self) -> None:
        self._by_key: dict[str, Index] = {}
        self._by_ns: dict[str, Index] = {}
        self._overlay: dict[str, dict[Key, _Pending]] = {}
        self._created: dict[tuple[str, Key], str] = {}

    # ---- wiring -----------------------------------------------------------------------------------

    def bind(self, kind: Kind, by_key: Index, by_namespace: Index | None = None) -> None:
        """Use kopf indices (or plain mappings of key -> [body]) for ``kind``: one keyed by
        (namespace, name), and optionally one keyed by namespace ("" for cluster-scoped kinds)."""
        self._by_key[kind.key] = by_key
        if by_namespace is not None:
            self._by_ns[kind.key] = by_namespace

    def bound(self, kind: Kind) -> bool:
        return kind.key in self._by_key

    # ---- reads ------------------------------------------------------------------------------------

    def _indexed(self, kind: Kind, key: Key) -> Body | None:
        idx = self._by_key.get(kind.key)
        if idx is None or key not in idx:
            return None
        for body in idx[key]:
            return body
        return None

    def get(self, kind: Kind, namespace: str | None, name: str) -> Body | None:
        """The freshest known state of an object, or None when absent (or deleted by us)."""
        key = obj_key(namespace, name)
        cur = self._indexed(kind, key)
        ov = self._overlay.get(kind.key)
        pending = ov.get(key) if ov else None
        if pending is None:
            return cur
        if cur is None or rv_of(cur) in pending.stale or _older(rv_of(cur), rv_of(pending.body)):
            return pending.body
        del ov[key]  # type: ignore[union-attr]  # the watch moved past our write
        return cur

    def _indexed_bodies(self, kind: Kind, namespace: str | None) -> Iterable[Body]:
        by_ns = self._by_ns.get(kind.key)
        if by_ns is not None:
            if namespace is not None:
                ns = namespace or ""
                return list(by_ns[ns]) if ns in by_ns else []
            return [b for ns in list(by_ns) for b in by_ns[ns]]
        idx = self._by_key.get(kind.key) or {}
        return [b for k in list(idx) if namespace is None or k[0] == namespace for b in idx[k]]

    def list(self, kind: Kind, namespace: str | None = None) -> list[Body]:
        """Every object of ``kind`` (in ``namespace`` when given), freshest state."""
        ov = self._overlay.get(kind.key) or {}
        out: list[Body] = []
        done: set[Key] = set()
        for body in self._indexed_bodies(kind, namespace):
            key = _key_of(body)
            done.add(key)
            if key not in ov:
                out.append(body)
                continue
            fresh = self.get(kind, key[0] or None, key[1])
            if fresh is not None:
                out.append(fresh)
        for key, p in list(ov.items()):
            if key in done or p.body is None or (namespace is not None and key[0] != (namespace or "")):
                continue
            fresh = self.get(kind, key[0] or None, key[1])
            if fresh is not None:
                out.append(fresh)
        return out

    def keys_of(self, kind: Kind) -> builtins.list[Key]:
        """Keys of every indexed object of ``kind``."""
        return [*(self._by_key.get(kind.key) or ())]

    # ---- own writes -------------------------------------------------------------------------------

    def _pending(self, kind: Kind, key: Key) -> _Pending:
        return self._overlay.setdefault(kind.key, {}).setdefault(key, _Pending(None))

    def wrote(self, kind: Kind, before: Mapping[str, Any] | None, after: Mapping[str, Any] | None) -> None:
        """Record a create (``before`` None) or an update: ``after`` is the server's answer."""
        if after is None:
            return
        key = _key_of(after)
        pending = self._pending(kind, key)
        if before is not None and rv_of(before):
            pending.stale.add(rv_of(before))
        pending.body = dict(after)
        if before is None:
            self._created[(kind.key, key)] = rv_of(after)

    def deleted(self, kind: Kind, namespace: str | None, name: str, before: Mapping[str, Any] | None) -> None:
        """Record a delete of an object whose last known state was ``before``."""
        pending = self._pending(kind, obj_key(namespace, name))
        if before is not None and rv_of(before):
            pending.stale.add(rv_of(before))
        pending.body = None

    # ---- watch feedback ---------------------------------------------------------------------------

    def seen(self, kind: Kind, body: Mapping[str, Any], deleted: bool = False) -> bool:
        """The watch delivered ``body`` (already in the index): drop the overlay entry it supersedes.
        True when the event is the echo of this operator's own create of the object."""
        key = _key_of(body)
        rv = rv_of(body)
        echo = not deleted and bool(rv) and self._created.pop((kind.key, key), None) == rv
        ov = self._overlay.get(kind.key)
        pending = ov.get(key) if ov else None
        if pending is not None and (deleted or (rv not in pending.stale and not _older(rv, rv_of(pending.body)))):
            del ov[key]  # type: ignore[union-attr]
        return echo

    @property
    def overlay_size(self) -> int:
        return sum(len(v) for v in self._overlay.values())
