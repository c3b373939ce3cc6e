"""``GET /debug/endpoints``: every model's endpoints as the router sees them, in one JSON document.

Owns: the document: per model its routing, scheduler (and why a bad one was refused), its latest
``scored`` pick with the reason; per endpoint its open requests (machine- or replica-wide, as the
router counts them), the last engine scrape (figures, age, error, whether it is fresh enough to be
used), the passive ejection state and the plugin scores of the model's latest decision.
Must not: change anything it reads, or be on the request path (it is a control endpoint).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import orjson

from flexinfer.proxy.enginemetrics import EngineState
from flexinfer.proxy.routing import Router
from flexinfer.runtime.base import ModelView


def _engine(es: EngineState | None, fresh: bool, now: float) -> dict[str, Any] | None:
    if es is None:
        return None
    return {"engine": es.engine, "waiting": es.waiting, "running": es.running, "kv_usage": es.kv_usage,
            "ttft_s": es.ttft_s, "tpot_s": es.tpot_s, "adapters": sorted(es.adapters),
            "age_s": round(now - es.at, 3), "error": es.error, "fresh": fresh}


def document(models: Iterable[ModelView], router: Router, clock: Callable[[], float] = time.monotonic) -> bytes:
    now = clock()
    state, last, ejector, load = router.engine_state, router.engine_last, router.ejector, router.load
    out: list[dict[str, Any]] = []
    for v in models:
        d = router.decision(v.name)
        scores = d.scores if d is not None else {}
        totals = d.total if d is not None else {}
        eps: list[dict[str, Any]] = []
        for e in v.endpoints:
            es = last(e.key) if last is not None else (state(e.key) if state is not None else None)
            fresh = state is not None and state(e.key) is not None
            eps.append({"key": e.key, "in_flight": load.get(e.key, 0), "engine": _engine(es, fresh, now),
                        "ejection": ejector.state(e.key) if ejector is not None else None,
                        "last_scores": scores.get(e.key), "last_total": totals.get(e.key)})
        out.append({"name": v.name, "ready": v.ready, "routing": v.routing, "scheduler": v.scheduler,
                    "scheduler_error": router.scheduler_errors.get(v.name),
                    "last_pick": None if d is None else {"key": d.key, "reason": d.reason},
                    "endpoints": eps})
    return orjson.dumps({"models": out})
