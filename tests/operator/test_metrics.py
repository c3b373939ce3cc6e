"""The operator's /metrics, scraped over a real socket from the real operator (kopf + our registry)
running against the Kubernetes API emulator: reconcile counts move with real reconciles, an injected
API error shows in ``api_errors_total``, and every operator series the chart's dashboard reads is
exported (no dead operator panel)."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from dataclasses import replace

import pytest

from flexinfer.operator.controller import WorkQueue
from flexinfer.operator.metrics import OperatorMetrics
from flexinfer.operator.results import Result
from tests.dashboard import dashboard_uses, missing, parse_scrape, value
from tests.harness import free_port
from tests.kube_emulator import KubeEnv
from tests.operator.harness import MODELS, TEST_SETTINGS, model, run_operator


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as r:
        assert r.status == 200 and r.headers["content-type"].startswith("text/plain")
        return str(r.read().decode())


async def test_reconciles_and_api_errors_after_real_reconciles(kube: KubeEnv) -> None:
    port = free_port()
    settings = replace(TEST_SETTINGS, metrics_port=port, metrics_host="127.0.0.1")
    # api_retries=2: three failed attempts of one POST make that reconcile fail (then it is retried)
    err = kube.inject("POST", r"/services$", status=500, times=3)
    url = f"http://127.0.0.1:{port}/metrics"
    async with run_operator(kube, settings) as env:
        await env.create(MODELS, model("m0"))
        await env.wait_for(lambda: env.status("m0").get("phase") == "Idle", timeout=20, what="m0 Idle")
        await env.settle()
        first = await asyncio.to_thread(_get, url)
        assert err.hits == 3
        assert value(first, "flexinfer_operator_api_errors_total", verb="create", code="500") == 3
        assert value(first, "flexinfer_operator_reconciles_total", kind="model", result="error") >= 1
        ok_or_requeue = value(first, "flexinfer_operator_reconciles_total", kind="model") - \
            value(first, "flexinfer_operator_reconciles_total", kind="model", result="error")
        assert ok_or_requeue >= 1
        assert value(first, "flexinfer_operator_reconcile_duration_seconds_count", kind="model") == \
            value(first, "flexinfer_operator_reconciles_total", kind="model")
        samples = parse_scrape(first)
        kinds = {s["kind"] for s in samples["flexinfer_operator_queue_depth"]}
        assert kinds == {"model", "model-group", "lora", "modeldeployment", "modelcache", "gpugroup", "cluster",
                         "federatedmodel", "modelcatalog"}

        # more objects, more reconciles: the counter moves (and never a new API error)
        before = value(first, "flexinfer_operator_reconciles_total", kind="model")
        await env.create(MODELS, model("m1"))
        await env.wait_for(lambda: env.status("m1").get("phase") == "Idle", timeout=20, what="m1 Idle")
        second = await asyncio.to_thread(_get, url)
        assert value(second, "flexinfer_operator_reconciles_total", kind="model") > before
        assert value(second, "flexinfer_operator_api_errors_total") == 3

        # the dashboard's operator panels all read something this operator exports
        wanted = [(w, u) for w, u in dashboard_uses() if u.name.startswith("flexinfer_operator_")]
        assert len({u.name for _, u in wanted}) == 4
        problems = missing(parse_scrape(second), wanted)
        assert not problems, "\n".join(problems)

        with pytest.raises(urllib.error.HTTPError) as e:
            await asyncio.to_thread(_get, f"http://127.0.0.1:{port}/other")
        assert e.value.code == 404
        e.value.close()
    # the port is closed with the operator
    with pytest.raises(OSError):
        await asyncio.to_thread(_get, url)


async def test_queue_counts_results_and_depth() -> None:
    """The four results of one queue, and depth counting only keys due now."""
    m = OperatorMetrics()
    answers: dict[str, Result | Exception] = {"ok": Result(), "requeue": Result(requeue_after=60.0),
                                              "permanent": Result(permanent="Bad: spec"), "error": RuntimeError("x")}

    async def fn(key: str) -> Result:
        a = answers[key]
        if isinstance(a, Exception):
            raise a
        return a

    q = WorkQueue("model", fn, metrics=m, retry_base_s=60.0)
    m.bind_queues(lambda: {"model": q})
    q.trigger("later", 3600)
    for key in ("ok", "requeue", "permanent"):
        await q.run_now(key)
    with pytest.raises(RuntimeError):
        await q.run_now("error")
    text = m.render().decode()
    for result in ("ok", "requeue", "permanent", "error"):
        assert value(text, "flexinfer_operator_reconciles_total", kind="model", result=result) == 1, result
    assert value(text, "flexinfer_operator_reconcile_duration_seconds_count", kind="model") == 4
    # "requeue" is queued 60 s ahead and "later" an hour ahead: nothing is due now
    assert value(text, "flexinfer_operator_queue_depth", kind="model") == 0
    q.trigger("now")
    assert value(m.render().decode(), "flexinfer_operator_queue_depth", kind="model") == 1
