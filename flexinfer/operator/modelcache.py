"""ModelCache (v1alpha1): a PVC with the model files, filled once by a prefetch Job.

Owns: ``plan_cache_object`` (pure) and its shell. Strategies: ``Auto``/``SharedPVC`` create the PVC
``<name>`` (ReadWriteMany, ``storageSize``, ``storageClassName``) unless ``existingClaimName`` names
one, then run ``<name>-prefetch`` (Hugging Face, MLC via git-lfs, OCI/ORAS) into
``/models/<modelPath or name>``; ``Memory`` needs no preparation (the flash-loader reads the
``flashLoader`` block from Models); ``NodeLocal`` (a per-node DaemonSet in the original) is not
implemented and fails with ``NotImplemented``. Phases: Pending, Provisioning, Ready, Failed.
Quantization is not implemented (the block is accepted and ignored).

Must not: know Model rules (Models find a matching ModelCache themselves).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from flexinfer import labels
from flexinfer.api import ModelCache, SpecError
from flexinfer.api.conditions import READY, ConditionSet, ConditionStatus
from flexinfer.operator import builders, jobs
from flexinfer.operator.api_resources import JOB, MODEL_CACHE, PVC, Kind
from flexinfer.operator.config import OperatorSettings
from flexinfer.operator.context import Operator
from flexinfer.operator.results import Event, Result

APP = "modelcache"


def cache_labels(name: str) -> dict[str, str]:
    return {labels.APP_NAME: APP, labels.APP_INSTANCE: name, labels.MANAGED_BY: labels.MANAGED_BY_VALUE}


@dataclass(frozen=True, slots=True)
class CacheObjectPlan:
    phase: str
    reason: str
    message: str
    path: str | None = None
    create: tuple[tuple[Kind, dict[str, Any]], ...] = ()
    requeue_after: float | None = None


def plan_cache_object(mc: ModelCache, owner: Mapping[str, Any], *, pvcs: Mapping[str, Mapping[str, Any]],
                      jobs_by_name: Mapping[str, Mapping[str, Any]], settings: OperatorSettings) -> CacheObjectPlan:
    s = mc.spec
    name, ns = mc.meta.name, mc.meta.namespace
    if s.storage_strategy == "Memory":
        return CacheObjectPlan("Ready", "NoCacheJob", "Memory caches are filled by the flash-loader of each Model")
    if s.storage_strategy == "NodeLocal":
        return CacheObjectPlan("Failed", "NotImplemented",
                               "storageStrategy NodeLocal is not implemented; use SharedPVC (or Auto)")
    create: list[tuple[Kind, dict[str, Any]]] = []
    claim = s.existing_claim_name or name
    if s.existing_claim_name:
        if claim not in pvcs:
            return CacheObjectPlan("Pending", "PVCNotFound", f"existingClaimName {claim} does not exist",
                                   requeue_after=30.0)
    else:
        create.append((PVC, builders.pvc(name, ns, cache_labels(name), owner, size=s.storage_size,
                                         storage_class=s.storage_class, access_mode="ReadWriteMany")))
    dest = f"{builders.MODELS_DIR}/{(s.model_path or name).strip('/')}"
    job_name = builders.child_name(name, "prefetch")
    j = jobs_by_name.get(job_name)
    if j is None:
        create.append((JOB, jobs.modelcache_prefetch_job(
            name, ns, source=s.source, claim=claim, dest=dest, obj_labels=cache_labels(name), owner=owner,
            node_selector=s.node_selector, secret=s.secret_name or s.oci_secret_name, settings=settings)))
    phase = jobs.job_phase(j) or "Pending"
    if phase == "Succeeded":
        return CacheObjectPlan("Ready", "PrefetchSucceeded", f"{s.source} is in PVC {claim} at {dest}", dest,
                               tuple(create))
    if phase == "Failed":
        return CacheObjectPlan("Failed", "PrefetchFailed", f"prefetching {s.source} failed (delete Job {job_name} "
                                                           "to retry)", dest, tuple(create))
    return CacheObjectPlan("Provisioning", "Prefetch" + phase, f"prefetching {s.source} into PVC {claim}", dest,
                           tuple(create))


def _status(body: Mapping[str, Any], plan: CacheObjectPlan, now: datetime) -> dict[str, Any]:
    gen = (body.get("metadata") or {}).get("generation") or 0
    conds = ConditionSet((body.get("status") or {}).get("conditions"), gen, now)
    ok: ConditionStatus = "True" if plan.phase == "Ready" else "False"
    conds.set(READY, ok, plan.reason, plan.message)
    return {"observedGeneration": gen, "phase": plan.phase, "conditions": conds.to_list(),
            "message": plan.message, "path": plan.path}


async def reconcile_modelcache(op: Operator, key: tuple[str, str]) -> Result:
    ns, name = key
    body = op.store.get(MODEL_CACHE, ns, name)
    if body is None or (body.get("metadata") or {}).get("deletionTimestamp"):
        return Result()  # children carry owner references
    now = op.clock()
    try:
        mc = ModelCache.from_obj(body)
    except SpecError as e:
        plan = CacheObjectPlan("Failed", e.reason, e.message)
    else:
        pvcs = {str((p.get("metadata") or {}).get("name")): p for p in op.store.list(PVC, ns)}
        jobs_by_name = {str((j.get("metadata") or {}).get("name")): j for j in op.store.list(JOB, ns)}
        plan = plan_cache_object(mc, body, pvcs=pvcs, jobs_by_name=jobs_by_name, settings=op.settings)
    for kind, obj in plan.create:
        await op.w.create_if_missing(kind, obj)
    old_phase = (body.get("status") or {}).get("phase")
    after = await op.w.patch_status(MODEL_CACHE, body, _status(body, plan, now))
    if after is not None and old_phase != plan.phase and plan.phase in ("Ready", "Failed"):
        op.record(after, Event("Normal" if plan.phase == "Ready" else "Warning", plan.reason, plan.message))
    requeue = plan.requeue_after if plan.requeue_after is not None else op.settings.resync_s
    return Result(requeue, f"{plan.reason}: {plan.message}" if plan.phase == "Failed" else None)
