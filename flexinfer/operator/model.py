"""Model (v1alpha2) reconcile shells: gather observed state, run the pure plan, apply it.

Owns, for one Model: the finalizer ``flexinfer.ai/model-cleanup`` (added before any child exists;
on deletion the Deployment, Service, cache Jobs and owned cache PVC are deleted, a tmpfs-cleanup Job
is started for shared Models with a nodeSelector, then the finalizer goes), applying
``model_logic.plan_model`` through the writer (zero writes when nothing differs) and the Events of
status transitions. For one shared-GPU group (namespace, ``spec.gpu.shared``): applying
``shared_group.plan_group`` to every member's ``status.sharedGroup``, then waking the members whose state
changed (their replicas follow it).

Must not: decide anything itself; the rules live in ``model_logic`` and ``shared_group``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from flexinfer import labels
from flexinfer.api import Model, ModelCache, ModelSpec, ModelStatus, ObjectMeta, SpecError
from flexinfer.api.common import check_kind, opt_time, parse_duration
from flexinfer.api.conditions import CACHED
from flexinfer.operator import builders
from flexinfer.operator.api_resources import DEPLOYMENT, JOB, LORA, MODEL, MODEL_CACHE, NODE, PVC, SERVICE
from flexinfer.operator.context import GROUP_Q, LORA_Q, MODEL_Q, Operator
from flexinfer.operator.jobs import tmpfs_cleanup_job
from flexinfer.operator.model_logic import (
    ModelInputs,
    alias_conflicts,
    claimed_names,
    plan_model,
    transition_events,
)
from flexinfer.operator.results import Result
from flexinfer.operator.shared_group import GroupMemberState, plan_group
from flexinfer.sharing import LOADING_PHASES

log = logging.getLogger("flexinfer.operator.model")
FINALIZER = labels.FINALIZER_MODEL
Key = tuple[str, str]


def _md(body: Mapping[str, Any]) -> Mapping[str, Any]:
    return body.get("metadata") or {}


def _deleting(body: Mapping[str, Any]) -> bool:
    return bool(_md(body).get("deletionTimestamp"))


def shared_group_of(body: Mapping[str, Any]) -> str | None:
    g = ((body.get("spec") or {}).get("gpu") or {}).get("shared")
    return g if isinstance(g, str) and g else None


def _matching_cache(op: Operator, m: Model) -> Any:
    """The flashLoader block of a v1alpha1 ModelCache matching ``m`` (source or name), if any."""
    for body in op.store.list(MODEL_CACHE, m.namespace):
        spec = body.get("spec") or {}
        name = str(_md(body).get("name"))
        if not isinstance(spec.get("flashLoader"), Mapping):
            continue
        if name in (m.name, f"{m.name}-cache") or (m.spec.source.scheme == "hf"
                                                   and m.spec.source.model_id in str(spec.get("source", ""))):
            try:
                return ModelCache.from_obj(body).spec.flash_loader
            except SpecError:
                continue
    return None


def parse_model(op: Operator, body: Mapping[str, Any]) -> Model:
    """``Model.from_obj``, with the (schema-validated) spec parsed once per generation and spec."""
    key = (str(_md(body).get("namespace") or "default"), str(_md(body).get("name")))
    raw_spec = body.get("spec")
    tag = (_md(body).get("uid"), _md(body).get("generation"))
    hit = op.spec_cache.get(key)
    if hit is not None and hit[0] == tag and hit[1] == raw_spec:
        spec = hit[2]
    else:
        try:
            spec = ModelSpec.from_dict(raw_spec)
        except SpecError as e:
            spec = e
        op.spec_cache[key] = (tag, raw_spec, spec)
    if isinstance(spec, SpecError):
        raise spec
    check_kind(body, "Model")
    return Model(meta=ObjectMeta.from_obj(body), spec=spec, status=ModelStatus.from_dict(body.get("status")))


def gather(op: Operator, body: Mapping[str, Any]) -> ModelInputs:
    """The observed state a Model's plan reads (all from the store: no API calls)."""
    ns, name = str(_md(body).get("namespace") or "default"), str(_md(body).get("name"))
    now = op.clock()
    try:
        m: Model | None = parse_model(op, body)
        err = None
    except SpecError as e:
        m, err = None, e
    if m is None:
        return ModelInputs(body=body, model=None, error=err, now=now)
    st = op.store
    nodes = st.list(NODE) if m.spec.gpu.count > 0 and m.spec.gpu.vendor != "cpu" else []
    pvcs = {str(_md(p).get("name")): p for p in st.list(PVC, ns)} if m.spec.backend_def.needs_volume else {}
    jobs = {str(_md(j).get("name")): j for j in st.list(JOB, ns)
            if (_md(j).get("labels") or {}).get(labels.MODEL) == name}
    loras = sum(1 for lo in st.list(LORA, ns)
                if (lo.get("spec") or {}).get("modelRef") == name and not _deleting(lo))
    own = claimed_names(body.get("spec"))
    conflicts: list[str] = []
    if own:
        peers = [(str(_md(p).get("name")), claimed_names(p.get("spec"))) for p in st.list(MODEL, ns)
                 if not _deleting(p)]
        conflicts = alias_conflicts(name, own, peers)
    return ModelInputs(body=body, model=m, error=None, now=now, nodes=nodes,
                       deployment=st.get(DEPLOYMENT, ns, name), pvcs=pvcs, jobs=jobs, lora_adapters=loras,
                       alias_conflicts=tuple(conflicts), cache_flash=_matching_cache(op, m))


