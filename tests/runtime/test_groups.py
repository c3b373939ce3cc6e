"""Groups (exclusive, persistent), preload on start, the loading state and ``backend_bin``, through a
real ``flexinfer serve`` process with the real ``openai`` client.

The models are stub engines (``tests.stub_engine``): these tests need several models running at
once, a cold start whose length the test sets (``--start-delay``) and a model that fails to start,
which the one real engine (SmolLM2) cannot give; SmolLM2 answers in ``test_groups_llamacpp.py``.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from openai.types.chat import ChatCompletionChunk
from prometheus_client.parser import text_string_to_metric_families

from flexinfer.runtime.localconfig import check_local_config, llama_server_command, load_local_config
from tests.runtime.test_local import alive, wait_for
from tests.runtime.test_reload import Serve, stub
from tests.runtime.test_reload import serve as reload_serve

MSG = [{"role": "user", "content": "hi"}]


@contextmanager
def serve(tmp: Path, text: str, **envs: str) -> Iterator[Serve]:
    """test_reload's ``flexinfer serve``, with the watcher off and the environment ``envs`` added."""
    with reload_serve(tmp, text, "--watch-interval", "0", drain=10, **envs) as s:
        yield s


def pids(s: Serve) -> dict[str, int | None]:
    return {name: row["pid"] for name, row in s.running().items()}


def test_exclusive_group_unloads_the_others_but_not_a_persistent_one(tmp_path: Path) -> None:
    text = ("groups:\n  ex: {exclusive: true}\n  keep: {persistent: true}\nmodels:"
            + stub("a", more="\n    group: ex") + stub("p", more="\n    group: keep")
            + stub("p2", more="\n    group: keep\n    priority: 500") + stub("x", more="\n    group: other")
            + stub("u") + "\n")
    with serve(tmp_path, text) as s:
        before = {m: s.chat(m) for m in ("p", "x", "u")}
        assert all(alive(pid) for pid in before.values())
        s.chat("a")  # exclusive: x (another group) and u (no group) go, p (persistent) stays
        now = pids(s)
        assert now["x"] is None and now["u"] is None and not alive(before["x"]) and not alive(before["u"])
        assert now["p"] == before["p"] and alive(before["p"])
        assert s.running()["a"]["state"] == "ready"
        x2 = s.chat("x")  # a start in a plain group leaves the exclusive group running
        assert pids(s)["a"] is not None and x2 != before["x"]
        s.chat("p2")  # a persistent group still runs one member at a time (p2 has the higher priority)
        assert pids(s)["p"] is None and not alive(before["p"])
        metrics = s.text("/metrics")
        assert 'flexinfer_local_swaps_total{group="ex",model="a"} 1.0' in metrics
        assert 'flexinfer_local_swaps_total{group="keep",model="p2"} 1.0' in metrics


