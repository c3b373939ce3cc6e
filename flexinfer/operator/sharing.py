"""Shared-GPU leader choice: which member of a group of models that share one GPU runs now.

One pure function used by both the Kubernetes operator (``spec.gpu.shared``) and the local runtime
(``group`` in the local config), so a laptop and a cluster swap models by the same rules
(original: ``chooseSharedGroupLeader``; ``shared/reference/flexinfer-upstream.md`` §2.4):

1. If any member was preempted within the cooldown (max(5 m, every member's swap cooldown)), the
   member that is Active stays (no thrashing). If none is Active, continue.
2. Candidates: ``ready`` (phase Ready), ``recent`` (active within 5 m), ``demanded`` (active within
   the 2 m demand window), ``fallback`` (everyone); each reduced to its best member by
   :func:`better`: higher priority, then newer activity (only when both have one), then the smaller
   name.
3. The demanded leader wins when the ready leader is idle (no activity or older than the demand
   window) and has no higher priority, or when it has a strictly higher priority than the ready
   leader (a higher-priority demand may preempt a busy lower-priority model).
4. Otherwise: ready, then recent, then fallback.

Times are seconds (``time.time()`` or any monotonic-ish clock; only differences matter).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

DEMAND_WINDOW = 120.0
RECENT_WINDOW = 300.0
MIN_COOLDOWN = 300.0
DEFAULT_PRIORITY = 100


@dataclass(frozen=True, slots=True)
class Member:
    """What the leader choice needs to know about one model of a shared group."""

    name: str
    priority: int = DEFAULT_PRIORITY
    phase: str = ""  # Ready, Loading, Pending, Idle, Failed, ...
    last_active: float | None = None
    state: str = ""  # Active, Queued, Preempted, or "" when unknown
    preempted_at: float | None = None
    swap_cooldown: float = MIN_COOLDOWN


@dataclass(frozen=True, slots=True)
class Windows:
    """The rule's time constants (scaled down in tests)."""

    demand: float = DEMAND_WINDOW
    recent: float = RECENT_WINDOW
    min_cooldown: float = MIN_COOLDOWN


def better(a: Member, b: Member) -> bool:
    """True when ``a`` should lead rather than ``b``."""
    if a.priority != b.priority:
        return a.priority > b.priority
    if a.last_active is not None and b.last_active is not None and a.last_active != b.last_active:
        return a.last_active > b.last_active
    return a.name < b.name


def best(members: Iterable[Member]) -> Member | None:
    out: Member | None = None
    for m in members:
        if out is None or better(m, out):
            out = m
    return out


def cooldown_of(members: Sequence[Member], windows: Windows = Windows()) -> float:
    return max([windows.min_cooldown, *(m.swap_cooldown for m in members)])


def _within(t: float | None, now: float, window: float) -> bool:
    return t is not None and now - t <= window


def choose_leader(members: Sequence[Member], now: float, windows: Windows = Windows()) -> str | None:
    """The name of the member that should hold the GPU now (None for an empty group)."""
    if not members:
        return None
    cooldown = cooldown_of(members, windows)
    if any(_within(m.preempted_at, now, cooldown) for m in members):
        active = best(m for m in members if m.state == "Active")
        if active is not None:
            return active.name
    ready = best(m for m in members if m.phase == "Ready")
    recent = best(m for m in members if _within(m.last_active, now, windows.recent))
    demanded = best(m for m in members if _within(m.last_active, now, windows.demand))
    if demanded is not None and ready is not None and demanded is not ready:
        ready_idle = not _within(ready.last_active, now, windows.demand)
        if (ready_idle and demanded.priority >= ready.priority) or demanded.priority > ready.priority:
            return demanded.name
    for pick in (ready, recent):
        if pick is not None:
            return pick.name
    fb = best(members)
    return fb.name if fb else None


def queue_positions(members: Sequence[Member], leader: str | None) -> dict[str, int]:
    """0 for the leader; the others 1-based by priority descending, then name."""
    others = sorted((m for m in members if m.name != leader), key=lambda m: (-m.priority, m.name))
    out = {m.name: i + 1 for i, m in enumerate(others)}
    if leader is not None:
        out[leader] = 0
    return out
