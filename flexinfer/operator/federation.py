"""FederatedModel (v1alpha2) controller: a Model copied to every member cluster of its placement.

Owns, for one FederatedModel (namespace ``ns``, name ``n``):

- Placement (pure, :func:`targets`): the Clusters of ``ns`` named in ``placement.clusters`` plus
  those whose ``spec.labels`` match ``placement.clusterSelector``, sorted; a named Cluster that does
  not exist is reported (phase ``Unknown``). The schema has no per-cluster overrides, so every
  copy is the same.
- The copy (pure, :func:`member_model`): a ``Model`` ``ns/n`` on the member whose spec is the
  defaulted ``spec.template`` (owned entirely: a field removed from the template is removed from
  the copy), with ``serverless.minReplicas = replicasPerCluster`` unless the template sets it (the
  Model kind has no replica count: minReplicas is what keeps replicas running; a value above the
  Model's maximum of 10 is refused with a ``Synced`` condition), marked with the label
  ``flexinfer.ai/federated-model: n`` and the annotation ``flexinfer.ai/federation-owner: ns/n``.
- Sync per member (only when its Cluster is ``Ready``): GET the member's Model; absent -> create;
  carrying our owner annotation -> merge-patch what differs (``diff.merge_patch``: nothing when
  equal, so a steady state makes **zero writes to members**); a same-named Model without it is never
  touched (phase ``Conflict``, reason ``ForeignModel``, a Warning Event once). A member that fails to
  answer is reported (phase ``Unreachable``) and its Cluster is probed at once; the other members
  go on. A member whose Cluster is not Ready is not contacted at all (its phase is the Cluster's).
- Status: per cluster the member Model's phase, ``readyReplicas`` (the member Deployment's
  ``readyReplicas`` when it can be read, else ``totalReplicas`` if the phase is Ready, else 0) and
  ``totalReplicas``; ``readyClusters``/``totalClusters`` (the printer columns); conditions
  ``Synced`` (every copy in place, else the first problem's reason) and ``Ready`` (every placed
  cluster Ready). Written only when it changed. Members are read again every
  ``federation_resync_s`` and when a Cluster of ``ns`` changes.
- Removal: a cluster that leaves the placement has its copy deleted (when owned and reachable;
  kept in status as ``Removing`` until then; a Cluster object that is gone cannot be reached: a
  Warning Event ``CopyLeftBehind`` says so). Deletion goes through the finalizer
  ``flexinfer.ai/federation-cleanup``: owned copies on every cluster of the status and the
  placement are deleted; members that cannot be reached are retried every resync until
  ``federation_cleanup_timeout_s`` after ``deletionTimestamp``, then the finalizer is removed anyway
  with a Warning Event ``CleanupIncomplete`` naming the clusters where a copy may remain (the hub is
  never blocked forever; a copy left behind is the operator's to remove by hand).

Must not: probe clusters (``cluster`` does) or act on member objects other than its own copies.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from flexinfer import labels
from flexinfer.api.common import SpecError, opt_time
from flexinfer.api.conditions import READY, SYNCED, ConditionSet
from flexinfer.api.federation import FederatedModel, FederatedModelSpec, LabelSelector
from flexinfer.k8s.errors import KubeAPIError
from flexinfer.operator import cluster as cluster_ctl
from flexinfer.operator.api_resources import CLUSTER, DEPLOYMENT, FEDERATED_MODEL, MODEL
from flexinfer.operator.context import Operator
from flexinfer.operator.diff import merge_patch, strip_none
from flexinfer.operator.kubeapi import KubeClient
from flexinfer.operator.members import MemberConfigError
from flexinfer.operator.results import Event, Result

log = logging.getLogger("flexinfer.operator.federation")
QUEUE = "federatedmodel"
FINALIZER = labels.FINALIZER_FEDERATION
MAX_MIN_REPLICAS = 10  # the Model kind's serverless.minReplicas maximum
# per-cluster phases besides the member Model's own
CONFLICT, UNREACHABLE, UNKNOWN, REMOVING, ERROR = "Conflict", "Unreachable", "Unknown", "Removing", "Error"
# condition reasons
SYNCED_OK, FOREIGN, MEMBER_UNREACHABLE, CLUSTER_NOT_READY, CLUSTER_MISSING, MEMBER_ERROR = (
    "Synced", "ForeignModel", "MemberUnreachable", "ClusterNotReady", "ClusterNotFound", "MemberError")
NO_CLUSTERS, INVALID_SPEC, CLEANUP_PENDING = "NoClusters", "InvalidSpec", "CleanupPending"

Key = tuple[str, str]


def _md(body: Mapping[str, Any]) -> Mapping[str, Any]:
    return body.get("metadata") or {}


@dataclass(frozen=True, slots=True)
class Entry:
    """The state of the copy on one cluster (one ``status.clusters`` item) and its condition reason."""

    cluster: str
    phase: str
    ready: int = 0
    total: int = 0
    message: str = ""
    reason: str = SYNCED_OK  # SYNCED_OK when the copy is in place

    def to_dict(self) -> dict[str, Any]:
        return {"cluster": self.cluster, "phase": self.phase, "readyReplicas": self.ready,
                "totalReplicas": self.total, "message": self.message}


# ---- pure parts -------------------------------------------------------------------------------------

def cluster_labels(body: Mapping[str, Any]) -> Mapping[str, str]:
    raw = (body.get("spec") or {}).get("labels") or {}
    return {str(k): str(v) for k, v in raw.items()} if isinstance(raw, Mapping) else {}


def targets(spec: FederatedModelSpec, clusters: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Cluster names of the placement: the named ones (existing or not) and the selected ones, sorted."""
    sel: LabelSelector | None = spec.placement.cluster_selector
    out = set(spec.placement.clusters)
    if sel is not None:
        out.update(n for n, b in clusters.items() if sel.matches(cluster_labels(b)))
    return sorted(out)


