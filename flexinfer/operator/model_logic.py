"""The Model's rules as pure functions: (spec, observed state, now) -> desired children and status.

Owns (``shared/reference/flexinfer-upstream.md`` §2.1–2.4):

- validation beyond the typed view: the name (it names the Service: a DNS-1035 label of at most 63
  characters), GPU detection (``gpu.detect_gpu``), backend/vendor, image availability, the support
  matrix and VRAM fit (``backends.check_placement``: over 95 % fails, over 80 % warns);
- cache gating: the cache PVC and the prefetch / copy / check Jobs, and whether the files are ready;
- desired replicas (shared and not Active -> 0; serverless off -> minReplicas; no activity ->
  minReplicas; Loading -> 1; idle past the timeout -> minReplicas; else max(1, minReplicas));
- phase and conditions (Ready, Schedulable, ConfigValid, Cached, Loaded) with reason, message,
  ``lastTransitionTime`` (moved only when a status flips) and ``observedGeneration``;
- ``status.loadingProgressAt``: set to now when a load starts (the phase enters Pending or Loading
  with the cache ready, i.e. replicas were asked for), kept while the load goes on, removed otherwise;
  the shared-GPU cold-start hold is measured from it (:mod:`flexinfer.sharing`);
- alias conflicts (``ConfigValid=False``, reason ``AliasConflict``; never blocking);
- the Events a status transition deserves.

Must not: do I/O, read the clock or the environment (``now`` and settings are arguments).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from flexinfer.api.common import INVALID_SPEC, SpecError, format_time, opt_time
from flexinfer.api.conditions import (
    CACHED,
    CONFIG_VALID,
    LOADED,
    READY,
    SCHEDULABLE,
    ConditionSet,
)
from flexinfer.api.model_view import Model
from flexinfer.backends import ImageNotConfigured, check_placement
from flexinfer.operator import builders, jobs
from flexinfer.operator.api_resources import JOB, PVC, Kind
from flexinfer.operator.config import OperatorSettings
from flexinfer.operator.gpu import detect_gpu
from flexinfer.operator.results import Event

DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
ALIAS_CONFLICT = "AliasConflict"
IMAGE_NOT_CONFIGURED = "ImageNotConfigured"
#: placement failures that depend on the nodes: retried (slowly) without a spec change
NODE_DEPENDENT = frozenset({"NoMatchingNodes", "AmbiguousGPUVendor", "BackendUnsupported", "VRAMInsufficient"})


# ---- cache gating ------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class CachePlan:
    """Whether the model files are in place, and the objects that put them there."""

    ready: bool
    reason: str
    message: str
    strategy: str
    pvc_name: str | None = None
    job_name: str | None = None
    job_phase: str | None = None
    failed: bool = False
    staging: bool = False
    create: tuple[tuple[Kind, dict[str, Any]], ...] = ()
    delete: tuple[tuple[Kind, Mapping[str, Any]], ...] = ()

    def status(self) -> dict[str, Any]:
        return {"strategy": self.strategy, "ready": self.ready, "pvcName": self.pvc_name, "jobName": self.job_name,
                "jobPhase": self.job_phase or None, "message": self.message or None}


def _pvc_phase(p: Mapping[str, Any] | None) -> str:
    return str(((p or {}).get("status") or {}).get("phase") or "")


def _job_step(m: Model, kind: str, desired: dict[str, Any],
              jobs_by_name: Mapping[str, Mapping[str, Any]]) -> tuple[str, str, bool, bool, list[tuple[Kind, dict[str, Any]]],
                                                     list[tuple[Kind, Mapping[str, Any]]]]:
    """(job name, phase, ready, failed, create, delete) for one cache Job."""
    name = jobs.cache_job_name(m, kind)
    j = jobs_by_name.get(name)
    if j is not None and jobs.recorded_source(j) not in (None, m.spec.source.raw):
        return name, "Pending", False, False, [], [(JOB, j)]  # recreated for the new source
    phase = jobs.job_phase(j) or "Pending"
    create = [] if j is not None else [(JOB, desired)]
    return name, phase, phase == "Succeeded", phase == "Failed", create, []


def plan_cache(m: Model, owner: Mapping[str, Any], *, pvcs: Mapping[str, Mapping[str, Any]],
               jobs_by_name: Mapping[str, Mapping[str, Any]], settings: OperatorSettings) -> CachePlan:
    """Cache gating (§2.3): PVC, Job, readiness. ``pvcs``/``jobs_by_name``: the namespace's, by name."""
    s = m.spec
    strategy = s.cache.strategy
    if not s.backend_def.needs_volume:
        return CachePlan(True, "NoCacheJob", f"backend {s.backend} loads models itself", "None")
    src = s.source
    create: list[tuple[Kind, dict[str, Any]]] = []
    pvc_name = builders.cache_pvc_name(m)
    if src.scheme == "pvc":
        claim = src.pvc_claim or ""
        if s.cache.declared and strategy == "SharedPVC":
            if s.cache.pvc_name and s.cache.pvc_name not in pvcs:
                return CachePlan(False, "PVCNotFound", f"cache.pvcName {pvc_name} does not exist", strategy,
                                 pvc_name, staging=True)
            if not s.cache.pvc_name:
                create.append((PVC, builders.model_cache_pvc(m, owner)))
            if _pvc_phase(pvcs.get(claim)) != "Bound":
                return CachePlan(False, "CacheCopy", f"waiting for source PVC {claim} to be Bound", strategy,
                                 pvc_name, staging=True, create=tuple(create))
            name, phase, ready, failed, c, d = _job_step(m, jobs.COPY, jobs.copy_job(m, owner, settings),
                                                         jobs_by_name)
            msg = {"Succeeded": f"copied {src.raw} into PVC {pvc_name}", "Failed": f"copying {src.raw} failed"}.get(
                phase, f"copying {src.raw} into PVC {pvc_name}")
            return CachePlan(ready, "CacheCopy", msg, strategy, pvc_name, name, phase, failed, True,
                             tuple(create + c), tuple(d))
        name, phase, ready, failed, c, d = _job_step(m, jobs.CHECK, jobs.check_job(m, owner, settings),
                                                     jobs_by_name)
        msg = {"Succeeded": f"found the model in PVC {claim}",
               "Failed": f"{src.raw}: the path is missing or empty"}.get(phase, f"checking {src.raw}")
        return CachePlan(ready, "CacheCheck", msg, strategy, claim, name, phase, failed, False, tuple(c), tuple(d))
    if strategy != "SharedPVC":
        return CachePlan(True, "NoCacheJob", f"cache strategy {strategy} needs no preparation", strategy)
    if s.cache.pvc_name:
        if s.cache.pvc_name not in pvcs:
            return CachePlan(False, "PVCNotFound", f"cache.pvcName {pvc_name} does not exist", strategy, pvc_name)
    else:
        create.append((PVC, builders.model_cache_pvc(m, owner)))
    if src.scheme == "hf":
        name, phase, ready, failed, c, d = _job_step(m, jobs.PREFETCH, jobs.prefetch_job(m, owner, settings),
                                                     jobs_by_name)
        reason = "Prefetch" + phase
        msg = {"Succeeded": f"{src.model_id} is in PVC {pvc_name}",
               "Failed": f"prefetching {src.model_id} failed (delete Job {name} to retry)"}.get(
            phase, f"prefetching {src.model_id} into PVC {pvc_name}")
        return CachePlan(ready, reason, msg, strategy, pvc_name, name, phase, failed, False,
                         tuple(create + c), tuple(d))
    # Other sources on a PVC: no Job. Not gated on the PVC being Bound: with a WaitForFirstConsumer
    # class the claim binds only when the model pod mounts it.
    bound = _pvc_phase(pvcs.get(pvc_name)) == "Bound"
    return CachePlan(True, "PVCBound" if bound else "PVCProvisioning",
                     f"PVC {pvc_name} is {'Bound' if bound else 'provisioning'}", strategy, pvc_name,
                     create=tuple(create))


