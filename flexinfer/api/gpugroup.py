"""The legacy ``GPUGroup`` CRD (ai.flexinfer/v1alpha1): schema, columns and typed view.

Owns: the members (ModelDeployments time-sharing one GPU), the scaling and anti-thrashing policy
with the original's defaults (Graceful preemption, 60 s drain; 30 s minimum run, 60 s cooldown after
preemption, queue threshold 3, 10 s hysteresis), and the status (active model, swaps, per-member
state). Choosing the active model is the operator's pure logic, not this module's.

Must not: import Kubernetes clients.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from flexinfer.api.common import INVALID_SPEC, V1ALPHA1, ObjectMeta, SpecError, check_kind, opt_time
from flexinfer.api.conditions import Condition, parse_conditions
from flexinfer.api.schema import (
    DNS_SUBDOMAIN,
    Column,
    KindDef,
    array,
    boolean,
    conditions,
    date_time,
    integer,
    name_ref,
    obj,
    observed_generation,
    rule,
    string,
)
from flexinfer.api.validate import validate, validate_lenient

PHASES = ("Pending", "Idle", "Active", "Draining", "Swapping", "Failed")
MEMBER_STATES = ("Active", "Preempted", "Queued", "Idle")
#: TimeSliced and MemoryShared were announced as future strategies and are not accepted
STRATEGIES = ("Exclusive",)
PREEMPTION_POLICIES = ("Immediate", "Graceful")


def _min_le_max(m: dict[str, Any]) -> bool:
    return m.get("minReplicas", 0) <= m.get("maxReplicas", 1)


MIN_MAX_RULE = rule("self.minReplicas <= self.maxReplicas", "minReplicas must not exceed maxReplicas", _min_le_max)

MEMBER = obj("A ModelDeployment in the group.", {
    "name": name_ref("ModelDeployment name."),
    "namespace": string("Its namespace; empty: the group's.", pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?)?$",
                        max_length=63, default=""),
    "priority": integer("Higher wins the GPU.", minimum=0, maximum=1000, default=100),
    "vramEstimateMB": integer("Expected VRAM use, MiB.", minimum=1, maximum=1048576),
    "minReplicas": integer("Replicas while not active.", minimum=0, maximum=10, default=0),
    "maxReplicas": integer("Replicas while active.", minimum=1, maximum=10, default=1),
}, required=["name"], rules=[MIN_MAX_RULE])

GROUP_SPEC = obj("ModelDeployments that time-share one GPU.", {
    "models": array(MEMBER, "Members.", min_items=1, max_items=32, list_type="map", map_keys=["name", "namespace"]),
    "scalingPolicy": obj("How the GPU is shared.", {
        "strategy": string("Exclusive: one member at a time.", enum=STRATEGIES, default="Exclusive"),
        "preemptionPolicy": string("Immediate or Graceful (drain first).", enum=PREEMPTION_POLICIES,
                                   default="Graceful"),
        "drainTimeoutSeconds": integer("Drain time for Graceful.", minimum=5, maximum=300, default=60),
    }),
    "antiThrashing": obj("Limits on swapping.", {
        "enabled": boolean("Apply the limits.", default=True),
        "minimumRunDurationSeconds": integer("Minimum time the active model runs before a swap.", minimum=0,
                                             maximum=3600, default=30),
        "cooldownAfterPreemptionSeconds": integer("Time before a preempted model may come back.", minimum=0,
                                                  maximum=3600, default=60),
        "requestQueueThreshold": integer("Queued requests needed to swap.", minimum=0, maximum=10000, default=3),
        "hysteresisWindowSeconds": integer("Time demand must persist before a swap (0 disables).", minimum=0,
                                           maximum=600, default=10),
    }),
    "autoCacheModels": boolean("Create ModelCaches for the members.", default=False),
}, required=["models"])

GROUP_STATUS = obj("Observed state of a GPUGroup.", {
    "observedGeneration": observed_generation(),
    "phase": string("Lifecycle phase.", enum=PHASES),
    "conditions": conditions(),
    "activeModel": string("Member holding the GPU."),
    "lastSwapTime": date_time("Time of the last swap."),
    "lastSwapReason": string("Why the last swap happened.", max_length=1024),
    "swapCount": integer("Swaps so far.", minimum=0, int64=True),
    "modelStatuses": array(obj("State of one member.", {
        "name": string("ModelDeployment name.", pattern=DNS_SUBDOMAIN),
        "namespace": string("Its namespace."),
        "state": string("Member state.", enum=MEMBER_STATES),
        "queuedRequests": integer("Requests waiting at the proxy.", minimum=0),
        "queuedSince": date_time("Since when requests wait."),
        "preemptedAt": date_time("When it was last preempted."),
        "preemptedBy": string("Member that preempted it."),
        "lastPreemptionResult": string("Outcome of the last preemption.", max_length=1024),
        "queueHistory": array(integer("", minimum=0), "Recent queue depths, oldest first.", max_items=60),
        "trend": string("Demand trend (Rising, Falling, Steady).", max_length=32),
    }, required=["name"]), "Per-member state.", max_items=32),
})

GPU_GROUP = KindDef(
    kind="GPUGroup",
    plural="gpugroups",
    singular="gpugroup",
    version=V1ALPHA1,
    short_names=("gpug",),
    description="Legacy (v1alpha1) group of ModelDeployments time-sharing one GPU.",
    spec=GROUP_SPEC,
    status=GROUP_STATUS,
    columns=(
        Column("Phase", ".status.phase"),
        Column("Active", ".status.activeModel"),
        Column("Swaps", ".status.swapCount", "integer"),
        Column("Strategy", ".spec.scalingPolicy.strategy", priority=1),
    ),
)


@dataclass(frozen=True, slots=True)
class GroupMember:
    name: str
    namespace: str  # resolved: the group's namespace when empty
    priority: int
    vram_estimate_mb: int | None
    min_replicas: int
    max_replicas: int


@dataclass(frozen=True, slots=True)
class AntiThrashing:
    enabled: bool
    minimum_run_duration_s: float
    cooldown_after_preemption_s: float
    request_queue_threshold: int
    hysteresis_window_s: float


@dataclass(frozen=True, slots=True)
class GPUGroupSpec:
    models: tuple[GroupMember, ...]
    strategy: str
    preemption_policy: str
    drain_timeout_s: float
    anti_thrashing: AntiThrashing
    auto_cache_models: bool

    @classmethod
    def from_dict(cls, raw: Any, namespace: str, path: str = "spec") -> GPUGroupSpec:
        if raw is None:
            raise SpecError(INVALID_SPEC, f"{path}: required")
        s = validate(GROUP_SPEC, raw, path)
        props = GROUP_SPEC["properties"]
        sp = s.get("scalingPolicy") or validate(props["scalingPolicy"], {}, f"{path}.scalingPolicy")
        at = s.get("antiThrashing") or validate(props["antiThrashing"], {}, f"{path}.antiThrashing")
        return cls(
            models=tuple(GroupMember(m["name"], m["namespace"] or namespace, m["priority"], m.get("vramEstimateMB"),
                                     m["minReplicas"], m["maxReplicas"]) for m in s["models"]),
            strategy=sp["strategy"], preemption_policy=sp["preemptionPolicy"],
            drain_timeout_s=float(sp["drainTimeoutSeconds"]),
            anti_thrashing=AntiThrashing(at["enabled"], float(at["minimumRunDurationSeconds"]),
                                         float(at["cooldownAfterPreemptionSeconds"]), at["requestQueueThreshold"],
                                         float(at["hysteresisWindowSeconds"])),
            auto_cache_models=s["autoCacheModels"],
        )


@dataclass(frozen=True, slots=True)
class MemberStatus:
    name: str
    namespace: str | None
    state: str | None
    queued_requests: int
    queued_since: datetime | None
    preempted_at: datetime | None
    preempted_by: str | None


@dataclass(frozen=True, slots=True)
class GPUGroupStatus:
    observed_generation: int | None = None
    phase: str | None = None
    conditions: tuple[Condition, ...] = ()
    active_model: str | None = None
    last_swap_time: datetime | None = None
    last_swap_reason: str | None = None
    swap_count: int = 0
    model_statuses: tuple[MemberStatus, ...] = ()

    @classmethod
    def from_dict(cls, raw: Any) -> GPUGroupStatus:
        s = validate_lenient(GROUP_STATUS, raw or {}) or {}
        return cls(
            s.get("observedGeneration"), s.get("phase"), parse_conditions(s.get("conditions")),
            s.get("activeModel") or None, opt_time(s.get("lastSwapTime")), s.get("lastSwapReason"),
            s.get("swapCount", 0),
            tuple(MemberStatus(m["name"], m.get("namespace"), m.get("state"), m.get("queuedRequests", 0),
                               opt_time(m.get("queuedSince")), opt_time(m.get("preemptedAt")), m.get("preemptedBy"))
                  for m in s.get("modelStatuses") or ()),
        )


@dataclass(frozen=True, slots=True)
class GPUGroup:
    meta: ObjectMeta
    spec: GPUGroupSpec
    status: GPUGroupStatus

    @classmethod
    def from_obj(cls, obj: Mapping[str, Any]) -> GPUGroup:
        check_kind(obj, "GPUGroup")
        meta = ObjectMeta.from_obj(obj)
        return cls(meta, GPUGroupSpec.from_dict(obj.get("spec"), meta.namespace),
                   GPUGroupStatus.from_dict(obj.get("status")))