def owner_of(fm_body: Mapping[str, Any]) -> str:
    md = _md(fm_body)
    return f"{md.get('namespace') or 'default'}/{md.get('name')}"


def owned(member_body: Mapping[str, Any] | None, owner: str) -> bool:
    return bool(member_body) and (_md(member_body or {}).get("annotations") or {}).get(labels.FEDERATION_OWNER) == owner


def replicas(fm_body: Mapping[str, Any], spec: FederatedModelSpec) -> int:
    """The copies' ``serverless.minReplicas``: the template's when it sets one, else replicasPerCluster."""
    raw = (((fm_body.get("spec") or {}).get("template") or {}).get("serverless") or {})
    if isinstance(raw, Mapping) and isinstance(raw.get("minReplicas"), int):
        return int(raw["minReplicas"])
    return spec.placement.replicas_per_cluster


def member_model(fm_body: Mapping[str, Any], spec: FederatedModelSpec) -> dict[str, Any]:
    """The Model every member gets (see the module docstring)."""
    md = _md(fm_body)
    tpl = copy.deepcopy(dict(spec.template_raw))
    sv = dict(tpl.get("serverless") or {})
    sv["minReplicas"] = replicas(fm_body, spec)
    tpl["serverless"] = sv
    return {"apiVersion": MODEL.api_version, "kind": MODEL.kind,
            "metadata": {"name": md.get("name"), "namespace": md.get("namespace") or "default",
                         "labels": {labels.FEDERATED_MODEL: str(md.get("name"))},
                         "annotations": {labels.FEDERATION_OWNER: owner_of(fm_body)}},
            "spec": tpl}


def aggregate(body: Mapping[str, Any], entries: list[Entry], placed: int, now: datetime,
              spec_error: str | None = None) -> dict[str, Any]:
    """The FederatedModel status for ``entries`` (``placed`` of them in the placement)."""
    conds = ConditionSet((body.get("status") or {}).get("conditions"), _md(body).get("generation"), now)
    ready = sum(1 for e in entries if e.phase == "Ready" and e.reason == SYNCED_OK)
    problems = [e for e in entries if e.reason != SYNCED_OK]
    if spec_error is not None:
        conds.set(SYNCED, "False", INVALID_SPEC, spec_error)
    elif placed == 0:
        conds.set(SYNCED, "False", NO_CLUSTERS, "no Cluster matches the placement")
    elif problems:
        conds.set(SYNCED, "False", problems[0].reason,
                  "; ".join(f"{e.cluster}: {e.message}" for e in problems)[:4096])
    else:
        conds.set(SYNCED, "True", SYNCED_OK, f"the Model is on {placed} cluster(s)")
    if placed and ready == placed:
        conds.set(READY, "True", "AllClustersReady", f"{ready}/{placed} clusters ready")
    else:
        conds.set(READY, "False", "ClustersNotReady", f"{ready}/{placed} clusters ready")
    return {"observedGeneration": _md(body).get("generation"), "conditions": conds.to_list(),
            "clusters": [e.to_dict() for e in entries], "readyClusters": ready, "totalClusters": placed}


# ---- member access ----------------------------------------------------------------------------------