async def _write_status(op: Operator, body: Mapping[str, Any], status: Mapping[str, Any]) -> Mapping[str, Any]:
    old = body.get("status") or {}
    after = await op.w.patch_status(MODEL, body, status)
    if after is None:
        return body
    for ev in transition_events(old, after.get("status") or {}):
        op.record(after, ev)
    return after


async def reconcile_model(op: Operator, key: Key) -> Result:
    """Bring one Model's children and status in line with its spec."""
    ns, name = key
    body = op.store.get(MODEL, ns, name)
    if body is None:
        op.spec_cache.pop(key, None)
        return Result()
    if _deleting(body):
        await cleanup_model(op, body)
        return Result()
    inputs = gather(op, body)
    plan = plan_model(inputs, op.settings)
    if plan.failed and plan.deployment is None:  # invalid spec or placement: no children are touched
        await _write_status(op, body, plan.status)
        return Result(plan.requeue_after, plan.permanent)
    assert plan.deployment is not None and plan.service is not None
    w = op.w
    body = await w.add_finalizer(MODEL, body, FINALIZER)
    for kind, obj in plan.delete:
        await w.delete(kind, obj)
    for kind, obj in plan.create:
        await w.create_if_missing(kind, obj)
    await w.ensure(SERVICE, plan.service)
    wrote, dep = await w.ensure(DEPLOYMENT, plan.deployment, immutable=("selector",))
    if wrote:  # the status should describe the Deployment as it is now
        plan = plan_model(replace(inputs, body=body, deployment=dep), op.settings)
    old_phase = (body.get("status") or {}).get("phase")
    body = await _write_status(op, body, plan.status)
    group = shared_group_of(body)
    if group and old_phase != plan.status.get("phase"):
        op.trigger(GROUP_Q, (ns, group))
    if group and ((body.get("status") or {}).get("sharedGroup") or {}).get("groupName") != group:
        op.trigger(GROUP_Q, (ns, group))
    return Result(plan.requeue_after, plan.permanent)