# ---- replicas ---------------------------------------------------------------------------------------

def desired_replicas(m: Model, shared_state: str | None, phase: str | None, last_active: datetime | None,
                     now: datetime) -> tuple[int, float | None]:
    """Replicas the Deployment should have, and seconds until that may change (None: on events only)."""
    sv = m.spec.serverless
    if m.spec.gpu.shared and shared_state != "Active":
        return 0, None
    if not sv.enabled:
        return sv.min_replicas, None
    if last_active is None:
        return sv.min_replicas, None
    if phase == "Loading":
        return max(1, sv.min_replicas), None
    idle = (now - last_active).total_seconds()
    if idle > sv.idle_timeout_s:
        return sv.min_replicas, None
    return max(1, sv.min_replicas), max(0.0, sv.idle_timeout_s - idle) + 0.5


def loading_since(old_status: Mapping[str, Any], phase: str, cache_ready: bool, now: datetime) -> str | None:
    """``status.loadingProgressAt``: when the current load started (kept while it lasts), None when
    the model is not loading. Pending on a cache that is not ready is not loading."""
    if not cache_ready or phase not in ("Pending", "Loading"):
        return None
    old = old_status.get("loadingProgressAt")
    if isinstance(old, str) and opt_time(old) is not None:
        return old
    return format_time(now)