async def _client(op: Operator, ns: str, name: str, cl_body: Mapping[str, Any] | None) -> KubeClient | Entry:
    """The member's client, or the Entry saying why it is not contacted."""
    if cl_body is None:
        return Entry(name, UNKNOWN, message=f"no Cluster {name} in namespace {ns}", reason=CLUSTER_MISSING)
    phase = (cl_body.get("status") or {}).get("phase")
    if phase != cluster_ctl.READY_PHASE:
        return Entry(name, UNREACHABLE if phase == cluster_ctl.UNREACHABLE else UNKNOWN,
                     message=f"Cluster {name} is {phase or 'not probed yet'}",
                     reason=MEMBER_UNREACHABLE if phase == cluster_ctl.UNREACHABLE else CLUSTER_NOT_READY)
    members = cluster_ctl.members_of(op)
    member = members.cached((ns, name))
    if member is None:
        ref = (cl_body.get("spec") or {}).get("secretRef") or {}
        try:
            member = await members.open(cluster_ctl.hub(op), ns, name, str(ref.get("name") or ""),
                                        str(ref["key"]) if ref.get("key") else None)
        except MemberConfigError as e:
            return Entry(name, UNKNOWN, message=e.message, reason=CLUSTER_NOT_READY)
    return member.kube


def _failed(op: Operator, ns: str, name: str, e: KubeAPIError, total: int) -> Entry:
    if e.status == 0 or e.status >= 500 or e.status == 429:
        op.trigger(cluster_ctl.QUEUE, (ns, name), 0.0)  # let the probe say what the cluster is
        return Entry(name, UNREACHABLE, total=total, message=f"member did not answer: {e.detail}",
                     reason=MEMBER_UNREACHABLE)
    return Entry(name, ERROR, total=total, message=f"member refused ({e.status}): {e.detail}", reason=MEMBER_ERROR)


async def _ready_replicas(kube: KubeClient, ns: str, name: str, phase: str, total: int) -> int:
    try:
        dep = await kube.get(DEPLOYMENT, ns, name)
    except KubeAPIError:
        dep = None
    if dep is not None:
        n = (dep.get("status") or {}).get("readyReplicas")
        return n if isinstance(n, int) else 0
    return total if phase == "Ready" else 0


async def sync_member(op: Operator, fm_body: Mapping[str, Any], cl_name: str,
                      cl_body: Mapping[str, Any] | None, desired: Mapping[str, Any], total: int) -> Entry:
    """Put the copy on one member (zero writes when it is already right); its Entry."""
    ns, name = str(desired["metadata"]["namespace"]), str(desired["metadata"]["name"])
    kube = await _client(op, ns, cl_name, cl_body)
    if isinstance(kube, Entry):
        return Entry(kube.cluster, kube.phase, 0, total, kube.message, kube.reason)
    owner = owner_of(fm_body)
    try:
        observed = await kube.get(MODEL, ns, name)
        if observed is not None and not owned(observed, owner):
            return Entry(cl_name, CONFLICT, total=total, reason=FOREIGN,
                         message=f"a Model {ns}/{name} the federation did not create is there; left alone")
        if observed is None:
            observed = await kube.create(MODEL, ns, strip_none(desired))
        else:
            patch = merge_patch(desired, observed, (("spec",),))
            patch.pop("apiVersion", None)
            patch.pop("kind", None)
            if patch:
                observed = await kube.patch(MODEL, ns, name, patch) or observed
        phase = str((observed.get("status") or {}).get("phase") or "Pending")
        ready = await _ready_replicas(kube, ns, name, phase, total)
    except KubeAPIError as e:
        return _failed(op, ns, cl_name, e, total)
    return Entry(cl_name, phase, ready, total, "" if phase == "Ready" else f"the member Model is {phase}")


async def remove_copy(op: Operator, fm_body: Mapping[str, Any], cl_name: str,
                      cl_body: Mapping[str, Any] | None) -> str | None:
    """Delete the owned copy on one member; None when done (or nothing to do), else why not."""
    md = _md(fm_body)
    ns, name = str(md.get("namespace") or "default"), str(md.get("name"))
    kube = await _client(op, ns, cl_name, cl_body)
    if isinstance(kube, Entry):
        return kube.message
    try:
        observed = await kube.get(MODEL, ns, name)
        if observed is not None and owned(observed, owner_of(fm_body)):
            await kube.delete(MODEL, ns, name)
    except KubeAPIError as e:
        return _failed(op, ns, cl_name, e, 0).message
    return None


# ---- the reconcile ----------------------------------------------------------------------------------

def _clusters(op: Operator, ns: str) -> dict[str, Mapping[str, Any]]:
    return {str(_md(b).get("name")): b for b in op.store.list(CLUSTER, ns) if not _md(b).get("deletionTimestamp")}