async def cleanup_model(op: Operator, body: Mapping[str, Any]) -> None:
    """Delete the children, start the tmpfs cleanup of shared Models, then release the finalizer."""
    md = _md(body)
    if FINALIZER not in (md.get("finalizers") or ()):
        return
    ns, name, uid = str(md.get("namespace") or "default"), str(md.get("name")), md.get("uid")
    st, w = op.store, op.w
    for kind in (DEPLOYMENT, SERVICE):
        obj = st.get(kind, ns, name)
        if obj is not None and (_md(obj).get("labels") or {}).get(labels.MODEL) == name:
            await w.delete(kind, obj)
    for j in st.list(JOB, ns):
        jl = _md(j).get("labels") or {}
        if jl.get(labels.MODEL) == name and jl.get(labels.APP_NAME) == builders.APP_MODEL:
            await w.delete(JOB, j)
    for p in st.list(PVC, ns):
        owners = _md(p).get("ownerReferences") or ()
        if any(isinstance(o, Mapping) and o.get("uid") == uid for o in owners):
            await w.delete(PVC, p)
    group = shared_group_of(body)
    if group and (body.get("spec") or {}).get("nodeSelector"):
        try:
            m = Model.from_obj(body)
        except SpecError:
            m = None
        if m is not None:
            await w.create_if_missing(JOB, tmpfs_cleanup_job(m, op.settings))
    await w.remove_finalizer(MODEL, body, FINALIZER)
    if group:
        op.trigger(GROUP_Q, (ns, group))
    for lo in st.list(LORA, ns):
        if (lo.get("spec") or {}).get("modelRef") == name:
            op.trigger(LORA_Q, (ns, str(_md(lo).get("name"))))


# ---- shared-GPU groups ------------------------------------------------------------------------------

def _duration(raw: Any, default: float) -> float:
    try:
        return parse_duration(raw) if raw else default
    except SpecError:
        return default


def _cached(status: Mapping[str, Any]) -> bool:
    for c in status.get("conditions") or ():
        if isinstance(c, Mapping) and c.get("type") == CACHED:
            return c.get("status") == "True"
    return False  # not gated yet: unknown counts as not ready


def member_state(body: Mapping[str, Any], group: str) -> GroupMemberState:
    """What the group plan needs from a member, read leniently from the raw object.

    The cold-start hold is measured from ``status.loadingProgressAt`` (written by ``model_logic``
    when the load starts, i.e. when the phase enters Pending/Loading with the cache ready, and kept
    until the load ends); it counts only while the phase is Pending or Loading.
    """
    spec, status = body.get("spec") or {}, body.get("status") or {}
    gpu = spec.get("gpu") or {}
    config = spec.get("config") or {}
    serverless = spec.get("serverless") or {}
    sg = status.get("sharedGroup") or {}
    mine = sg.get("groupName") == group
    prio = gpu.get("priority")
    phase = str(status.get("phase") or "")
    warm = config.get("warmPolicy") if isinstance(config, Mapping) else None
    return GroupMemberState(
        name=str(_md(body).get("name")), priority=prio if isinstance(prio, int) else 100,
        phase=phase, last_active=opt_time(status.get("lastActiveTime")),
        state=str(sg.get("state") or "") if mine else "", preempted_at=opt_time(sg.get("preemptedAt")) if mine else None,
        swap_cooldown_s=_duration(gpu.get("swapCooldown"), 300.0),
        service_labels=tuple(str(x) for x in spec.get("serviceLabels") or ()),
        force_promotion=gpu.get("forcePromotion") is True,
        primary=isinstance(warm, str) and warm.lower() == "primary",
        cache_ready=_cached(status),
        loading_since=opt_time(status.get("loadingProgressAt")) if phase in LOADING_PHASES else None,
        cold_start_timeout_s=_duration(serverless.get("coldStartTimeout") if isinstance(serverless, Mapping)
                                       else None, 60.0))


async def reconcile_group(op: Operator, key: Key) -> Result:
    """Choose the leader of one shared group and write every member's ``status.sharedGroup``."""
    ns, group = key
    bodies = [b for b in op.store.list(MODEL, ns) if shared_group_of(b) == group and not _deleting(b)]
    if not bodies:
        return Result()
    plan = plan_group(group, [member_state(b, group) for b in bodies], op.clock(), op.settings.windows)
    for body in sorted(bodies, key=lambda b: str(_md(b).get("name"))):
        name = str(_md(body).get("name"))
        old = (body.get("status") or {}).get("sharedGroup") or {}
        desired = plan.shared_status[name]
        after = await op.w.patch_status(MODEL, body, {"sharedGroup": desired})
        if after is None:
            continue
        for ev in plan.events.get(name, ()):
            op.record(after, ev)
        if old.get("state") != desired.get("state") or old.get("groupName") != group:
            op.trigger(MODEL_Q, (ns, name))
    requeue = op.settings.resync_s if plan.next_check is None else min(op.settings.resync_s, plan.next_check)
    return Result(requeue)