# ---- alias conflicts ---------------------------------------------------------------------------------

def claimed_names(spec: Mapping[str, Any] | None) -> frozenset[str]:
    """Names a Model's ``litellm`` block claims (served name, aliases, copilot alias), from a raw spec."""
    ll = (spec or {}).get("litellm")
    if not isinstance(ll, Mapping) or ll.get("enabled") is False:
        return frozenset()
    names = [ll.get("servedModelName"), ll.get("copilotAlias"), *(ll.get("aliases") or ())]
    return frozenset(n for n in names if isinstance(n, str) and n)


def alias_conflicts(name: str, own: Iterable[str], peers: Iterable[tuple[str, frozenset[str]]]) -> list[str]:
    """Messages for each name ``name`` claims that another Model of the namespace also claims or is."""
    peers = [(p, names) for p, names in peers if p != name]
    out = []
    for n in sorted(set(own)):
        if n == name:
            continue
        others = sorted(p for p, names in peers if n in names or n == p)
        if others:
            out.append(f"{n!r} is also claimed by {', '.join(others)}")
    return out


# ---- the plan ----------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class ModelInputs:
    """Everything the reconcile of one Model looks at."""

    body: Mapping[str, Any]
    model: Model | None
    error: SpecError | None
    now: datetime
    nodes: Sequence[Mapping[str, Any]] = ()
    deployment: Mapping[str, Any] | None = None
    pvcs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    jobs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    lora_adapters: int = 0
    alias_conflicts: tuple[str, ...] = ()
    cache_flash: Any = None  # flashLoader of a matching v1alpha1 ModelCache


@dataclass(frozen=True, slots=True)
class ModelPlan:
    status: dict[str, Any]
    deployment: dict[str, Any] | None = None
    service: dict[str, Any] | None = None
    create: tuple[tuple[Kind, dict[str, Any]], ...] = ()
    delete: tuple[tuple[Kind, Mapping[str, Any]], ...] = ()
    requeue_after: float | None = None
    permanent: str | None = None

    @property
    def failed(self) -> bool:
        return self.status.get("phase") == "Failed"


def _generation(body: Mapping[str, Any]) -> int:
    g = (body.get("metadata") or {}).get("generation")
    return g if isinstance(g, int) and not isinstance(g, bool) else 0


def _failed(inp: ModelInputs, reason: str, message: str, cond: str, *, requeue: float | None,
            endpoint: str | None = None) -> ModelPlan:
    gen = _generation(inp.body)
    conds = ConditionSet((inp.body.get("status") or {}).get("conditions"), gen, inp.now)
    if cond != CONFIG_VALID:
        conds.set(CONFIG_VALID, "True", "ConfigValid", "the spec is valid")
    conds.set(cond, "False", reason, message)
    conds.set(READY, "False", reason, message)
    status: dict[str, Any] = {"observedGeneration": gen, "phase": "Failed", "conditions": conds.to_list(),
                              "loadingProgressAt": None}
    if endpoint:
        status["endpoint"] = endpoint
    return ModelPlan(status=status, requeue_after=requeue, permanent=f"{reason}: {message}")


