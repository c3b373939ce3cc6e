"""F19 operator chaos: the real operator against the emulator under the plan's fault mix (reliability
plan §3.9 O1-O6, O9; §5 F19), for many Models at once.

Every operator request draws from a seeded dice: 30 % get a 5xx or a 429 (with ``Retry-After``),
10 % of the PATCH/PUT writes get a 409 Conflict, 5 % are delayed past the request timeout (the
request then proceeds, as a slow apiserver would: a timed-out POST may still create the object, so
the operator's retry meets a real 409 AlreadyExists), and every watch stream is dropped at a fixed
interval. The intervals are the plan's scaled down for CI (request timeout 5 s → 1 s, watch drop
5 s → 0.25 s, Retry-After 2 s → 1 s, the smallest whole second). The test's own requests (creating
and deleting the Models) are exempt, and retried by the test if the emulator answers an error.

Checked: every valid Model converges (phase Idle, Ready condition set) within T; every invalid one
gets a terminal ``Ready=False`` condition with a reason and at most 2 writes (versions the emulator
committed after the create: a no-op patch, such as the retry of a timed-out patch that landed,
commits none, as on a real apiserver); exactly one Deployment and one Service per valid Model (by
owner), none for invalid ones; after deleting all Models: 0 Models (so 0 finalizers and none stuck
Terminating), 0 Deployments, 0 Services.

The 6-CR run is in ``make test``; the 100-CR run is marked ``reliability``. Two focused tests drive
the defects the 6-CR run found (bench/results/reliability-f19-f20.md, F19): a Model lost when kopf's
create handler failed and kopf's progress patch then got a 409 (kopf forgets the object until its
next event; the work queue now retries a failed ``run_now``), and the redundant status write when
kopf's concurrent annotation patch is delivered after our answer (the store keeps its overlay for
a version known to be older). ``F19_DUMP=<dir>`` writes the request log and the Models to
``<dir>/chaos.json``, ``F19_LOG=<dir>`` kopf's and the operator's DEBUG log.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import os
import random
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from tests.kube_emulator import Fault, KubeEnv
from tests.operator.harness import DEPLOYMENTS, MODELS, SERVICES, TEST_SETTINGS, model, run_operator

CHAOS_SETTINGS = replace(TEST_SETTINGS, request_timeout_s=1.0)
TIMEOUT_DELAY = 1.3  # > request_timeout_s
WATCH_DROP_S = 0.25
EXEMPT = re.compile(r"/models$|/models/[^/]+$")  # the test's POST and DELETE of Models


@dataclass
class Dice:
    """One draw per request decides which fault (if any) answers it."""

    rnd: random.Random
    p_5xx_429: float = 0.30
    p_409: float = 0.10
    p_timeout: float = 0.05
    category: str = ""
    seen: collections.Counter[str] = field(default_factory=collections.Counter)
    faulted: collections.Counter[tuple[str, str]] = field(default_factory=collections.Counter)
    writes: collections.Counter[tuple[str, str]] = field(default_factory=collections.Counter)
    on: bool = True
    conflicted: bool = False
    #: (seconds since start, method, path?query, fault category or "") of every request
    log: list[tuple[float, str, str, str]] = field(default_factory=list)
    t0: float = field(default_factory=time.monotonic)

    def draw(self, method: str, path: str, query: str = "") -> str:
        cat = self._draw(method, path)
        self.log.append((round(time.monotonic() - self.t0, 3), method, f"{path}?{query}" if query else path, cat))
        return cat

    def _draw(self, method: str, path: str) -> str:
        self.seen["requests"] += 1
        if method in ("POST", "PUT", "PATCH", "DELETE"):
            self.writes[(method, path)] += 1
        if not self.on or (method in ("POST", "DELETE") and EXEMPT.search(path)):
            return ""
        if method in ("PATCH", "PUT") and not self.conflicted:
            self.conflicted = True  # the first write is a 409, so that every run has one
            return "409"
        u = self.rnd.random()
        if u < self.p_timeout:
            return "timeout"
        u -= self.p_timeout
        if u < self.p_5xx_429:
            return self.rnd.choice(("500", "503", "429"))
        u -= self.p_5xx_429
        if method in ("PATCH", "PUT") and u < self.p_409:
            return "409"
        return ""

    def about(self, name: str) -> list[tuple[float, str, str, str]]:
        """The logged requests whose path names ``name``."""
        return [e for e in self.log if f"/{name}" in e[2]]


class ChaosFault(Fault):
    """One category of the dice; the first fault of the list draws, the others read the draw."""

    def __init__(self, dice: Dice, category: str, first: bool, **kw: Any) -> None:
        super().__init__(method=None, path=re.compile(""), times=10**9, **kw)
        self.dice, self.category, self.first = dice, category, first

    def matches(self, method: str, path: str, query: str) -> bool:
        if self.first:
            self.dice.category = self.dice.draw(method, path, query)
        if self.dice.category != self.category:
            return False
        self.dice.faulted[(method, path)] += int(self.status is not None)
        self.dice.seen[self.category] += 1
        return True


CONFLICT = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Conflict", "code": 409,
            "message": "Operation cannot be fulfilled: the object has been modified; please apply your "
                       "changes to the latest version and try again"}


def install_chaos(kube: KubeEnv, seed: int) -> Dice:
    dice = Dice(random.Random(seed))
    kube.emulator.faults[:0] = [
        ChaosFault(dice, "timeout", True, delay=TIMEOUT_DELAY),
        ChaosFault(dice, "500", False, status=500),
        ChaosFault(dice, "503", False, status=503),
        ChaosFault(dice, "429", False, status=429, retry_after=1),
        ChaosFault(dice, "409", False, status=409, body=CONFLICT),
    ]
    return dice


async def _drop_watches(kube: KubeEnv, every: float, stop: asyncio.Event) -> int:
    drops = 0
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every)
        await kube.close_watches()
        drops += 1
    return drops


async def _retrying(call: Any) -> Any:
    from kubernetes_asyncio.client.exceptions import ApiException

    for _ in range(50):
        try:
            return await call()
        except ApiException as e:
            if e.status == 404:
                return None
            if e.status not in (409, 429, 500, 503):
                raise
        await asyncio.sleep(0.05)
    raise AssertionError("the test's own request kept failing")


def _children(kube: KubeEnv, resource: str) -> list[dict[str, Any]]:
    import kmock

    group_version, plural = resource.rsplit("/", 1)
    group, _, version = group_version.rpartition("/")
    res = kmock.resource(group, version, plural)
    return [o.raw for (r, _, _), o in kube.emulator.objects.items() if r == res and not o.deleted]


def _versions(kube: KubeEnv, resource: str, name: str, ns: str = "default") -> int:
    """How many versions of the object the emulator committed (its create included)."""
    import kmock

    group_version, plural = resource.rsplit("/", 1)
    group, _, version = group_version.rpartition("/")
    obj = kube.emulator.objects[kmock.resource(group, version, plural), ns, name]
    return sum(1 for v in obj.history if v is not None)


def _owners(objs: list[dict[str, Any]]) -> collections.Counter[str]:
    return collections.Counter(ref["name"] for o in objs for ref in o["metadata"].get("ownerReferences") or ()
                               if ref.get("controller"))


INVALID = [  # (spec overrides or a long name, expected Ready reason)
    ({"backend": "tgi", "source": "HF://x/y"}, "UnknownBackend"),
    ("long", "InvalidSpec"),
]


async def run_chaos(kube: KubeEnv, n_valid: int, n_invalid: int, seed: int = 16,
                    ready_timeout: float = 120.0) -> dict[str, Any]:
    valid = [f"c{i:03d}" for i in range(n_valid)]
    invalid: dict[str, str] = {}
    bodies = [model(n) for n in valid]
    for i in range(n_invalid):
        spec, reason = INVALID[i % len(INVALID)]
        if spec == "long":
            name = f"bad{i:03d}-" + "x" * 64  # > 63: no Service or label can carry it
            bodies.append(model(name))
        else:
            name = f"bad{i:03d}"
            bodies.append(model(name, **spec))  # type: ignore[arg-type]
        invalid[name] = reason
    random.Random(seed).shuffle(bodies)

    dice = install_chaos(kube, seed)
    stop_drops = asyncio.Event()
    figures: dict[str, Any] = {"crs": len(bodies), "valid": n_valid, "invalid": n_invalid, "seed": seed}
    async with run_operator(kube, CHAOS_SETTINGS) as env:
        drops = asyncio.create_task(_drop_watches(kube, WATCH_DROP_S, stop_drops))
        t0 = time.monotonic()
        try:
            for b in bodies:
                await _retrying(lambda b=b: env.create(MODELS, b))

            def converged() -> bool:
                return (all(env.status(n).get("phase") == "Idle" and env.condition(n, "Ready").get("reason")
                            for n in valid)
                        and all(env.condition(n, "Ready").get("reason") == r for n, r in invalid.items()))

            try:
                await env.wait_for(converged, timeout=ready_timeout, what="every Model Idle or terminally invalid")
            except AssertionError:
                states = collections.Counter(
                    (env.status(n).get("phase"), env.condition(n, "Ready").get("reason")) for n in valid + list(invalid))
                stuck = [env.get(MODELS, n) for n in valid + list(invalid) if not env.status(n).get("phase")]
                stuck_meta = [(o or {}).get("metadata") for o in stuck[:3]]
                raise AssertionError(f"not converged in {ready_timeout}s: {dict(states)}; stuck {stuck_meta}; "
                                     f"faults {dict(dice.seen)}") from None
            figures["t_ready_s"] = round(time.monotonic() - t0, 2)
            dice.on = False  # count the steady state without faults
            await env.settle(quiet=1.0, timeout=60)
            figures["t_settled_s"] = round(time.monotonic() - t0, 2)
            deps, svcs = _children(kube, DEPLOYMENTS), _children(kube, SERVICES)
            figures["deployments"], figures["services"] = len(deps), len(svcs)
            dup = {n: c for n, c in (_owners(deps) + _owners(svcs)).items() if c != 2}
            figures["crs_without_exactly_one_child_each"] = len(dup) + len(set(valid) - set(_owners(deps)))
            # writes to each invalid Model that reached the store: the versions the emulator committed
            # after the create (a no-op patch, e.g. the retry of a timed-out patch that landed, commits
            # none, as on a real apiserver); beside it the unfaulted PATCH requests, no-ops included
            per_invalid, per_invalid_requests = [], []
            for name in invalid:
                path = re.compile(rf"/models/{re.escape(name)}(/status)?$")
                sent = sum(c for (m, p), c in dice.writes.items() if m != "POST" and path.search(p))
                hurt = sum(c for (m, p), c in dice.faulted.items() if m != "POST" and path.search(p))
                per_invalid_requests.append(sent - hurt)
                per_invalid.append(_versions(kube, MODELS, name) - 1)
                cond = env.condition(name, "Ready")
                assert cond.get("status") == "False" and cond.get("reason") == invalid[name], (name, cond)
            figures["invalid_writes_max"] = max(per_invalid, default=0)
            figures["invalid_write_requests_max"] = max(per_invalid_requests, default=0)
            figures["invalid_children"] = sum(1 for o in deps + svcs if o["metadata"]["name"] in invalid)

            dice.on = True  # delete everything under the same chaos
            t1 = time.monotonic()
            for b in bodies:
                await _retrying(lambda b=b: env.delete(MODELS, "default", b["metadata"]["name"]))
            await env.wait_for(lambda: not _children(kube, MODELS), timeout=ready_timeout, what="all Models gone")
            figures["t_deleted_s"] = round(time.monotonic() - t1, 2)
            dice.on = False
            await env.wait_for(lambda: not _children(kube, DEPLOYMENTS) and not _children(kube, SERVICES),
                               timeout=30, what="children gone")
            figures["after_delete"] = {"models": len(_children(kube, MODELS)),
                                       "deployments": len(_children(kube, DEPLOYMENTS)),
                                       "services": len(_children(kube, SERVICES))}
        finally:
            stop_drops.set()
            figures["watch_drops"] = await drops
            # every failed attempt of the operator's own requests (injected faults and real answers,
            # e.g. the 409 of a stale resourceVersion guard), and the Model reconciles
            figures["operator_api_errors"] = {f"{s.labels['verb']} {s.labels['code']}": int(s.value)
                                              for metric in env.op.metrics.api_errors.collect()
                                              for s in metric.samples if s.name.endswith("_total")}
            q = env.op.queues["model"]
            figures["model_reconciles"] = {"runs": q.reconciles, "failed": q.errors}
            _dump(dice, env, figures)
    figures["requests"] = dice.seen["requests"]
    figures["faults"] = {k: dice.seen[k] for k in ("500", "503", "429", "409", "timeout")}
    return figures


def _dump(dice: Dice, env: Any, figures: dict[str, Any]) -> None:
    """With ``F19_DUMP=<dir>``: the request log, the Models as they are and the figures, for debugging."""
    out = os.environ.get("F19_DUMP")
    if not out:
        return
    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    models = [o for o in _children(env.kube, MODELS)]
    path.joinpath("chaos.json").write_text(json.dumps({"figures": figures, "models": models, "log": dice.log},
                                                      default=str))


def check(fig: dict[str, Any]) -> None:
    print("F19", json.dumps(fig))
    assert fig["crs_without_exactly_one_child_each"] == 0, fig
    assert fig["deployments"] == fig["valid"] and fig["services"] == fig["valid"], fig
    assert fig["invalid_children"] == 0 and fig["invalid_writes_max"] <= 2, fig
    assert fig["after_delete"] == {"models": 0, "deployments": 0, "services": 0}, fig
    assert fig["faults"]["timeout"] > 0 and fig["faults"]["409"] > 0 and fig["watch_drops"] > 0, fig


@contextlib.contextmanager
def _debug_logs() -> Iterator[None]:
    """With ``F19_LOG=<dir>``: kopf's and the operator's DEBUG log in ``<dir>/operator.log``."""
    out = os.environ.get("F19_LOG")
    if not out:
        yield
        return
    Path(out).mkdir(parents=True, exist_ok=True)
    h = logging.FileHandler(Path(out) / "operator.log")
    h.setFormatter(logging.Formatter("%(relativeCreated)d %(name)s %(levelname)s %(message)s"))
    loggers = [logging.getLogger(n) for n in ("kopf", "flexinfer")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.DEBUG)
        lg.addHandler(h)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.removeHandler(h)
            lg.setLevel(level)
        h.close()


@pytest.mark.timeout(240)
async def test_chaos_6_crs(kube: KubeEnv) -> None:
    with _debug_logs():
        check(await run_chaos(kube, n_valid=5, n_invalid=1, ready_timeout=150))


def test_lagging_event_of_a_concurrent_write_keeps_the_overlay() -> None:
    """The redundant write of the 6-CR run: our status patch (answer rv 20) races kopf's annotation patch
    (rv 16); the watch delivers 16 after our answer. The store must keep serving our answer (else the
    next reconcile writes the status again), and let the index win once 20 or anything newer arrives."""
    from flexinfer.operator.api_resources import MODEL
    from flexinfer.operator.store import Store

    def body(rv: str, status: bool = False, note: bool = False) -> dict[str, Any]:
        md: dict[str, Any] = {"name": "m", "namespace": "default", "resourceVersion": rv}
        if note:
            md["annotations"] = {"flexinfer.ai/model-create": "{}"}
        return {"metadata": md, "status": {"phase": "Failed"} if status else {}}

    index: dict[tuple[str, str], list[dict[str, Any]]] = {("default", "m"): [body("2")]}
    st = Store()
    st.bind(MODEL, index)
    st.wrote(MODEL, body("2"), body("20", status=True))
    for late in ("16", "19"):  # kopf's patch, then one more older version, delivered late
        index[("default", "m")] = [body(late, note=True)]
        assert st.seen(MODEL, body(late, note=True)) is False
        got = st.get(MODEL, "default", "m")
        assert got is not None and got["status"] == {"phase": "Failed"}, late
    index[("default", "m")] = [body("21", status=True, note=True)]  # newer: the index wins
    got = st.get(MODEL, "default", "m")
    assert got is not None and got["metadata"]["resourceVersion"] == "21" and st.overlay_size == 0
    st.wrote(MODEL, body("21"), body("x30", status=True))  # not numbers: any other version drops it
    index[("default", "m")] = [body("22")]
    got = st.get(MODEL, "default", "m")
    assert got is not None and got["metadata"]["resourceVersion"] == "22" and st.overlay_size == 0


@pytest.mark.parametrize("name, spec, first_write", [
    ("lost-valid", {}, r"/models/lost-valid$"),  # the finalizer patch
    ("lost-invalid", {"backend": "tgi"}, r"/models/lost-invalid/status$"),  # the Failed status
])
async def test_failed_create_handler_is_retried_when_kopf_cannot_record_it(
        kube: KubeEnv, name: str, spec: dict[str, Any], first_write: str) -> None:
    """The fault sequence of the lost Model of the 6-CR run, driven exactly: the first reconcile (kopf's
    create handler, ``run_now``) fails after its retries, then kopf's patch of its progress annotation
    (the retry it schedules) gets a 409. kopf then forgets the object until its next event, and no
    event comes; the work queue must retry the failed reconcile itself."""
    failing = kube.inject("PATCH", first_write, status=503, times=1 + CHAOS_SETTINGS.api_retries)
    conflict = kube.inject("PATCH", rf"/models/{name}$", status=409, times=1, body=CONFLICT)

    def slow_debounce(op: Any) -> None:
        op.debounce_s = 5.0  # the watch event's own trigger stays queued behind kopf's handler (run_now)

    async with run_operator(kube, CHAOS_SETTINGS, setup=slow_debounce) as env:
        await env.create(MODELS, model(name, **spec))
        await env.wait_for(lambda: conflict.hits == 1, timeout=20, what="kopf's progress patch refused")
        assert failing.hits == failing.times
        want = "UnknownBackend" if spec else None
        await env.wait_for(lambda: env.condition(name, "Ready").get("reason") == want if want
                           else env.status(name).get("phase") == "Idle", timeout=4, what=f"{name} reconciled")


@pytest.mark.reliability
@pytest.mark.timeout(1500)
async def test_chaos_100_crs(kube: KubeEnv) -> None:
    with _debug_logs():
        check(await run_chaos(kube, n_valid=90, n_invalid=10, ready_timeout=900))
