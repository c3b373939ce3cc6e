"""GPUGroup (v1alpha1): ModelDeployments time-sharing one GPU, with anti-thrashing.

Owns ``decide`` (pure; ``shared/reference/flexinfer-upstream.md`` §2.5) and its shell:

- demand comes from the proxy's GPUGroup annotations ``flexinfer.ai/queue.<model>`` (queued
  requests) and ``flexinfer.ai/queue-since.<model>`` (RFC 3339);
- the winner is the member with a queue, then the highest priority, then the longest wait;
- no demand: the active member stays while its ``lastAccessTime`` is within its idle timeout (or it
  was swapped in within that time), else nothing is active (everything scales to zero);
- with nothing active, the winner starts at once; a *swap* away from an active member waits until
  the winner's queue reaches ``requestQueueThreshold`` (3) and has persisted for
  ``hysteresisWindowSeconds`` (10), and is blocked while the active member has run less than
  ``minimumRunDurationSeconds`` (30) or the winner was preempted less than
  ``cooldownAfterPreemptionSeconds`` (60) ago; ``antiThrashing.enabled: false`` lifts all of these;
- applying it is level-based: the active member's ``spec.replicas`` = its maxReplicas, every other
  member's = its minReplicas; a swap records ``activeModel``, ``lastSwapTime``, ``lastSwapReason``,
  ``swapCount`` and the loser's ``preemptedAt``/``preemptedBy``; Events ModelScaledUp/ModelScaledDown.

Phase: Idle (nothing active), Active (the active member is Running), Swapping (it is starting).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from flexinfer import labels
from flexinfer.api import GPUGroup, SpecError
from flexinfer.api.common import format_time, opt_time
from flexinfer.api.conditions import READY, ConditionSet, ConditionStatus
from flexinfer.api.gpugroup import AntiThrashing
from flexinfer.operator.api_resources import GPU_GROUP, MODEL_DEPLOYMENT
from flexinfer.operator.context import MD_Q, Operator
from flexinfer.operator.results import Event, Result


@dataclass(frozen=True, slots=True)
class MemberObs:
    """One member as observed now."""

    name: str
    priority: int = 100
    queue: int = 0
    queued_since: datetime | None = None
    last_access: datetime | None = None
    idle_timeout_s: float = 300.0
    preempted_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    active: str | None
    reason: str
    swap: bool  # the active member changes
    blocked: str | None = None  # why a wanted swap waits
    requeue_after: float | None = None


def _age(now: datetime, t: datetime | None) -> float | None:
    return None if t is None else (now - t).total_seconds()


def decide(at: AntiThrashing, current: str | None, last_swap: datetime | None, members: Sequence[MemberObs],
           now: datetime) -> Decision:
    """Which member should hold the GPU now (see the module docstring)."""
    by_name = {m.name: m for m in members}
    if current not in by_name:
        current = None
    demand = [m for m in members if m.queue > 0]
    if not demand:
        if current is not None:
            cur = by_name[current]
            ref = cur.last_access or last_swap
            age = _age(now, ref)
            if age is not None and age <= cur.idle_timeout_s:
                return Decision(current, "no demand; the active model is still warm", False,
                                requeue_after=cur.idle_timeout_s - age + 0.5)
        return Decision(None, "no demand", current is not None)
    far = datetime.max.replace(tzinfo=now.tzinfo)
    winner = sorted(demand, key=lambda m: (-m.priority, m.queued_since or far, m.name))[0]
    why = f"demand: queue={winner.queue}, priority={winner.priority}"
    if winner.name == current:
        return Decision(current, why, False)
    if current is None or not at.enabled:
        return Decision(winner.name, why, True)
    if winner.queue < at.request_queue_threshold:
        return Decision(current, f"{winner.name}: queue {winner.queue} below the threshold "
                                 f"{at.request_queue_threshold}", False)
    waited = _age(now, winner.queued_since)
    if at.hysteresis_window_s > 0 and (waited is None or waited < at.hysteresis_window_s):
        left = at.hysteresis_window_s - (waited or 0.0)
        return Decision(current, f"{winner.name}: demand younger than the hysteresis window", False,
                        blocked="hysteresis", requeue_after=left + 0.1)
    ran = _age(now, last_swap)
    if ran is not None and ran < at.minimum_run_duration_s:
        return Decision(current, f"{current} has not run the minimum {at.minimum_run_duration_s:g}s yet",
                        False, blocked="minimumRunDuration", requeue_after=at.minimum_run_duration_s - ran + 0.1)
    since = _age(now, winner.preempted_at)
    if since is not None and since < at.cooldown_after_preemption_s:
        return Decision(current, f"{winner.name} was preempted less than {at.cooldown_after_preemption_s:g}s ago",
                        False, blocked="cooldown",
                        requeue_after=at.cooldown_after_preemption_s - since + 0.1)
    return Decision(winner.name, why, True)


def members_from(group: GPUGroup, annotations: Mapping[str, str],
                 mds: Mapping[str, Mapping[str, Any]]) -> list[MemberObs]:
    """Observed members: demand from the group's annotations, activity from the ModelDeployments."""
    prev = {ms.name: ms for ms in group.status.model_statuses}
    out = []
    for m in group.spec.models:
        md = mds.get(m.name) or {}
        try:
            queue = max(0, int(annotations.get(labels.queue_key(m.name), "0") or 0))
        except ValueError:
            queue = 0
        spec = md.get("spec") or {}
        idle = spec.get("idleTimeoutSeconds")
        out.append(MemberObs(
            name=m.name, priority=m.priority, queue=queue,
            queued_since=opt_time(annotations.get(labels.queue_since_key(m.name))),
            last_access=opt_time((md.get("status") or {}).get("lastAccessTime")),
            idle_timeout_s=float(idle) if isinstance(idle, int | float) else 300.0,
            preempted_at=prev[m.name].preempted_at if m.name in prev else None))
    return out