def _status_clusters(body: Mapping[str, Any]) -> list[str]:
    return [str(c.get("cluster")) for c in (body.get("status") or {}).get("clusters") or ()
            if isinstance(c, Mapping) and c.get("cluster")]


async def _write(op: Operator, body: Mapping[str, Any], status: Mapping[str, Any],
                 entries: list[Entry]) -> None:
    old = {str(c.get("cluster")): c.get("phase") for c in (body.get("status") or {}).get("clusters") or ()
           if isinstance(c, Mapping)}
    after = await op.w.patch_status(FEDERATED_MODEL, body, status)
    if after is None:
        return
    for e in entries:
        if e.phase == CONFLICT and old.get(e.cluster) != CONFLICT:
            op.record(after, Event("Warning", FOREIGN, f"{e.cluster}: {e.message}"))


async def reconcile_federated(op: Operator, key: Key) -> Result:
    """Bring the copies of one FederatedModel in line with its spec; write its status."""
    ns, name = key
    body = op.store.get(FEDERATED_MODEL, ns, name)
    if body is None:
        return Result()
    if _md(body).get("deletionTimestamp"):
        return await cleanup(op, body)
    now = op.clock()
    try:
        fm = FederatedModel.from_obj(body)
    except SpecError as e:
        await op.w.patch_status(FEDERATED_MODEL, body, aggregate(body, [], 0, now, str(e)))
        return Result(permanent=str(e))
    body = await op.w.add_finalizer(FEDERATED_MODEL, body, FINALIZER)
    clusters = _clusters(op, ns)
    placed = targets(fm.spec, clusters)
    total = replicas(body, fm.spec)
    if total > MAX_MIN_REPLICAS:
        msg = f"replicasPerCluster {total} is above {MAX_MIN_REPLICAS}, the Model's serverless.minReplicas maximum"
        await op.w.patch_status(FEDERATED_MODEL, body, aggregate(body, [], len(placed), now, msg))
        return Result(permanent=msg)
    desired = member_model(body, fm.spec)
    # members are independent: one slow to answer does not hold up the others
    entries = list(await asyncio.gather(*(sync_member(op, body, c, clusters.get(c), desired, total)
                                          for c in placed)))
    for c in _status_clusters(body):
        if c in placed:
            continue
        if c not in clusters:
            op.record(body, Event("Warning", "CopyLeftBehind", f"Cluster {c} is gone: the copy of this Model there "
                                                               "(if any) was not removed"))
            continue
        why = await remove_copy(op, body, c, clusters.get(c))
        if why is not None:
            entries.append(Entry(c, REMOVING, message=f"left the placement; copy not removed yet: {why}",
                                 reason=MEMBER_UNREACHABLE))
    await _write(op, body, aggregate(body, entries, len(placed), now), entries)
    return Result(op.settings.federation_resync_s)


async def cleanup(op: Operator, body: Mapping[str, Any]) -> Result:
    """Deletion: remove the copies, then the finalizer (after the cleanup window at the latest)."""
    md = _md(body)
    if FINALIZER not in (md.get("finalizers") or ()):
        return Result()
    ns = str(md.get("namespace") or "default")
    clusters = _clusters(op, ns)
    names = set(_status_clusters(body))
    try:
        names.update(targets(FederatedModel.from_obj(body).spec, clusters))
    except SpecError:
        pass
    order = sorted(names)
    answers = await asyncio.gather(*(remove_copy(op, body, c, clusters.get(c)) for c in order))
    left = {c: why for c, why in zip(order, answers, strict=True) if why is not None}
    if left:
        since = opt_time(md.get("deletionTimestamp"))
        now = op.clock()
        waited = (now - since).total_seconds() if since is not None else 0.0
        window = op.settings.federation_cleanup_timeout_s
        if waited < window:
            conds = ConditionSet((body.get("status") or {}).get("conditions"), md.get("generation"), now)
            conds.set(SYNCED, "False", CLEANUP_PENDING,
                      f"deleting; copies not removed yet on: {', '.join(sorted(left))} (retried until "
                      f"{window:g}s after deletion)")
            await op.w.patch_status(FEDERATED_MODEL, body, {"conditions": conds.to_list()})
            return Result(max(0.05, min(op.settings.federation_resync_s, window - waited)))
        detail = "; ".join(f"{c}: {why}" for c, why in sorted(left.items()))
        op.record(body, Event("Warning", "CleanupIncomplete",
                              f"gave up after {window:g}s; a Model copy may remain on {detail}"))
        log.warning("FederatedModel %s/%s: finalizer removed with copies left on %s", ns, md.get("name"), detail)
    await op.w.remove_finalizer(FEDERATED_MODEL, body, FINALIZER)
    return Result()
