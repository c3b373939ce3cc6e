"""Selective merge: what must change in an observed object to carry the fields the operator manages.

Owns: the comparison that makes a reconcile with nothing to change write **nothing**. The desired
object names only the fields the operator manages; everything else in the observed object (API
server defaults such as ``terminationMessagePath``, ``clusterIP``, ``revisionHistoryLimit``, other
controllers' labels and annotations) is ignored. Rules:

- a desired mapping is compared key by key; keys the desired side does not name are left alone,
  except under an *owned* path (a map the operator owns entirely), where extra keys are removed;
- a desired ``None`` means "absent": a present key is removed (``null`` in the merge patch);
- lists are atomic (JSON merge patch replaces them): equal when they have the same length and each
  desired element is a subset of the observed one (so defaults inside containers, ports and volumes
  do not count); otherwise the whole desired list is sent;
- resource quantities compare by value (``1Gi`` == ``1024Mi``), as the API server canonicalises them.

Pure functions on JSON-like values; no I/O.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from flexinfer.api.common import SpecError, parse_quantity

Path = tuple[str, ...]
#: keys whose values (or whose values' values) are resource quantities
_QUANTITY_PARENTS = frozenset({"limits", "requests", "capacity", "allocatable"})
_QUANTITY_KEYS = frozenset({"sizeLimit", "storage"})


def strip_none(value: Any) -> Any:
    """``value`` without ``None`` entries in mappings (a desired object ready to create)."""
    if isinstance(value, Mapping):
        return {k: strip_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [strip_none(v) for v in value]
    return value


def _is_quantity_ctx(key: str | None, parent: str | None) -> bool:
    return key in _QUANTITY_KEYS or parent in _QUANTITY_PARENTS


def _scalar_equal(d: Any, o: Any, key: str | None, parent: str | None) -> bool:
    if d == o and type(d) is type(o):
        return True
    if isinstance(d, bool) or isinstance(o, bool):
        return False
    if isinstance(d, int | float) and isinstance(o, int | float):
        return float(d) == float(o)
    if _is_quantity_ctx(key, parent) and isinstance(d, str | int | float) and isinstance(o, str | int | float):
        try:
            return parse_quantity(d) == parse_quantity(o)
        except SpecError:
            return False
    return False


def is_subset(desired: Any, observed: Any, key: str | None = None, parent: str | None = None) -> bool:
    """Whether ``observed`` already carries everything ``desired`` says (see the module rules)."""
    if isinstance(desired, Mapping):
        if not isinstance(observed, Mapping):
            return False
        for k, v in desired.items():
            if v is None:
                if observed.get(k) is not None:
                    return False
            elif k not in observed or not is_subset(v, observed[k], k, key):
                return False
        return True
    if isinstance(desired, list):
        return (isinstance(observed, list) and len(desired) == len(observed)
                and all(is_subset(d, o, None, key) for d, o in zip(desired, observed, strict=True)))
    return _scalar_equal(desired, observed, key, parent)


def merge_patch(desired: Mapping[str, Any], observed: Mapping[str, Any] | None,
                owned: Collection[Path] = (), _path: Path = ()) -> dict[str, Any]:
    """The JSON merge patch that brings ``observed`` to carry ``desired``; ``{}`` when nothing differs.

    ``owned`` lists paths (``("metadata", "labels")``, ...) of maps the operator owns entirely:
    their keys missing from ``desired`` are removed.
    """
    observed = observed or {}
    out: dict[str, Any] = {}
    parent = _path[-1] if _path else None
    for k, v in desired.items():
        here = (*_path, k)
        if v is None:
            if observed.get(k) is not None:
                out[k] = None
            continue
        o = observed.get(k)
        if isinstance(v, Mapping) and isinstance(o, Mapping):
            sub = merge_patch(v, o, owned, here)
            if sub:
                out[k] = sub
        elif not is_subset(v, o, k, parent):
            out[k] = strip_none(v)
    if _path in owned:
        for k in observed:
            if k not in desired:
                out[k] = None
    return out
