"""No dead proxy panel: ``flexinfer serve`` (the proxy and the local runtime, stub engines as the model
processes) gets real traffic through the real ``openai`` client (a cold start that queues, JSON and
streaming answers with usage, an upstream reset, an unknown model, a swap in a shared GPU group), then
its ``/metrics`` is scraped over a socket and every proxy series the chart's dashboard reads must be
there, with every label the panel matches or groups by. The operator's panels are checked the same way
in ``tests/operator/test_metrics.py``."""

from __future__ import annotations

import openai
import pytest

from flexinfer.sharing import Windows
from tests.dashboard import dashboard_uses, missing, scrape
from tests.runtime.conftest import LocalStack
from tests.runtime.test_local import GROUP as LOCAL_GROUP

MSG = [{"role": "user", "content": "hi"}]
GROUP = LOCAL_GROUP.replace("PRIO", "100")  # a and b share gpu0 at the same priority


def test_every_proxy_panel_reads_an_exported_series(local: LocalStack) -> None:
    local.start(GROUP, windows=Windows(demand=0.3, recent=0.6, min_cooldown=0.3))
    c = openai.OpenAI(base_url=local.base_url, api_key="k", max_retries=0)
    try:
        usage = {"x-stub-usage": "5,7"}
        # a cold start: the request queues until the model process is healthy (queue wait, activation)
        out = c.chat.completions.create(model="a", messages=MSG, extra_headers=usage)  # type: ignore[arg-type]
        assert out.usage is not None and out.usage.completion_tokens == 7
        stream = c.chat.completions.create(model="a", messages=MSG, stream=True,  # type: ignore[arg-type]
                                           extra_headers={**usage, "x-stub-chunks": "4",
                                                          "x-stub-interval": "0.01"})
        assert sum(1 for ch in stream if ch.choices and ch.choices[0].delta.content) == 4  # type: ignore[misc,union-attr]
        with pytest.raises(openai.APIStatusError) as e:  # the replica resets the connection
            c.chat.completions.create(model="a", messages=MSG,  # type: ignore[arg-type]
                                      extra_headers={"x-stub-mode": "reset"})
        assert e.value.status_code >= 500
        with pytest.raises(openai.NotFoundError):
            c.chat.completions.create(model="nope", messages=MSG)  # type: ignore[arg-type]
        # b shares a's GPU group: once a is out of demand, a is swapped out for b
        c.chat.completions.create(model="b", messages=MSG)  # type: ignore[arg-type]
    finally:
        c.close()
    samples = scrape(local.url + "/metrics")
    wanted = [(w, u) for w, u in dashboard_uses() if not u.name.startswith("flexinfer_operator_")]
    assert wanted
    problems = missing(samples, wanted)
    assert not problems, "\n".join(problems)
    assert {s["group"] for s in samples["flexinfer_local_swaps_total"]} == {"gpu0"}