def plan_model(inp: ModelInputs, settings: OperatorSettings) -> ModelPlan:
    """What a Model should look like now: children, status and when to look again."""
    if inp.error is not None or inp.model is None:
        err = inp.error or SpecError(INVALID_SPEC, "unreadable Model")
        return _failed(inp, err.reason, err.message, CONFIG_VALID, requeue=None)
    m = inp.model
    if len(m.name) > builders.MAX_NAME or not DNS1035.match(m.name):
        return _failed(inp, INVALID_SPEC, f"metadata.name {m.name!r}: a Model name must be a DNS-1035 label of at "
                                          "most 63 characters (lowercase letters, digits, '-'; it names the Service)",
                       CONFIG_VALID, requeue=None)
    s, backend = m.spec, m.spec.backend_def
    endpoint = builders.endpoint(m)
    vendor, arch, vram_mb, nodes = "cpu", "", None, 0
    if s.gpu.count > 0 and s.gpu.vendor != "cpu":
        try:
            tgt = detect_gpu(inp.nodes, s.node_selector, s.gpu.vendor)
        except SpecError as e:
            return _failed(inp, e.reason, e.message, SCHEDULABLE, requeue=settings.failed_requeue_s, endpoint=endpoint)
        vendor, arch, vram_mb, nodes = tgt.vendor, tgt.arch, tgt.vram_mb, tgt.nodes
    try:
        choice = backend.image(vendor, arch, env=settings.images)
    except ImageNotConfigured as e:
        return _failed(inp, IMAGE_NOT_CONFIGURED, str(e), SCHEDULABLE, requeue=None, endpoint=endpoint)
    findings = check_placement(backend, vendor, arch, source=s.source.raw, config=s.config,
                               vram_estimate_mb=s.gpu.vram_estimate_mb, vram_mb=vram_mb, generic_image=choice.generic)
    errors = [f for f in findings if f.level == "error"]
    if errors:
        requeue = settings.failed_requeue_s if vendor != "cpu" else None
        return _failed(inp, errors[0].reason, errors[0].message, SCHEDULABLE, requeue=requeue, endpoint=endpoint)
    warnings = [f for f in findings if f.level == "warning"]
    target = builders.Target(vendor, arch, choice.image)

    status_raw = inp.body.get("status") or {}
    st = m.status
    sg = st.shared_group
    shared_state = sg.state if (sg is not None and sg.group_name == s.gpu.shared) else None
    cache = plan_cache(m, inp.body, pvcs=inp.pvcs, jobs_by_name=inp.jobs, settings=settings)
    vol = builders.model_volume(m, staging=cache.staging)
    flash = builders.flash_loader(m, vol, settings, inp.cache_flash)
    replicas, idle_requeue = desired_replicas(m, shared_state, st.phase, st.last_active_time, inp.now)
    if not cache.ready:
        replicas = 0
    deployment = builders.model_deployment(m, inp.body, target, vol, replicas=replicas, settings=settings,
                                           lora_adapters=inp.lora_adapters, flash=flash)
    active = ",".join(s.service_labels) if shared_state == "Active" else ""
    service = builders.model_service(m, inp.body, active_services=active)

    dep_status = (inp.deployment or {}).get("status") or {}
    ready_replicas = int(dep_status.get("readyReplicas") or 0)
    preempted = shared_state == "Preempted"
    if cache.failed:
        phase, reason, msg = "Failed", cache.reason, cache.message
    elif not cache.ready:
        phase, reason, msg = ("Preempted" if preempted else "Pending"), "CacheNotReady", cache.message
    elif ready_replicas > 0:
        phase, reason, msg = "Ready", "BackendReady", f"{ready_replicas} replica(s) ready at {endpoint}"
    elif replicas == 0:
        if preempted:
            phase, reason, msg = "Preempted", "Preempted", f"preempted by {sg.preempted_by if sg else '?'}"
        elif s.gpu.shared and shared_state != "Active":
            phase, reason, msg = "Idle", "WaitingForActivation", f"queued in GPU group {s.gpu.shared}"
        else:
            phase, reason, msg = "Idle", "WaitingForActivation", "scaled to zero; the first request wakes it"
    elif inp.deployment is not None:
        phase, reason, msg = "Loading", "StartingBackend", f"starting {replicas} replica(s)"
    else:
        phase, reason, msg = "Pending", "StartingBackend", "creating the Deployment"

    gen = _generation(inp.body)
    conds = ConditionSet(status_raw.get("conditions"), gen, inp.now)
    if inp.alias_conflicts:
        conds.set(CONFIG_VALID, "False", ALIAS_CONFLICT, "; ".join(inp.alias_conflicts))
    else:
        conds.set(CONFIG_VALID, "True", "ConfigValid", "the spec is valid")
    where = f"{vendor} {arch}".strip() + (f" on {nodes} node(s)" if nodes else "")
    sched_msg = "; ".join([f"runs on {where}", *(f"{w.reason}: {w.message}" for w in warnings)])
    conds.set(SCHEDULABLE, "True", "Schedulable", sched_msg)
    conds.set(CACHED, "True" if cache.ready else "False", cache.reason, cache.message)
    if ready_replicas > 0:
        conds.set(LOADED, "True", "BackendReady", msg)
    else:
        conds.set(LOADED, "False", reason if phase != "Failed" else cache.reason, msg)
    conds.set(READY, "True" if phase == "Ready" else "False", reason, msg)

    status: dict[str, Any] = {
        "observedGeneration": gen, "phase": phase, "conditions": conds.to_list(), "endpoint": endpoint,
        "gpu": {"vendor": vendor, "architecture": arch or None, "memoryMB": vram_mb} if vendor != "cpu" else None,
        "cache": cache.status(),
    }
    status["loadingProgressAt"] = loading_since(status_raw, phase, cache.ready, inp.now)
    requeue = settings.resync_s if idle_requeue is None else min(settings.resync_s, idle_requeue)
    return ModelPlan(status=status, deployment=deployment, service=service, create=cache.create,
                     delete=cache.delete, requeue_after=requeue)


