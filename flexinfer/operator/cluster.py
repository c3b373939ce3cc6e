"""Cluster (v1alpha2) controller: probe a member cluster's API server every ``probeInterval``.

Owns, for one Cluster: opening its client from the kubeconfig Secret (``members``), the probe
(``GET /version`` timed for the latency, ``GET /api/v1/nodes`` for the GPU capacity,
``GET .../models`` for the Models it runs), the phase it maps to, the status it writes, and when it
probes next.

- Phases: ``Ready`` (``/version`` answered); ``Unreachable`` (no answer, a timeout, a 5xx or 429);
  ``Unauthorized`` (401 or 403 on ``/version``: the credentials are refused); ``Invalid`` (the Secret
  is missing or unreadable, the kubeconfig is broken or runs commands, or the spec does not parse).
  Each is the ``Ready`` condition with a reason (``Probed``, ``Unreachable``, ``Unauthorized``,
  ``SecretNotFound``, ``SecretForbidden``, ``KubeconfigInvalid``, ``InvalidSpec``) and a message.
  Nothing of this raises into the work queue: a broken Cluster is a status, never a crash loop.
- Capacity: nodes carrying any ``flexinfer.ai/gpu.*`` label count; per GPU resource
  (``nvidia.com/gpu``, ``amd.com/gpu``, ``gpu.intel.com/i915``) their allocatable (else capacity)
  is summed; a labelled node without such a resource counts its ``flexinfer.ai/gpu.count`` under the
  vendor's resource. Nodes or Models the credentials may not list are left out and said in ``message``.
- Next probe: ``probeInterval`` after a Ready or Unauthorized probe; while Unreachable,
  ``min(probeInterval * 2**(n-1), max(probeInterval, min(10 * probeInterval, 300 s)))`` after the
  n-th failure in a row (back to ``probeInterval`` once it answers); an Invalid Cluster is looked at
  again every ``probeInterval`` (a fixed Secret is noticed without an event).
- Status is written only when it changed. ``lastProbeTime`` and ``probeLatencyMs`` do not count as a
  change by themselves: they are written with any other change, when the median latency of the last
  five probes moved by more than ``max(100 ms, 50 %)`` from the written one, or when the written
  ``lastProbeTime`` is older than ``max(10 * probeInterval, 300 s)`` (a heartbeat). So a steady
  cluster costs one status write per heartbeat, not one per probe.
- A phase change (or a Cluster gone) wakes the FederatedModels of the namespace.

Must not: write to member clusters (the probe only reads), or touch FederatedModels itself.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from decimal import Decimal
from typing import Any

from flexinfer import labels
from flexinfer.api.common import SpecError, format_time, opt_time, parse_quantity
from flexinfer.api.conditions import READY, ConditionSet
from flexinfer.api.federation import Cluster
from flexinfer.k8s.errors import KubeAPIError
from flexinfer.operator.api_resources import CLUSTER, MODEL, NODE
from flexinfer.operator.context import Operator
from flexinfer.operator.kubeapi import KubeClient
from flexinfer.operator.members import Member, MemberClients, MemberConfigError, ProbeMemory
from flexinfer.operator.results import Event, Result

log = logging.getLogger("flexinfer.operator.cluster")
QUEUE = "cluster"
READY_PHASE, UNREACHABLE, UNAUTHORIZED, INVALID = "Ready", "Unreachable", "Unauthorized", "Invalid"
INVALID_SPEC = "InvalidSpec"
PROBED = "Probed"
MAX_MODELS = 1000
LATENCY_FLOOR_MS = 100.0
HEARTBEAT_FLOOR_S = 300.0
#: status fields whose change alone does not cause a write (see the module docstring)
VOLATILE = ("lastProbeTime", "probeLatencyMs")
_GPU_LABEL = labels.PREFIX + "gpu."
_VENDOR_RESOURCE = {"nvidia": labels.RESOURCE_NVIDIA_GPU, "amd": labels.RESOURCE_AMD_GPU,
                    "intel": labels.RESOURCE_INTEL_GPU}

Key = tuple[str, str]


def _md(body: Mapping[str, Any]) -> Mapping[str, Any]:
    return body.get("metadata") or {}


def hub(op: Operator) -> KubeClient:
    """The hub's API client (the operator's own)."""
    if op.kube is None:
        raise RuntimeError("the operator is not started (no API client)")
    return op.kube


def members_of(op: Operator) -> MemberClients:
    if op.members is None:
        op.members = MemberClients(timeout_s=min(10.0, op.settings.request_timeout_s))
    members: MemberClients = op.members
    return members


# ---- pure parts -------------------------------------------------------------------------------------

def gpu_capacity(nodes: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """GPU resource -> total over the nodes with ``flexinfer.ai/gpu.*`` labels (see the module docstring)."""
    total: dict[str, Decimal] = {}
    for node in nodes:
        lbl = _md(node).get("labels") or {}
        if not any(str(k).startswith(_GPU_LABEL) for k in lbl):
            continue
        st = node.get("status") or {}
        res = st.get("allocatable") or st.get("capacity") or {}
        found = False
        for name in labels.GPU_RESOURCES:
            if name in res:
                try:
                    total[name] = total.get(name, Decimal(0)) + parse_quantity(res[name])
                    found = True
                except SpecError:
                    continue
        vendor = _VENDOR_RESOURCE.get(str(lbl.get(labels.GPU_VENDOR, "")).lower())
        count = str(lbl.get(labels.GPU_COUNT, ""))
        if not found and vendor and count.isdigit():
            total[vendor] = total.get(vendor, Decimal(0)) + int(count)
    return {k: str(int(v)) if v == int(v) else str(v) for k, v in sorted(total.items())}


def model_list(models: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
    out = [{"name": str(_md(m).get("name")), "namespace": str(_md(m).get("namespace") or ""),
            "phase": str((m.get("status") or {}).get("phase") or "")} for m in models]
    return sorted(out, key=lambda e: (e["namespace"], e["name"]))[:MAX_MODELS]


def next_probe(interval_s: float, failures: int) -> float:
    """Seconds until the next probe after ``failures`` unreachable probes in a row (0: it answered)."""
    if failures <= 0:
        return interval_s
    cap = max(interval_s, min(10 * interval_s, HEARTBEAT_FLOOR_S))
    return float(min(interval_s * 2 ** min(failures - 1, 30), cap))


def needs_write(desired: Mapping[str, Any], observed: Mapping[str, Any], interval_s: float,
                now: datetime) -> bool:
    """Whether ``desired`` differs from ``observed`` enough to be written (see the module docstring)."""
    for k, v in desired.items():
        if k not in VOLATILE and observed.get(k) != v:
            return True
    if "probeLatencyMs" in desired:
        old, new = observed.get("probeLatencyMs"), float(desired["probeLatencyMs"])
        if not isinstance(old, int | float) or abs(new - old) > max(LATENCY_FLOOR_MS, 0.5 * old):
            return True
    last = opt_time(observed.get("lastProbeTime"))
    return last is None or (now - last).total_seconds() >= max(10 * interval_s, HEARTBEAT_FLOOR_S)


# ---- the probe --------------------------------------------------------------------------------------

async def probe(member: Member, mem: ProbeMemory) -> dict[str, Any]:
    """Probe one cluster: the status fields a Ready cluster gets. Raises ``KubeAPIError`` when
    ``/version`` fails (the caller maps it to a phase). The first probe through a new client sends
    ``/version`` twice and times the second: the latency is a round trip, not a connection set-up."""
    kube = member.kube
    if not member.warm:
        await kube.request("GET", "/version", verb="get")
        member.warm = True
    t0 = time.perf_counter()
    version = await kube.request("GET", "/version", verb="get")
    mem.latencies_ms.append((time.perf_counter() - t0) * 1000.0)
    out: dict[str, Any] = {"serverVersion": str((version or {}).get("gitVersion") or "unknown")}
    notes = []
    try:
        out["capacity"] = gpu_capacity(await kube.list(NODE))
    except KubeAPIError as e:
        if e.status not in (401, 403, 404):
            raise
        notes.append(f"nodes not listed ({e.status}): GPU capacity unknown")
        out["capacity"] = None
    try:
        out["models"] = model_list(await kube.list(MODEL))
    except KubeAPIError as e:
        if e.status == 404:
            out["models"] = []  # no Model CRD there (yet)
        elif e.status in (401, 403):
            notes.append(f"Models not listed ({e.status})")
            out["models"] = None
        else:
            raise
    out["message"] = "; ".join(notes) or None
    return out


def _failure(e: KubeAPIError) -> tuple[str, str, str]:
    """(phase, reason, message) of a failed ``/version``."""
    if e.status in (401, 403):
        return UNAUTHORIZED, UNAUTHORIZED, f"the API server refused the credentials ({e.status}): {e.detail}"
    what = f"HTTP {e.status}: {e.detail}" if e.status else e.detail
    return UNREACHABLE, UNREACHABLE, f"no usable answer from the API server: {what}"


# ---- the reconcile ----------------------------------------------------------------------------------

async def _write(op: Operator, body: Mapping[str, Any], status: dict[str, Any], interval_s: float) -> None:
    observed = body.get("status") or {}
    now = op.clock()
    status["lastProbeTime"] = format_time(now)
    if not needs_write(status, observed, interval_s, now):
        return
    old_phase = observed.get("phase")
    after = await op.w.patch_status(CLUSTER, body, status)
    if after is not None and old_phase != status.get("phase"):
        typ = "Normal" if status.get("phase") == READY_PHASE else "Warning"
        op.record(after, Event(typ, str(status.get("phase")), str(status.get("message") or status.get("phase"))))
        wake_federated(op, str(_md(body).get("namespace") or "default"))


def wake_federated(op: Operator, ns: str) -> None:
    """Reconcile every FederatedModel of ``ns`` (a Cluster there changed phase or went)."""
    from flexinfer.operator import federation
    from flexinfer.operator.api_resources import FEDERATED_MODEL

    for fm in op.store.list(FEDERATED_MODEL, ns):
        op.trigger(federation.QUEUE, (ns, str(_md(fm).get("name"))))


def _status(body: Mapping[str, Any], now: datetime, phase: str, reason: str, message: str,
            fields: Mapping[str, Any] | None = None) -> dict[str, Any]:
    conds = ConditionSet((body.get("status") or {}).get("conditions"), _md(body).get("generation"), now)
    conds.set(READY, "True" if phase == READY_PHASE else "False", reason, message)
    out: dict[str, Any] = {"observedGeneration": _md(body).get("generation"), "phase": phase,
                           "conditions": conds.to_list(), "message": message}
    if fields is not None:
        out.update(fields)
    return out


async def reconcile_cluster(op: Operator, key: Key) -> Result:
    """Probe one Cluster and write its status when it changed; answer when to probe again."""
    ns, name = key
    members = members_of(op)
    body = op.store.get(CLUSTER, ns, name)
    if body is None:
        await members.forget(key)
        return Result()
    now = op.clock()
    try:
        cl = Cluster.from_obj(body)
    except SpecError as e:
        await members.drop(key)
        await _write(op, body, _status(body, now, INVALID, INVALID_SPEC, str(e)), 3600.0)
        return Result()
    interval = max(0.05, cl.spec.probe_interval_s)
    mem = members.memory(key)
    try:
        member = await members.open(hub(op), ns, name, cl.spec.secret_name, cl.spec.secret_key)
    except MemberConfigError as e:
        mem.failures = 0
        await _write(op, body, _status(body, now, INVALID, e.reason, e.message), interval)
        return Result(interval)
    try:
        fields = await probe(member, mem)
    except KubeAPIError as e:
        phase, reason, message = _failure(e)
        member.warm = False  # the next answer may come over a new connection
        mem.failures = mem.failures + 1 if phase == UNREACHABLE else 0
        await _write(op, body, _status(body, now, phase, reason, message), interval)
        return Result(next_probe(interval, mem.failures))
    mem.failures = 0
    fields["probeLatencyMs"] = round(statistics.median(mem.latencies_ms), 1)
    message = fields.pop("message") or f"{member.server} answered"
    await _write(op, body, _status(body, now, READY_PHASE, PROBED, message, fields), interval)
    return Result(interval)


def route_cluster(op: Operator, body: Mapping[str, Any], deleted: bool) -> None:
    """A Cluster watch event: probe now when its spec moved (or it went); wake the namespace's
    FederatedModels (its phase or labels may have changed)."""
    md = _md(body)
    key = (str(md.get("namespace") or "default"), str(md.get("name")))
    mem = members_of(op).memory(key)
    if deleted or mem.generation != md.get("generation"):
        mem.generation = md.get("generation")
        op.trigger(QUEUE, key)
    wake_federated(op, key[0])
