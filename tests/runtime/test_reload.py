"""Hot reload through a real ``flexinfer serve`` process: the file watcher, SIGHUP, a refused file.

The models are stub engines (``tests.stub_engine``, one process each): what is checked here is which
processes a reload keeps, restarts, stops and adds, which needs several models running at once and
an in-flight stream whose length the test controls; the real llama.cpp server is in
``test_reload_llamacpp.py``.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletionChunk

from flexinfer.runtime.localconfig import check_local_config
from flexinfer.runtime.reload import file_digest
from tests.harness import free_port
from tests.proxy._procs import env, samples, stop
from tests.runtime.test_local import alive, wait_for

ROOT = Path(__file__).resolve().parents[2]
MSG = [{"role": "user", "content": "hi"}]
NAMES = ("keep", "change", "gone", "meta")


class Serve:
    """A running ``flexinfer serve -c FILE`` process and the calls the tests make to it."""

    def __init__(self, cfg: Path, port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.cfg, self.port, self.proc, self.log = cfg, port, proc, log
        self.url = f"http://127.0.0.1:{port}"

        self._client: openai.OpenAI | None = None

    def client(self) -> openai.OpenAI:
        if self._client is None:
            self._client = openai.OpenAI(base_url=self.url + "/v1", api_key="k", max_retries=0, timeout=120)
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=10) as r:
            body = r.read()
        return json.loads(body)

    def text(self, path: str) -> str:
        with urllib.request.urlopen(self.url + path, timeout=10) as r:
            return str(r.read().decode())

    def running(self) -> dict[str, dict[str, Any]]:
        return {row["model"]: row for row in self.get("/running")["running"]}

    def models(self) -> set[str]:
        return {m["id"] for m in self.get("/v1/models")["data"]}

    def reloads(self) -> dict[str, int]:
        return dict(self.get("/config")["reloads"])

    def write(self, text: str, *, rename: bool = False) -> None:
        """Replace the config: in place, or as editors do (a new file renamed over the old one)."""
        text = textwrap.dedent(text)
        if rename:
            tmp = self.cfg.with_suffix(".tmp")
            tmp.write_text(text)
            os.replace(tmp, self.cfg)
        else:
            self.cfg.write_text(text)

    def wait_reloads(self, result: str, n: int, timeout: float = 20) -> None:
        assert wait_for(lambda: self.reloads()[result] >= n, timeout), (self.get("/config"), self.log.read_text())
        assert self.reloads()[result] == n, self.get("/config")

    def chat(self, model: str, row: str | None = None) -> int:
        """One answered request to ``model``; the pid of the process that answered it (``row``: the
        model's name when ``model`` is an alias)."""
        out = self.client().chat.completions.create(model=model, messages=MSG)  # type: ignore[arg-type]
        assert out.choices[0].message.content == "hello from stub"
        return int(self.running()[row or model]["pid"])


@contextmanager
def serve(tmp: Path, text: str, *extra: str, drain: float = 20, **envs: str) -> Iterator[Serve]:
    """``flexinfer serve`` on ``text`` with the flags ``extra`` and the environment ``envs`` added;
    ``drain``: its drain timeout (the bound of a drain on reload, and of the shutdown)."""
    cfg = tmp / "local.yaml"
    cfg.write_text(textwrap.dedent(text))
    port = free_port()
    log = tmp / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "flexinfer.cli", "--log-level", "info", "serve", "-c",
                                 str(cfg), "--port", str(port), *extra], cwd=ROOT, stdout=out,
                                stderr=subprocess.STDOUT, env=env(PROXY_GRACEFUL_SHUTDOWN_TIMEOUT=f"{drain:g}", **envs))
    try:
        assert wait_for(lambda: proc.poll() is not None or _listens(port), 30), "serve did not listen"
        assert proc.poll() is None, log.read_text()
        s = Serve(cfg, port, proc, log)
        try:
            yield s
        finally:
            s.close()
    finally:
        stop(proc)
        assert proc.returncode == 0, log.read_text()


