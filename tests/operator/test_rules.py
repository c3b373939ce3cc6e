"""Table tests of the pure rules: selective merge, GPU detection, desired replicas, shared-GPU groups,
GPUGroup anti-thrashing, alias conflicts, transition events, the store overlay and the work queue."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from flexinfer.api import Model, SpecError
from flexinfer.api.gpugroup import AntiThrashing
from flexinfer.operator.api_resources import DEPLOYMENT
from flexinfer.operator.controller import WorkQueue
from flexinfer.operator.diff import is_subset, merge_patch
from flexinfer.operator.gpu import detect_gpu
from flexinfer.operator.gpugroup import MemberObs, decide
from flexinfer.operator.model import member_state
from flexinfer.operator.model_logic import (
    alias_conflicts,
    claimed_names,
    desired_replicas,
    loading_since,
    transition_events,
)
from flexinfer.operator.results import Result
from flexinfer.operator.shared_group import GroupMemberState, plan_group
from flexinfer.operator.store import Store
from flexinfer.sharing import Windows
from tests.operator.harness import gpu_node

NOW = datetime(2025, 7, 1, 12, 0, tzinfo=UTC)


def ago(s: float) -> datetime:
    return NOW - timedelta(seconds=s)


# ---- selective merge ----------------------------------------------------------------------------------

MERGE = [
    # desired, observed, owned, expected patch
    ({"spec": {"replicas": 1}}, {"spec": {"replicas": 1, "revisionHistoryLimit": 10}}, (), {}),
    ({"spec": {"replicas": 2}}, {"spec": {"replicas": 1}}, (), {"spec": {"replicas": 2}}),
    ({"a": {"x": None}}, {"a": {"x": "1", "y": "2"}}, (), {"a": {"x": None}}),
    ({"a": {"x": None}}, {"a": {"y": "2"}}, (), {}),
    ({"l": [{"name": "c", "image": "i"}]}, {"l": [{"name": "c", "image": "i", "terminationMessagePath": "/t"}]}, (), {}),
    ({"l": [{"name": "c", "image": "j"}]}, {"l": [{"name": "c", "image": "i", "tmp": 1}]}, (),
     {"l": [{"name": "c", "image": "j"}]}),
    ({"l": [1, 2]}, {"l": [1, 2, 3]}, (), {"l": [1, 2]}),
    ({"r": {"limits": {"memory": "1Gi"}}}, {"r": {"limits": {"memory": "1024Mi"}}}, (), {}),
    ({"r": {"limits": {"cpu": "0.5"}}}, {"r": {"limits": {"cpu": "500m"}}}, (), {}),
    ({"env": [{"name": "A", "value": "1"}]}, {"env": [{"name": "A", "value": "1.0"}]}, (),
     {"env": [{"name": "A", "value": "1"}]}),
    ({"m": {"a": "1"}}, {"m": {"a": "1", "b": "2"}}, (("m",),), {"m": {"b": None}}),
    ({"port": 8080}, {"port": 8080.0}, (), {}),
    ({"flag": True}, {"flag": 1}, (), {"flag": True}),
    ({"new": {"a": {"b": None, "c": 1}}}, {}, (), {"new": {"a": {"c": 1}}}),
]


@pytest.mark.parametrize(("desired", "observed", "owned", "expected"), MERGE)
def test_merge_patch(desired: Any, observed: Any, owned: Any, expected: Any) -> None:
    assert merge_patch(desired, observed, owned) == expected
    if not owned:
        assert is_subset(desired, observed) == (expected == {})


# ---- GPU detection ------------------------------------------------------------------------------------

def test_detect_gpu() -> None:
    n1, a1 = gpu_node("n1"), gpu_node("a1", "amd")
    t = detect_gpu([n1], {}, "auto")
    assert (t.vendor, t.arch, t.nodes, t.vram_mb) == ("nvidia", "sm_89", 1, 24576)
    assert detect_gpu([n1, a1], {}, "amd").arch == "gfx1100"
    with pytest.raises(SpecError) as e:
        detect_gpu([n1, a1], {}, "auto")
    assert e.value.reason == "AmbiguousGPUVendor"
    assert detect_gpu([n1, gpu_node("a1", "amd", extra_labels={"pool": "b"})], {"pool": "b"}, "auto").vendor == "amd"
    for nodes, sel in (([], {}), ([gpu_node("n1", ready=False)], {}), ([n1], {"pool": "x"})):
        with pytest.raises(SpecError) as e:
            detect_gpu(nodes, sel, "auto")
        assert e.value.reason == "NoMatchingNodes"
    old = gpu_node("m1", major="5", minor="2", vram="4Gi")
    assert detect_gpu([old, gpu_node("m2", major="5", minor="2", vram="4Gi"), n1], {}, "nvidia").arch == "sm_52"
    fam = gpu_node("a2", "amd")
    fam["metadata"]["labels"] = {"amd.com/gpu.family.GC_10_3_6": "1"}
    assert detect_gpu([fam], {}, "amd").arch == "gfx1036"


# ---- desired replicas ------------------------------------------------------------------------------------

def _m(**spec: Any) -> Model:
    return Model.from_obj({"kind": "Model", "metadata": {"name": "m"},
                           "spec": {"backend": "ollama", "source": "ollama://x", **spec}})


REPLICAS = [
    # spec, shared state, phase, last active (s ago), expected replicas, expected requeue is set
    ({}, None, None, None, 0, False),
    ({"serverless": {"minReplicas": 2}}, None, None, None, 2, False),
    ({"serverless": {"enabled": False}}, None, None, None, 1, False),
    ({}, None, "Idle", 60, 1, True),
    ({}, None, "Idle", 301, 0, False),
    ({"serverless": {"idleTimeout": "10m"}}, None, "Ready", 400, 1, True),
    ({}, None, "Loading", 900, 1, False),  # never reaped mid-load
    ({"gpu": {"shared": "g"}}, "Queued", "Idle", 10, 0, False),
    ({"gpu": {"shared": "g"}}, "Active", "Idle", 10, 1, True),
    ({"gpu": {"shared": "g"}}, None, "Idle", 10, 0, False),
    ({"backend": "diffusers", "source": "HF://x/y", "gpu": {}}, None, "Ready", 400, 1, True),  # 10 m default
]


@pytest.mark.parametrize(("spec", "state", "phase", "active", "want", "requeue"), REPLICAS)
def test_desired_replicas(spec: dict[str, Any], state: str | None, phase: str | None, active: float | None,
                          want: int, requeue: bool) -> None:
    n, r = desired_replicas(_m(**spec), state, phase, None if active is None else ago(active), NOW)
    assert n == want and (r is not None) == requeue


# ---- shared-GPU groups ----------------------------------------------------------------------------------------

W = Windows(demand=120, recent=300, min_cooldown=300)


def test_group_initial_and_demand() -> None:
    members = [GroupMemberState("a", 100), GroupMemberState("b", 50), GroupMemberState("c", 100)]
    p = plan_group("g", members, NOW, W)
    assert p.leader == "a"
    assert p.shared_status["a"] == {"groupName": "g", "state": "Active", "queuePosition": 0, "preemptedBy": None,
                                    "preemptedAt": None}
    assert [p.shared_status[n]["queuePosition"] for n in ("c", "b")] == [1, 2]
    assert p.shared_status["b"]["state"] == "Queued" and p.shared_status["b"]["preemptedBy"] == "a"
    # demand on b while the Ready leader a is idle: b takes over, a is Preempted
    members = [GroupMemberState("a", 100, "Ready", ago(600), "Active"), GroupMemberState("b", 100, "Idle", ago(5)),
               GroupMemberState("c", 100, "Idle")]
    p = plan_group("g", members, NOW, W)
    assert p.leader == "b"
    assert p.shared_status["a"]["state"] == "Preempted" and p.shared_status["a"]["preemptedAt"] == "2025-07-01T12:00:00Z"
    assert [e.reason for e in p.events["a"]] == ["Preempted"] and "Preempted by b" in p.events["a"][0].message
    assert [e.reason for e in p.events["b"]] == ["Activated"]
    assert p.next_check is not None and p.next_check <= 115.1


def test_group_cooldown_and_priority() -> None:
    # right after a swap, demand on the preempted member does not swap back (cooldown)
    members = [GroupMemberState("a", 100, "Preempted", ago(1), "Preempted", preempted_at=ago(30)),
               GroupMemberState("b", 100, "Loading", ago(40), "Active")]
    assert plan_group("g", members, NOW, W).leader == "b"
    after = [GroupMemberState("a", 100, "Preempted", ago(1), "Preempted", preempted_at=ago(301)),
             GroupMemberState("b", 100, "Ready", ago(200), "Active")]
    assert plan_group("g", after, NOW, W).leader == "a"  # cooldown over, b idle, a demanded
    # a busy Ready model keeps the GPU against equal-priority demand, not against higher priority
    busy = [GroupMemberState("a", 100, "Ready", ago(10), "Active"), GroupMemberState("b", 100, "Idle", ago(5))]
    assert plan_group("g", busy, NOW, W).leader == "a"
    hi = [GroupMemberState("a", 100, "Ready", ago(10), "Active"), GroupMemberState("b", 200, "Idle", ago(5))]
    assert plan_group("g", hi, NOW, W).leader == "b"
    failed = [GroupMemberState("a", 500, "Failed"), GroupMemberState("b", 100)]
    assert plan_group("g", failed, NOW, W).leader == "b"



def test_group_late_refinements() -> None:
    # warmPolicy primary wins the idle fallback
    idle = [GroupMemberState("a", 200), GroupMemberState("p", 50, primary=True)]
    assert plan_group("g", idle, NOW, W).leader == "p"
    # forcePromotion: a demanded forced member takes the GPU from a busy Ready leader, the leader is Preempted
    busy = [GroupMemberState("a", 100, "Ready", ago(5), "Active", cache_ready=True),
            GroupMemberState("b", 100, "Idle", ago(1), "Queued", force_promotion=True)]
    p = plan_group("g", busy, NOW, W)
    assert p.leader == "b" and p.shared_status["a"]["state"] == "Preempted"
    # ... but not while its cache is not ready; nor does an uncached demand preempt an idle Ready leader
    uncached = [busy[0], replace(busy[1], cache_ready=False)]
    assert plan_group("g", uncached, NOW, W).leader == "a"
    idle_ready = [GroupMemberState("a", 100, "Ready", ago(500), "Active"),
                  GroupMemberState("b", 100, "Idle", ago(1), "Queued", cache_ready=False)]
    assert plan_group("g", idle_ready, NOW, W).leader == "a"
    # an Active Loading member keeps the lead within its coldStartTimeout; the plan looks again when it ends
    loading = [GroupMemberState("a", 100, "Loading", ago(200), "Active", loading_since=ago(20),
                                cold_start_timeout_s=60),
               GroupMemberState("b", 900, "Idle", ago(1), "Queued")]
    p = plan_group("g", loading, NOW, W)
    assert p.leader == "a" and p.next_check is not None and 39.9 < p.next_check < 40.2
    assert plan_group("g", loading, NOW + timedelta(seconds=41), W).leader == "b"


def _member_body(**over: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"metadata": {"name": "m"}, "spec": {"gpu": {"shared": "g"}}, "status": {}}
    for k, v in over.items():
        body[k].update(v)
    return body


def test_member_state_reads_the_refinements() -> None:
    ms = member_state(_member_body(), "g")
    assert (ms.force_promotion, ms.primary, ms.cache_ready, ms.loading_since, ms.cold_start_timeout_s) == (
        False, False, False, None, 60.0)  # no status yet: the cache is not known to be ready
    at = "2025-07-01T11:59:40Z"
    ms = member_state(_member_body(
        spec={"gpu": {"shared": "g", "forcePromotion": True}, "config": {"warmPolicy": "primary"},
              "serverless": {"coldStartTimeout": "3m"}},
        status={"phase": "Loading", "loadingProgressAt": at,
                "conditions": [{"type": "Cached", "status": "True"}]}), "g")
    assert (ms.force_promotion, ms.primary, ms.cache_ready, ms.cold_start_timeout_s) == (True, True, True, 180.0)
    assert ms.loading_since == ago(20)
    # the load start counts only while Pending/Loading; an unreadable timeout falls back to the default
    ms = member_state(_member_body(spec={"serverless": {"coldStartTimeout": "soon"}, "config": {"warmPolicy": "lazy"}},
                                   status={"phase": "Ready", "loadingProgressAt": at,
                                           "conditions": [{"type": "Cached", "status": "False"}]}), "g")
    assert (ms.loading_since, ms.cold_start_timeout_s, ms.primary, ms.cache_ready) == (None, 60.0, False, False)


def test_loading_since() -> None:
    now_s = "2025-07-01T12:00:00Z"
    assert loading_since({}, "Loading", True, NOW) == now_s  # a load starts
    assert loading_since({"loadingProgressAt": "2025-07-01T11:00:00Z"}, "Loading", True, NOW) == "2025-07-01T11:00:00Z"
    assert loading_since({"loadingProgressAt": "garbage"}, "Pending", True, NOW) == now_s
    assert loading_since({}, "Pending", False, NOW) is None  # waiting for the cache is not loading
    assert loading_since({"loadingProgressAt": now_s}, "Ready", True, NOW) is None
    assert loading_since({"loadingProgressAt": now_s}, "Idle", True, NOW) is None

# ---- GPUGroup anti-thrashing --------------------------------------------------------------------------------------

AT = AntiThrashing(True, 30.0, 60.0, 3, 10.0)


def test_gpugroup_decide() -> None:
    a, b = MemberObs("a", 100), MemberObs("b", 100)
    assert decide(AT, None, None, [a, b], NOW).active is None
    d = decide(AT, None, None, [a, MemberObs("b", 100, queue=1, queued_since=ago(1))], NOW)
    assert (d.active, d.swap) == ("b", True)  # nothing active: the first request wins at once
    warm = MemberObs("a", 100, last_access=ago(100))
    assert decide(AT, "a", ago(500), [warm, b], NOW).active == "a"
    cold = MemberObs("a", 100, last_access=ago(400))
    d = decide(AT, "a", ago(500), [cold, b], NOW)
    assert d.active is None and d.swap
    # queue below threshold, then too young (hysteresis), then min-run, then cooldown
    assert decide(AT, "a", ago(500), [warm, MemberObs("b", 100, queue=2, queued_since=ago(60))], NOW).active == "a"
    d = decide(AT, "a", ago(500), [warm, MemberObs("b", 100, queue=5, queued_since=ago(3))], NOW)
    assert d.active == "a" and d.blocked == "hysteresis" and 6.9 < (d.requeue_after or 0) < 7.2
    d = decide(AT, "a", ago(20), [warm, MemberObs("b", 100, queue=5, queued_since=ago(15))], NOW)
    assert d.active == "a" and d.blocked == "minimumRunDuration"
    d = decide(AT, "a", ago(500), [warm, MemberObs("b", 100, queue=5, queued_since=ago(15), preempted_at=ago(30))],
               NOW)
    assert d.active == "a" and d.blocked == "cooldown"
    d = decide(AT, "a", ago(500), [warm, MemberObs("b", 100, queue=5, queued_since=ago(15))], NOW)
    assert (d.active, d.swap, d.reason) == ("b", True, "demand: queue=5, priority=100")
    # winner order: queue, then priority, then longest wait
    d = decide(AT, None, None, [MemberObs("a", 50, queue=9, queued_since=ago(99)),
                                MemberObs("b", 90, queue=1, queued_since=ago(1)),
                                MemberObs("c", 90, queue=1, queued_since=ago(5))], NOW)
    assert d.active == "c"
    off = AntiThrashing(False, 30.0, 60.0, 3, 10.0)
    assert decide(off, "a", ago(1), [warm, MemberObs("b", 100, queue=1, queued_since=ago(0))], NOW).active == "b"


# ---- alias conflicts and events ---------------------------------------------------------------------------------------

def test_alias_conflicts() -> None:
    assert claimed_names({"litellm": {"servedModelName": "s", "aliases": ["a", ""], "copilotAlias": "c"}}) == \
        {"s", "a", "c"}
    assert claimed_names({"litellm": {"enabled": False, "aliases": ["a"]}}) == frozenset()
    peers = [("m1", frozenset({"a", "m1"})), ("m2", frozenset({"b"})), ("x", frozenset())]
    assert alias_conflicts("m1", {"a", "m1"}, peers) == []
    assert alias_conflicts("m3", {"a", "x", "z"}, peers) == ["'a' is also claimed by m1", "'x' is also claimed by x"]


def _st(phase: str, **conds: tuple[str, str, str]) -> dict[str, Any]:
    return {"phase": phase, "conditions": [{"type": t, "status": s, "reason": r, "message": m}
                                           for t, (s, r, m) in conds.items()]}


def test_transition_events() -> None:
    ready = _st("Ready", Ready=("True", "BackendReady", "1 ready"))
    assert [(e.type, e.reason) for e in transition_events(_st("Loading"), ready)] == [("Normal", "BackendReady")]
    assert transition_events(ready, ready) == []
    failed = _st("Failed", Ready=("False", "VRAMInsufficient", "too big"))
    assert [(e.type, e.reason) for e in transition_events({}, failed)] == [("Warning", "VRAMInsufficient")]
    warn = _st("Idle", Schedulable=("True", "Schedulable", "runs on nvidia; VRAMPressure: 85%"))
    assert [(e.reason, e.message) for e in transition_events({}, warn)] == [("VRAMPressure", "85%")]
    conflict = _st("Idle", ConfigValid=("False", "AliasConflict", "'a' is also claimed by b"))
    assert [e.reason for e in transition_events({}, conflict)] == ["AliasConflict"]
    assert transition_events(conflict, conflict) == []


# ---- store overlay -------------------------------------------------------------------------------------------------------

def _obj(rv: str, replicas: int = 1) -> dict[str, Any]:
    return {"metadata": {"name": "d", "namespace": "ns", "resourceVersion": rv}, "spec": {"replicas": replicas}}


def test_store_overlay() -> None:
    index: dict[tuple[str, str], list[dict[str, Any]]] = {}
    st = Store()
    st.bind(DEPLOYMENT, index)
    assert st.get(DEPLOYMENT, "ns", "d") is None
    st.wrote(DEPLOYMENT, None, _obj("5"))  # created; the watch has not delivered it yet
    assert st.get(DEPLOYMENT, "ns", "d")["metadata"]["resourceVersion"] == "5"
    assert [b["metadata"]["name"] for b in st.list(DEPLOYMENT, "ns")] == ["d"] and st.list(DEPLOYMENT, "x") == []
    index[("ns", "d")] = [_obj("5")]
    assert st.seen(DEPLOYMENT, _obj("5")) is True  # the echo of our own create
    assert st.overlay_size == 0 and st.keys_of(DEPLOYMENT) == [("ns", "d")]
    st.wrote(DEPLOYMENT, _obj("5"), _obj("7", 2))  # patched; the index still shows 5
    assert st.get(DEPLOYMENT, "ns", "d")["spec"]["replicas"] == 2
    assert st.list(DEPLOYMENT, "ns")[0]["spec"]["replicas"] == 2
    assert st.seen(DEPLOYMENT, _obj("5")) is False  # an older event: the overlay stays
    assert st.get(DEPLOYMENT, "ns", "d")["spec"]["replicas"] == 2
    index[("ns", "d")] = [_obj("9", 3)]  # someone else's newer version arrives: the index wins
    assert st.get(DEPLOYMENT, "ns", "d")["spec"]["replicas"] == 3 and st.overlay_size == 0
    st.deleted(DEPLOYMENT, "ns", "d", _obj("9", 3))
    assert st.get(DEPLOYMENT, "ns", "d") is None and st.list(DEPLOYMENT, "ns") == []
    st.seen(DEPLOYMENT, _obj("9", 3), deleted=True)
    del index[("ns", "d")]
    assert st.overlay_size == 0 and st.get(DEPLOYMENT, "ns", "d") is None


# ---- work queue --------------------------------------------------------------------------------------------------------------

async def test_work_queue_coalesces_serialises_and_backs_off() -> None:
    calls: list[str] = []
    running: set[str] = set()
    fails = {"bad": 2}

    async def fn(key: str) -> Result:
        assert key not in running  # never twice at once
        running.add(key)
        calls.append(key)
        await asyncio.sleep(0.02)
        running.discard(key)
        if fails.get(key, 0) > 0:
            fails[key] -= 1
            raise RuntimeError("boom")
        return Result(0.05 if key == "again" and calls.count("again") < 3 else None)

    q = WorkQueue("t", fn, workers=3, retry_base_s=0.01, retry_max_s=0.05)
    q.start()
    for _ in range(5):
        q.trigger("a")
    q.trigger("bad")
    q.trigger("again")
    await asyncio.sleep(0.01)
    q.trigger("a")  # while running: deferred, runs once more afterwards
    for _ in range(100):
        await asyncio.sleep(0.02)
        if not q.busy and q.pending("again") is None and calls.count("bad") == 3:
            break
    await q.stop()
    assert calls.count("a") == 2 and calls.count("bad") == 3 and calls.count("again") == 3
    assert q.errors == 2
    res = await WorkQueue("n", fn).run_now("x")
    assert res == Result()