async def reconcile_gpugroup(op: Operator, key: tuple[str, str]) -> Result:
    ns, name = key
    body = op.store.get(GPU_GROUP, ns, name)
    if body is None or (body.get("metadata") or {}).get("deletionTimestamp"):
        return Result()
    now = op.clock()
    gen = (body.get("metadata") or {}).get("generation") or 0
    conds = ConditionSet((body.get("status") or {}).get("conditions"), gen, now)
    try:
        group = GPUGroup.from_obj(body)
    except SpecError as e:
        conds.set(READY, "False", e.reason, e.message)
        await op.w.patch_status(GPU_GROUP, body, {"observedGeneration": gen, "phase": "Failed",
                                                  "conditions": conds.to_list()})
        return Result(permanent=f"{e.reason}: {e.message}")
    mds = {m.name: op.store.get(MODEL_DEPLOYMENT, m.namespace, m.name) or {} for m in group.spec.models}
    members = members_from(group, (body.get("metadata") or {}).get("annotations") or {}, mds)
    st = group.status
    d = decide(group.spec.anti_thrashing, st.active_model, st.last_swap_time, members, now)
    prev = {ms.name: ms for ms in st.model_statuses}
    statuses = []
    for spec_m, obs in zip(group.spec.models, members, strict=True):
        md = mds[spec_m.name]
        want = spec_m.max_replicas if d.active == spec_m.name else spec_m.min_replicas
        if md and (md.get("spec") or {}).get("replicas") != want:
            after = await op.w.patch(MODEL_DEPLOYMENT, md, {"spec": {"replicas": want}})
            if after is not None:
                up = d.active == spec_m.name
                op.record(body, Event("Normal", "ModelScaledUp" if up else "ModelScaledDown",
                                      f"{spec_m.name}: {want} replica(s) ({d.reason})"))
                op.trigger(MD_Q, (spec_m.namespace, spec_m.name))
        p = prev.get(spec_m.name)
        preempted_at, preempted_by = (p.preempted_at, p.preempted_by) if p else (None, None)
        just_preempted = d.swap and d.active is not None and spec_m.name == st.active_model
        if just_preempted:
            preempted_at, preempted_by = now, d.active
        if d.active == spec_m.name:
            state = "Active"
        elif obs.queue > 0:
            state = "Queued"
        elif just_preempted or (p is not None and p.state == "Preempted"):
            state = "Preempted"
        else:
            state = "Idle"
        statuses.append({"name": spec_m.name, "namespace": spec_m.namespace, "state": state,
                         "queuedRequests": obs.queue,
                         "queuedSince": format_time(obs.queued_since) if obs.queued_since else None,
                         "preemptedAt": format_time(preempted_at) if preempted_at else None,
                         "preemptedBy": preempted_by})
    active_md = mds.get(d.active or "") or {}
    running = int(((active_md.get("status") or {}).get("readyReplicas")) or 0) > 0
    phase = "Idle" if d.active is None else ("Active" if running else "Swapping")
    status: dict[str, Any] = {"observedGeneration": gen, "phase": phase, "activeModel": d.active or "",
                              "modelStatuses": statuses}
    if d.swap:
        status.update({"lastSwapTime": format_time(now), "lastSwapReason": d.reason[:1024],
                       "swapCount": st.swap_count + 1})
    ok: ConditionStatus = "True" if phase in ("Active", "Idle") else "False"
    conds.set(READY, ok, phase, (d.blocked and f"swap waits: {d.reason}") or d.reason)
    status["conditions"] = conds.to_list()
    await op.w.patch_status(GPU_GROUP, body, status)
    if d.swap:
        op.record(body, Event("Normal", "Swapped", f"{st.active_model or 'nothing'} -> {d.active or 'nothing'}: "
                                                   f"{d.reason}"))
        for m in group.spec.models:
            op.trigger(MD_Q, (m.namespace, m.name))
    requeue = op.settings.gpugroup_requeue_s
    if d.requeue_after is not None:
        requeue = min(requeue, d.requeue_after)
    return Result(requeue)
