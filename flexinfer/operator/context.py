"""The operator's runtime context: settings, read model, writer, event recorder, queues, clock.

Owns: the one object every reconcile shell receives (no module-level state, so tests can run several
operators, each with its own registry), the names of the work queues, and the injectable clock and
HTTP function (LoRA adapter calls).

Must not: hold reconcile logic.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Hashable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from flexinfer.operator.config import OperatorSettings
from flexinfer.operator.controller import EventRecorder, WorkQueue, Writer
from flexinfer.operator.kubeapi import KubeClient
from flexinfer.operator.metrics import OperatorMetrics
from flexinfer.operator.results import Event
from flexinfer.operator.store import Store

MODEL_Q = "model"
GROUP_Q = "model-group"
LORA_Q = "lora"
MD_Q = "modeldeployment"
CACHE_Q = "modelcache"
GPUGROUP_Q = "gpugroup"

#: (url, JSON body, timeout seconds) -> (HTTP status, response text); status 0 for connection errors
HttpPost = Callable[[str, Mapping[str, Any], float], Awaitable[tuple[int, str]]]


async def aiohttp_post(url: str, body: Mapping[str, Any], timeout: float) -> tuple[int, str]:
    """The default ``HttpPost``: one JSON POST with aiohttp."""
    import aiohttp

    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as s, \
                s.post(url, data=json.dumps(body), headers={"Content-Type": "application/json"}) as r:
            return r.status, (await r.text())[:2000]
    except (TimeoutError, aiohttp.ClientError, OSError) as e:
        return 0, f"{type(e).__name__}: {e}"


def utcnow() -> datetime:
    return datetime.now(tz=UTC)


@dataclass
class Operator:
    """Everything a reconcile needs; built once per operator run (``app.build_registry``)."""

    settings: OperatorSettings = field(default_factory=OperatorSettings)
    store: Store = field(default_factory=Store)
    clock: Callable[[], datetime] = utcnow
    http_post: HttpPost = aiohttp_post
    kube: KubeClient | None = None
    writer: Writer | None = None
    events: EventRecorder = field(default_factory=lambda: EventRecorder(None))
    queues: dict[str, WorkQueue] = field(default_factory=dict)
    #: parsed Model specs: (namespace, name) -> ((uid, generation), raw spec, ModelSpec or SpecError)
    spec_cache: dict[tuple[str, str], tuple[Any, Any, Any]] = field(default_factory=dict)
    #: last seen metadata.generation per Model (alias peers are looked at only when it moves)
    model_generations: dict[tuple[str, str], Any] = field(default_factory=dict)
    #: seconds an event-triggered reconcile waits for more events of the same object
    debounce_s: float = 0.05
    #: LoRA adapters loaded per replica: (namespace, adapter object name) -> {"ip:port", ...}
    lora_loaded: dict[tuple[str, str], set[str]] = field(default_factory=dict)
    #: the Prometheus metrics (served on ``settings.metrics_port`` by ``metrics_server``, an HTTPServer)
    metrics: OperatorMetrics = field(default_factory=OperatorMetrics)
    metrics_server: Any = None
    #: API clients of the member clusters (``members.MemberClients``; made by ``app.start``)
    members: Any = None

    def trigger(self, queue: str, key: Hashable, delay: float | None = None) -> None:
        """Reconcile ``key`` soon: after ``delay``, by default a short debounce that folds a burst of
        watch events (create, finalizer, status, children) into one reconcile."""
        q = self.queues.get(queue)
        if q is not None:
            q.trigger(key, self.debounce_s if delay is None else delay)

    def record(self, obj: Mapping[str, Any], event: Event) -> None:
        self.events.record(obj, event)

    @property
    def w(self) -> Writer:
        if self.writer is None:
            raise RuntimeError("the operator is not started (no API client)")
        return self.writer

    @property
    def idle(self) -> bool:
        """No queue has work running or due (tests wait for this)."""
        return not any(q.busy for q in self.queues.values())