def _listens(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        return True
    except OSError:
        return False


def stub(name: str, *extra: str, more: str = "") -> str:
    parts = [sys.executable, "-m", "tests.stub_engine", "--port", "${PORT}", *extra]
    return f"""
  - name: {name}
    command: [{", ".join(repr(p) for p in parts)}]{more}"""


def v1() -> str:
    return "models:" + stub("keep") + stub("change") + stub("gone") + stub("meta", more="\n    priority: 100") + "\n"


def v2() -> str:  # keep: same; change: new args (restart); gone: removed; meta: new group/alias (in place); new
    return ("models:" + stub("keep") + stub("change", "--start-delay", "0.01")
            + stub("meta", more="\n    priority: 500\n    group: g\n    aliases: [meta-alias]") + stub("new") + "\n")


BAD = """
models:
  - name: keep
    command: [python, -m, x, --port, "${PORT}"]
    idle_tll: 5
  - name: other
    cmd: "x --port ${PORT}"
    context_window: big
"""


def test_reload_restarts_only_what_changed_and_refuses_a_bad_file(tmp_path: Path) -> None:
    with serve(tmp_path, v1(), "--watch-interval", "0.1") as s:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:  # the four stub engines start at once
            pids = dict(zip(NAMES, pool.map(s.chat, NAMES), strict=True))
        assert s.reloads() == {"success": 0, "failure": 0}
        assert s.get("/config")["sha256"] == file_digest(str(s.cfg))
        # a slow stream to "change" is in flight when its definition changes
        stream = s.client().chat.completions.create(
            model="change", messages=MSG, stream=True,  # type: ignore[arg-type]
            extra_headers={"x-stub-chunks": "60", "x-stub-interval": "0.05"})
        it: Iterator[ChatCompletionChunk] = iter(stream)  # type: ignore[arg-type]
        first = [next(it) for _ in range(3)]

        s.write(v2(), rename=True)  # the editor way: a new inode under the same name
        s.wait_reloads("success", 1)
        assert s.models() == {"keep", "change", "meta", "new"}
        rows = s.running()
        assert rows["keep"]["pid"] == pids["keep"] and rows["meta"]["pid"] == pids["meta"]
        assert rows["meta"]["group"] == "g" and rows["meta"]["priority"] == 500
        assert rows["change"]["state"] == "stopped" and rows["new"]["state"] == "stopped"
        assert alive(pids["change"]), "the old process of a changed model must drain its open stream first"
        assert wait_for(lambda: not alive(pids["gone"]), 10), "a removed model's process was not stopped"
        with pytest.raises(openai.NotFoundError):
            s.client().chat.completions.create(model="gone", messages=MSG)  # type: ignore[arg-type]
        assert s.chat("meta-alias", row="meta") == pids["meta"]  # the new alias, the same process
        assert s.chat("keep") == pids["keep"]

        rest = list(it)  # the stream spanning the reload ends normally
        tokens = [c.choices[0].delta.content for c in first + rest if c.choices and c.choices[0].delta.content]
        assert tokens == [f"tok{i} " for i in range(60)]
        assert rest[-1].choices[0].finish_reason == "stop"
        assert wait_for(lambda: not alive(pids["change"]), 10), "drained, the old process must stop"
        new_pid = s.chat("change")  # started on demand with the new definition
        assert new_pid != pids["change"]
        starts = [ln for ln in s.text("/logs/change").splitlines() if ln.startswith("[flexinfer] starting")]
        assert len(starts) == 2 and "--start-delay" not in starts[0] and "--start-delay 0.01" in starts[1]
        assert s.chat("new")

        s.write(BAD)
        s.wait_reloads("failure", 1)
        status = s.get("/config")
        assert status["last_reload"]["result"] == "failure"
        assert status["last_reload"]["errors"] == check_local_config(str(s.cfg))  # the lines --check prints
        assert f"{s.cfg}:5: models[0].idle_tll: unknown key 'idle_tll'; did you mean 'idle_ttl'?" \
            in status["last_reload"]["errors"]
        assert status["sha256"] != file_digest(str(s.cfg))  # still the v2 file
        assert wait_for(lambda: f"{s.cfg}:5: models[0].idle_tll" in s.log.read_text(), 5)  # logged
        assert s.models() == {"keep", "change", "meta", "new"}
        assert s.chat("keep") == pids["keep"] and s.chat("change") == new_pid
        metrics = samples(s.text("/metrics"))
        assert metrics[("flexinfer_serve_config_reloads_total", (("result", "failure"),))] == 1
        assert metrics[("flexinfer_serve_config_reloads_total", (("result", "success"),))] == 1
        assert metrics[("flexinfer_serve_config_last_reload_success", ())] == 0
        assert metrics[("flexinfer_serve_config_info", (("path", str(s.cfg)), ("sha256", status["sha256"])))] == 1

        s.write(v2())  # fixed again (the content in use): applied, nothing restarted
        s.wait_reloads("success", 2)
        assert s.get("/config")["last_reload"]["changes"] == {"unchanged": ["keep", "change", "meta", "new"]}
        assert samples(s.text("/metrics"))[("flexinfer_serve_config_last_reload_success", ())] == 1
        assert s.chat("keep") == pids["keep"] and s.chat("change") == new_pid

        s.cfg.unlink()  # gone for a while (a deploy tool between unlink and rename): waited out
        assert wait_for(lambda: "cannot be read; still serving" in s.log.read_text(), 10)
        assert s.models() == {"keep", "change", "meta", "new"} and s.reloads() == {"success": 2, "failure": 1}
        s.write("models:" + stub("keep") + "\n")
        s.wait_reloads("success", 3)
        assert s.models() == {"keep"} and s.chat("keep") == pids["keep"]


def test_sighup_reloads_with_the_watcher_off_and_group_changes_apply(tmp_path: Path) -> None:
    with serve(tmp_path, "models:" + stub("a") + stub("b") + "\n", "--watch-interval", "0") as s:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            pid_a, pid_b = pool.map(s.chat, ("a", "b"))
        assert s.get("/config")["watch_interval"] == 0
        grouped = "\n    group: g"
        s.write("models:" + stub("a", more=grouped + "\n    priority: 500") + stub("b", more=grouped) + stub("c") + "\n")
        s.proc.send_signal(signal.SIGHUP)
        s.wait_reloads("success", 1)
        last = s.get("/config")["last_reload"]
        assert last["reason"] == "SIGHUP" and last["changes"] == {"updated": ["a", "b"], "added": ["c"]}
        assert s.models() == {"a", "b", "c"}
        # a and b now share group g: one runs at a time, the leader (priority 500) keeps its process
        assert wait_for(lambda: not alive(pid_b), 10), "the group's second running member was not stopped"
        assert wait_for(lambda: s.running()["b"]["state"] == "stopped", 10), s.running()["b"]  # then its state
        assert s.running()["a"]["pid"] == pid_a
        assert s.chat("c") and s.chat("a") == pid_a
