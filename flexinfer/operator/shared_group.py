"""Shared-GPU groups of Models: who holds the GPU, and what every member's ``status.sharedGroup`` says.

Owns applying the leader choice (:func:`flexinfer.sharing.choose_leader`, the same function the local runtime
uses) to a group of Models (``spec.gpu.shared``), as the original's ``handleSharedGPU`` did
(``shared/reference/flexinfer-upstream.md`` §2.4):

- the leader is ``Active`` with ``queuePosition`` 0;
- the others are ``Queued`` with ``preemptedBy`` = the leader and a 1-based ``queuePosition``
  (priority descending, then name); a loser that was Ready becomes ``Preempted`` with
  ``preemptedAt`` = now and an Event "Preempted by X with priority N"; ``preemptedAt`` is kept (the
  cooldown reads it) until the member leads again;
- Failed members never lead; which members stop for the leader is :func:`flexinfer.sharing.evictions`
  (one group per GPU here, so no cross-group policy: its other Ready members);
- the late refinements (``forcePromotion``, ``warmPolicy: primary``, cache gating, the cold-start
  hold) are read from each member by ``model.member_state`` and decided by ``choose_leader``; the
  hold is measured from ``status.loadingProgressAt``, which ``model_logic`` sets when a load starts;
- (the Service annotation ``ai.flexinfer/active-services`` follows each member's own state: see
  ``model_logic``);
- the next instant the choice may change by itself (a window, cooldown or cold-start hold ending) is
  returned so the group is looked at again then.

Must not: do I/O or read the clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from flexinfer.api.common import format_time
from flexinfer.operator.results import Event
from flexinfer.sharing import (
    LOADING_PHASES,
    Member,
    Windows,
    choose_leader,
    cooldown_of,
    evictions,
    queue_positions,
)


@dataclass(frozen=True, slots=True)
class GroupMemberState:
    """What the group plan reads of one member."""

    name: str
    priority: int = 100
    phase: str = ""
    last_active: datetime | None = None
    state: str = ""  # status.sharedGroup.state when it names this group
    preempted_at: datetime | None = None
    swap_cooldown_s: float = 300.0
    service_labels: tuple[str, ...] = ()
    force_promotion: bool = False  # spec.gpu.forcePromotion
    primary: bool = False  # spec.config.warmPolicy == "primary"
    cache_ready: bool = True  # the Cached condition is True
    loading_since: datetime | None = None  # status.loadingProgressAt while Pending/Loading
    cold_start_timeout_s: float = 60.0  # spec.serverless.coldStartTimeout


@dataclass(frozen=True, slots=True)
class GroupPlan:
    leader: str | None
    shared_status: dict[str, dict[str, Any]]  # member -> desired status.sharedGroup
    events: dict[str, list[Event]]  # member -> events
    next_check: float | None  # seconds


def _ts(dt: datetime | None) -> float | None:
    return None if dt is None else dt.timestamp()


def plan_group(group: str, members: Sequence[GroupMemberState], now: datetime,
               windows: Windows = Windows()) -> GroupPlan:
    """The state of every member of ``group`` now."""
    t = now.timestamp()
    candidates = [Member(name=m.name, priority=m.priority, phase=m.phase, last_active=_ts(m.last_active),
                         state=m.state, preempted_at=_ts(m.preempted_at), swap_cooldown=m.swap_cooldown_s,
                         force_promotion=m.force_promotion, primary=m.primary, cache_ready=m.cache_ready,
                         loading_since=_ts(m.loading_since), cold_start_timeout=m.cold_start_timeout_s)
                  for m in members if m.phase != "Failed"]
    leader = choose_leader(candidates, t, windows)
    everyone = [Member(name=m.name, priority=m.priority) for m in members]
    positions = queue_positions(everyone, leader)
    by_name = {m.name: m for m in members}
    lead = by_name.get(leader) if leader else None
    # the Ready losers stop (become Preempted): the eviction rule the local runtime applies too
    evicted = set(evictions(leader, group, [(m.name, group) for m in members if m.phase == "Ready"])
                  ) if leader is not None else set()
    statuses: dict[str, dict[str, Any]] = {}
    events: dict[str, list[Event]] = {}
    for m in members:
        ev: list[Event] = []
        if m.name == leader:
            st = {"groupName": group, "state": "Active", "queuePosition": 0, "preemptedBy": None,
                  "preemptedAt": None}
            if m.state != "Active":
                ev.append(Event("Normal", "Activated", f"holds the GPU of group {group}"))
        else:
            preempted_at = m.preempted_at
            if m.state == "Preempted":
                state = "Preempted"
            elif m.name in evicted:
                state, preempted_at = "Preempted", now
                prio = lead.priority if lead else 0
                ev.append(Event("Normal", "Preempted", f"Preempted by {leader} with priority {prio}"))
            else:
                state = "Queued"
            st = {"groupName": group, "state": state, "queuePosition": positions.get(m.name, 0) or None,
                  "preemptedBy": leader, "preemptedAt": format_time(preempted_at) if preempted_at else None}
        statuses[m.name] = st
        if ev:
            events[m.name] = ev
    return GroupPlan(leader, statuses, events, _next_check(candidates, t, windows))


def _next_check(members: Sequence[Member], now: float, windows: Windows) -> float | None:
    """Seconds until a demand/recent window, a cooldown or a cold-start hold of some member ends
    (None: never)."""
    cooldown = cooldown_of(members, windows) if members else windows.min_cooldown
    edges: list[float] = []
    for m in members:
        if m.last_active is not None:
            edges += [m.last_active + windows.demand, m.last_active + windows.recent]
        if m.preempted_at is not None:
            edges.append(m.preempted_at + cooldown)
        if m.loading_since is not None and m.phase in LOADING_PHASES:
            edges.append(m.loading_since + m.cold_start_timeout)
    future = [e - now for e in edges if e > now]
    return min(future) + 0.1 if future else None

