"""Shared-GPU leader choice: which member of a group of models that share one GPU runs now.

One pure function used by both the Kubernetes operator (``spec.gpu.shared``) and the local runtime
(``group`` in the local config), so a laptop and a cluster swap models by the same rules
(original: ``chooseSharedGroupLeader`` with its late refinements; ``shared/reference/
flexinfer-upstream.md`` §2.4). "Demanded" means active within the demand window (2 m); a member's
*hold* is Active with phase Pending or Loading and ``loading_since`` within its ``cold_start_timeout``.
The first stage that picks someone decides:

1. **Force promotion.** Among the demanded members with ``force_promotion`` whose cache is ready:
   the one already Active keeps the lead unless another has a strictly higher priority (two forced
   models never ping-pong on alternating requests); otherwise the best by :func:`better`. Forcing
   wins over every later stage: the swap cooldown, a hold, a Ready (even busy or higher-priority)
   leader. That is the contract of ``gpu.forcePromotion`` ("take the shared GPU now").
2. **Cooldown.** If any member was preempted within the cooldown (max(5 m, every member's swap
   cooldown)), the member that is Active stays (no thrashing). If none is Active, continue.
3. **Cold-start hold.** An Active member that is still loading (its hold) keeps the lead, so a swap
   never cuts a model mid-load; the hold ends by itself after ``cold_start_timeout``.
4. Candidates: ``ready`` (phase Ready), ``recent`` (active within 5 m), ``demanded`` (demanded and
   its cache ready: a model whose files are not in place cannot take a loaded model's GPU),
   ``primary`` (``primary``: ``config.warmPolicy: primary``), ``fallback`` (everyone); each reduced
   to its best member by :func:`better`: higher priority, then newer activity (only when both have
   one), then the smaller name.
5. The demanded leader wins when the ready leader is idle (no activity or older than the demand
   window) and has no higher priority, or when it has a strictly higher priority than the ready
   leader (a higher-priority demand may preempt a busy lower-priority model).
6. Otherwise: ready, then recent, then primary (the member to keep warm when nobody asks), then
   fallback.

Across groups (the local runtime's ``groups:``; the operator has one group per GPU and uses the
defaults) :func:`evictions` says what must stop before a member starts: the other running members of
its own group (one at a time, whatever the policies), and, when its group is ``exclusive``, every
running model of another group (or of none) unless that group is ``persistent`` (llama-swap's
``exclusive``/``persistent``; a persistent group still swaps among its own members).

Every new :class:`Member` field defaults to "no refinement" (not forced, not primary, cache ready,
no hold), which is how the local runtime builds its members. Times are seconds (``time.time()`` or
any monotonic-ish clock; only differences matter).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

DEMAND_WINDOW = 120.0
RECENT_WINDOW = 300.0
MIN_COOLDOWN = 300.0
DEFAULT_PRIORITY = 100
DEFAULT_COLD_START = 60.0
LOADING_PHASES = frozenset({"Pending", "Loading"})


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
    force_promotion: bool = False  # gpu.forcePromotion
    primary: bool = False  # config.warmPolicy == "primary"
    cache_ready: bool = True  # the model files are in place (Cached=True)
    loading_since: float | None = None  # when the current load started (None: not loading / unknown)
    cold_start_timeout: float = DEFAULT_COLD_START  # how long a load may hold the lead


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


def holds(m: Member, now: float) -> bool:
    """``m`` is Active and still loading within its cold-start timeout (nobody but a forced model may
    take the GPU from it)."""
    return (m.state == "Active" and m.phase in LOADING_PHASES
            and _within(m.loading_since, now, m.cold_start_timeout))


def _forced(members: Sequence[Member], now: float, windows: Windows) -> Member | None:
    forced = [m for m in members
              if m.force_promotion and m.cache_ready and _within(m.last_active, now, windows.demand)]
    top = best(forced)
    active = best(m for m in forced if m.state == "Active")
    if active is not None and top is not None and top.priority <= active.priority:
        return active
    return top


def choose_leader(members: Sequence[Member], now: float, windows: Windows = Windows()) -> str | None:
    """The name of the member that should hold the GPU now (None for an empty group)."""
    if not members:
        return None
    forced = _forced(members, now, windows)
    if forced is not None:
        return forced.name
    cooldown = cooldown_of(members, windows)
    if any(_within(m.preempted_at, now, cooldown) for m in members):
        active = best(m for m in members if m.state == "Active")
        if active is not None:
            return active.name
    loading = best(m for m in members if holds(m, now))
    if loading is not None:
        return loading.name
    ready = best(m for m in members if m.phase == "Ready")
    recent = best(m for m in members if _within(m.last_active, now, windows.recent))
    demanded = best(m for m in members if m.cache_ready and _within(m.last_active, now, windows.demand))
    if demanded is not None and ready is not None and demanded is not ready:
        ready_idle = not _within(ready.last_active, now, windows.demand)
        if (ready_idle and demanded.priority >= ready.priority) or demanded.priority > ready.priority:
            return demanded.name
    for pick in (ready, recent, best(m for m in members if m.primary)):
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


@dataclass(frozen=True, slots=True)
class GroupPolicy:
    """How a group treats the other groups (defaults: it leaves them alone and may be unloaded)."""

    exclusive: bool = False  # starting one of its members unloads every other non-persistent model
    persistent: bool = False  # its members are never unloaded by another group's start


NO_POLICY = GroupPolicy()


def evictions(starting: str, group: str | None, running: Iterable[tuple[str, str | None]],
              policies: Mapping[str, GroupPolicy] | None = None) -> list[str]:
    """The models (sorted) to stop before ``starting`` (a member of ``group``, None: no group) runs.

    ``running``: (name, group) of every model running or starting now. The other members of its own
    group always go (a group runs one member at a time); with ``exclusive`` on its group, so does every
    model of another group, or of no group, whose group is not ``persistent``."""
    policies = policies or {}
    exclusive = group is not None and policies.get(group, NO_POLICY).exclusive
    out: set[str] = set()
    for name, g in running:
        same = group is not None and g == group
        spared = g is not None and policies.get(g, NO_POLICY).persistent
        if name != starting and (same or (exclusive and not spared)):
            out.add(name)
    return sorted(out)
