"""Status conditions: the typed ``Condition`` and pure helpers to read and set them.

Owns: the Kubernetes API convention for ``status.conditions`` (type, status True/False/Unknown,
CamelCase reason, message, lastTransitionTime, observedGeneration) and the rule that
``lastTransitionTime`` only moves when ``status`` changes. Condition types used by FlexInfer kinds
are named here.

Must not: talk to the API server; callers write the returned list into a status patch.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Literal

from flexinfer.api.common import format_time, opt_time

ConditionStatus = Literal["True", "False", "Unknown"]

# Condition types (Model; other kinds use a subset plus their own).
READY = "Ready"
SCHEDULABLE = "Schedulable"
CONFIG_VALID = "ConfigValid"
CACHED = "Cached"
LOADED = "Loaded"
SPEC_VALID = "SpecValid"
SYNCED = "Synced"


@dataclass(frozen=True, slots=True)
class Condition:
    """One entry of ``status.conditions``."""

    type: str
    status: ConditionStatus
    reason: str = ""
    message: str = ""
    last_transition_time: datetime | None = None
    observed_generation: int | None = None

    @property
    def is_true(self) -> bool:
        return self.status == "True"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type, "status": self.status, "reason": self.reason,
                               "message": self.message}
        if self.last_transition_time is not None:
            out["lastTransitionTime"] = format_time(self.last_transition_time)
        if self.observed_generation is not None:
            out["observedGeneration"] = self.observed_generation
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Condition | None:
        """A condition from a status entry, or None when the entry is unusable."""
        t, s = d.get("type"), d.get("status")
        if not isinstance(t, str) or s not in ("True", "False", "Unknown"):
            return None
        gen = d.get("observedGeneration")
        return cls(
            type=t,
            status=s,
            reason=str(d.get("reason") or ""),
            message=str(d.get("message") or ""),
            last_transition_time=opt_time(d.get("lastTransitionTime")),
            observed_generation=gen if isinstance(gen, int) and not isinstance(gen, bool) else None,
        )


def parse_conditions(raw: Iterable[Any] | None) -> tuple[Condition, ...]:
    """Typed conditions from ``status.conditions``; malformed entries are skipped."""
    out = []
    for d in raw or ():
        if isinstance(d, Mapping):
            c = Condition.from_dict(d)
            if c is not None:
                out.append(c)
    return tuple(out)


def find_condition(conditions: Sequence[Condition], type_: str) -> Condition | None:
    return next((c for c in conditions if c.type == type_), None)


def set_condition(conditions: Sequence[Condition], new: Condition, now: datetime) -> tuple[Condition, ...]:
    """``conditions`` with ``new`` put in place of the same type (appended if absent).

    ``lastTransitionTime`` is kept when the status does not change and set to ``now`` when it does.
    """
    out: list[Condition] = []
    placed = False
    for c in conditions:
        if c.type != new.type:
            out.append(c)
            continue
        keep = c.status == new.status and c.last_transition_time is not None
        out.append(replace(new, last_transition_time=c.last_transition_time if keep else now))
        placed = True
    if not placed:
        out.append(replace(new, last_transition_time=now))
    return tuple(out)


def conditions_to_list(conditions: Iterable[Condition]) -> list[dict[str, Any]]:
    """The JSON form for a status patch."""
    return [c.to_dict() for c in conditions]


class ConditionSet:
    """``status.conditions`` being rewritten by one reconcile: parsed from the observed list, each
    :meth:`set` stamped with the object's generation and ``now`` (see :func:`set_condition`)."""

    __slots__ = ("gen", "items", "now")

    def __init__(self, observed: Iterable[Any] | None, generation: int | None, now: datetime) -> None:
        self.items = parse_conditions(observed)
        self.gen = generation
        self.now = now

    def set(self, type_: str, status: ConditionStatus, reason: str, message: str) -> None:
        self.items = set_condition(self.items, Condition(type_, status, reason, message, None, self.gen), self.now)

    def to_list(self) -> list[dict[str, Any]]:
        """The JSON form for a status patch."""
        return conditions_to_list(self.items)