def test_config_errors_of_groups_and_preload(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("groups:\n  gpu1: {exclusive: true}\n  ex: {exclusiv: true}\nhooks:\n  on_startup:\n"
                   "    preload: [a, smol]\nmodels:" + stub("a", more="\n    group: gpu0") + "\n")
    problems = check_local_config(str(cfg))
    assert any(":2: groups.gpu1: no model has group: gpu1; did you mean 'gpu0'?" in p for p in problems), problems
    assert any("groups.ex.exclusiv: unknown key 'exclusiv'; did you mean 'exclusive'?" in p for p in problems)
    assert any("hooks.on_startup.preload[1]: unknown model 'smol'" in p for p in problems), problems


def test_preload_starts_models_without_blocking_the_endpoint_and_survives_a_failure(tmp_path: Path) -> None:
    bad = f"[{sys.executable!r}, -c, 'import sys; sys.exit(3)', '${{PORT}}']"
    text = ("hooks:\n  on_startup:\n    preload: [broken, slow]\nmodels:\n  - name: broken\n    cmd: " + bad
            + stub("slow", "--start-delay", "1.5") + "\n")
    with serve(tmp_path, text) as s:
        # the endpoint answers while the preload is still under way (slow takes 1.5 s to listen)
        assert s.running()["slow"]["state"] != "ready" and {"broken", "slow"} <= s.models()
        assert wait_for(lambda: s.running()["slow"]["state"] == "ready", 30), (s.running(), s.log.read_text())
        rows = s.running()
        assert rows["broken"]["state"] == "failed" and "exited with code 3" in rows["broken"]["last_error"]
        assert "preload of broken failed" in s.log.read_text()
        pid = rows["slow"]["pid"]
        assert s.chat("slow") == pid  # started by the preload, not by this request


def _family(metrics: str, suffix: str, model: str) -> float:
    for fam in text_string_to_metric_families(metrics):
        for sample in fam.samples:
            if sample.name == f"flexinfer_proxy_{suffix}" and sample.labels.get("model") == model:
                return float(sample.value)
    raise AssertionError(f"no flexinfer_proxy_{suffix}{{model={model!r}}}")


def test_loading_state_is_reasoning_content_the_client_parses_and_the_tap_does_not_count(tmp_path: Path) -> None:
    text = ("models:" + stub("cold", "--start-delay", "1.5", more="\n    send_loading_state: true")
            + stub("quiet", "--start-delay", "1.5") + "\n")
    with serve(tmp_path, text, PROXY_QUEUE_KEEPALIVE_AFTER="0.1", PROXY_QUEUE_KEEPALIVE_INTERVAL="0.3") as s:
        c = s.client()
        reasoning: list[str] = []
        content: list[str] = []
        for chunk in c.chat.completions.create(model="cold", messages=MSG, stream=True,  # type: ignore[arg-type]
                                               extra_headers={"x-stub-chunks": "4"}):
            assert isinstance(chunk, ChatCompletionChunk) and chunk.object == "chat.completion.chunk"
            delta = chunk.choices[0].delta if chunk.choices else None
            if delta is None:
                continue
            extra = (delta.model_extra or {}).get("reasoning_content")
            if extra:
                assert not content, "a loading line after the model's own tokens"
                reasoning.append(extra)
            if delta.content:
                content.append(delta.content)
        assert len(reasoning) >= 2 and reasoning[0].startswith("Loading cold: "), reasoning
        assert reasoning[-1].startswith("cold is ready after "), reasoning
        assert len(content) == 4
        metrics = s.text("/metrics")
        # the tap saw the model's 4 content events only: 1 TTFT, 3 gaps, 4 tokens (the stub's usage)
        assert _family(metrics, "time_to_first_token_seconds_count", "cold") == 1
        assert _family(metrics, "inter_token_latency_seconds_count", "cold") == 3
        assert _family(metrics, "completion_tokens_total", "cold") == 4
        # off by default: the same wait is SSE comments only, the client sees the model's chunks alone
        with c.chat.completions.with_streaming_response.create(model="quiet", messages=MSG, stream=True,  # type: ignore[arg-type]
                                                         extra_headers={"x-stub-chunks": "4"}) as raw:
            body = raw.read().decode()
        assert ": waiting for model quiet" in body and "reasoning_content" not in body


def test_loading_state_global_switch_and_per_model_off(tmp_path: Path) -> None:
    text = "models:" + stub("lit", "--start-delay", "1") + stub("dark", "--start-delay", "1",
                                                              more="\n    send_loading_state: false") + "\n"
    with serve(tmp_path, text, PROXY_SEND_LOADING_STATE="true", PROXY_QUEUE_KEEPALIVE_AFTER="0.1",
               PROXY_QUEUE_KEEPALIVE_INTERVAL="0.3") as s:
        bodies = {}
        for m in ("lit", "dark"):
            with s.client().chat.completions.with_streaming_response.create(model=m, messages=MSG, stream=True) as raw:  # type: ignore[arg-type]
                bodies[m] = raw.read().decode()
        assert '"reasoning_content":"Loading lit: ' in bodies["lit"]
        assert "reasoning_content" not in bodies["dark"] and ": waiting for model dark" in bodies["dark"]


def test_llama_server_command_maps_the_python_flags() -> None:
    argv = llama_server_command("/opt/llama-server", "smol", ["--n_ctx", "2048", "--n_gpu_layers", "99",
                                                             "--chat_format", "chatml", "--flash-attn", "on"])
    assert argv == ("/opt/llama-server", "-m", "${MODEL}", "--alias", "smol", "--host", "127.0.0.1", "--port",
                    "${PORT}", "--metrics", "--threads", "${THREADS}", "--ctx-size", "2048", "--n-gpu-layers",
                    "99", "--flash-attn", "on")
    assert "--threads" not in llama_server_command("b", "s", ["-t", "2"])[:-2]


def test_llama_server_binary_from_env_or_backend_bin_through_serve(tmp_path: Path) -> None:
    """A stand-in ``llama-server`` (records its argv, then runs the stub engine on the port it was
    given, answering /health as llama-server does) started by ``backend: llamacpp``: once through
    ``LLAMA_SERVER``, once through ``backend_bin:``; the Python server stays the default."""
    fake = tmp_path / "llama-server"
    fake.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                    "argv = sys.argv[1:]\n"
                    "open(os.environ['ARGV_LOG'], 'a').write(json.dumps(argv) + '\\n')\n"
                    f"os.execv({sys.executable!r}, [{sys.executable!r}, '-m', 'tests.stub_engine', '--port', "
                    "argv[argv.index('--port') + 1]])\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    text = f"""
    models:
      - name: viaenv
        backend: llamacpp
        model: {gguf}
        args: [--n_ctx, "512"]
      - name: viabin
        backend: llamacpp
        model: {gguf}
        backend_bin: {fake}
    """
    argv_log = tmp_path / "argv.jsonl"
    with serve(tmp_path, text, LLAMA_SERVER=str(fake), ARGV_LOG=str(argv_log)) as s:
        for m in ("viaenv", "viabin"):
            s.chat(m)
    seen = [json.loads(line) for line in argv_log.read_text().splitlines()]
    assert [a[a.index("--alias") + 1] for a in seen] == ["viaenv", "viabin"]
    for a in seen:
        assert a[a.index("-m") + 1] == str(gguf) and "--metrics" in a
    assert seen[0][seen[0].index("--ctx-size") + 1] == "512" and "--n_ctx" not in seen[0]
    cfg = tmp_path / "plain.yaml"
    cfg.write_text("\n".join(ln for ln in textwrap.dedent(text).splitlines() if "backend_bin" not in ln))
    saved = os.environ.pop("LLAMA_SERVER", None)
    try:  # without LLAMA_SERVER and backend_bin: the Python server, as before
        specs = load_local_config(str(cfg))
    finally:
        if saved is not None:
            os.environ["LLAMA_SERVER"] = saved
    assert all(sp.command[1:3] == ("-m", "llama_cpp.server") and sp.health_path == "/v1/models" for sp in specs)


def test_policies_and_loading_state_reach_the_specs(tmp_path: Path) -> None:
    cfg = tmp_path / "ok.yaml"
    cfg.write_text("defaults: {send_loading_state: true}\ngroups:\n  ex: {exclusive: true}\n  keep: {persistent: true}\n"
                   "models:" + stub("a", more="\n    group: ex") + stub("p", more="\n    group: keep")
                   + stub("q", more="\n    send_loading_state: false") + stub("r", more="\n    group: plain") + "\n")
    specs = {sp.name: sp for sp in load_local_config(str(cfg))}
    assert (specs["a"].exclusive, specs["a"].persistent) == (True, False)
    assert (specs["p"].exclusive, specs["p"].persistent) == (False, True)
    assert (specs["r"].exclusive, specs["r"].persistent) == (False, False)
    assert [specs[n].send_loading_state for n in "apqr"] == [True, True, False, True]