# ---- events -----------------------------------------------------------------------------------------

def _cond(status: Mapping[str, Any], type_: str) -> Mapping[str, Any]:
    for c in status.get("conditions") or ():
        if isinstance(c, Mapping) and c.get("type") == type_:
            return c
    return {}


def transition_events(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[Event]:
    """Events for what changed between two statuses (phases, alias conflicts, warnings, cache)."""
    out: list[Event] = []
    op, np_ = old.get("phase"), new.get("phase")
    ready = _cond(new, READY)
    if np_ != op:
        if np_ == "Failed":
            out.append(Event("Warning", str(ready.get("reason") or "Failed"), str(ready.get("message") or "")))
        elif np_ == "Ready":
            out.append(Event("Normal", "BackendReady", str(ready.get("message") or "ready")))
        elif np_ == "Loading":
            out.append(Event("Normal", "StartingBackend", str(ready.get("message") or "starting")))
        elif np_ == "Idle" and op in ("Ready", "Loading"):
            out.append(Event("Normal", "ScaledToZero", str(ready.get("message") or "scaled to zero")))
    cv_old, cv_new = _cond(old, CONFIG_VALID), _cond(new, CONFIG_VALID)
    if cv_new.get("reason") == ALIAS_CONFLICT and cv_new.get("message") != cv_old.get("message"):
        out.append(Event("Warning", ALIAS_CONFLICT, str(cv_new.get("message"))))
    sc_old, sc_new = _cond(old, SCHEDULABLE), _cond(new, SCHEDULABLE)
    if sc_new.get("status") == "True" and sc_new.get("message") != sc_old.get("message"):
        for part in str(sc_new.get("message") or "").split("; ")[1:]:
            reason, _, msg = part.partition(": ")
            out.append(Event("Warning", reason, msg))
    ca_old, ca_new = _cond(old, CACHED), _cond(new, CACHED)
    if ca_new.get("reason") != ca_old.get("reason") and ca_new.get("reason") in ("PrefetchSucceeded",
                                                                                 "PrefetchFailed"):
        kind = "Normal" if ca_new.get("status") == "True" else "Warning"
        out.append(Event(kind, str(ca_new.get("reason")), str(ca_new.get("message") or "")))
    return out

