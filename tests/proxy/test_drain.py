"""Graceful drain: SIGTERM turns /readyz to 503, refuses new work, lets open streams finish, exits 0."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import openai

from tests.harness import free_port, wait_port

ROOT = Path(__file__).resolve().parents[2]


def test_sigterm_drains_streams_and_exits_zero(tmp_path: Path) -> None:
    engine_port, proxy_port = free_port(), free_port()
    inv = tmp_path / "inv.yaml"
    inv.write_text(f"models:\n  - name: m\n    endpoints: [http://127.0.0.1:{engine_port}]\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PROXY_GRACEFUL_SHUTDOWN_TIMEOUT": "10"}
    engine = subprocess.Popen([sys.executable, "-m", "tests.stub_engine", "--port", str(engine_port)],
                              cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    proxy = subprocess.Popen([sys.executable, "-m", "flexinfer.cli", "proxy", "-c", str(inv), "--port",
                              str(proxy_port)], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE)
    try:
        wait_port(engine_port)
        wait_port(proxy_port)
        c = openai.OpenAI(base_url=f"http://127.0.0.1:{proxy_port}/v1", api_key="k", max_retries=0)
        idle = socket.create_connection(("127.0.0.1", proxy_port))  # a keep-alive connection, idle
        stream = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], stream=True,
                                           extra_headers={"x-stub-chunks": "20", "x-stub-interval": "0.1"})
        it = iter(stream)
        first = next(it)
        proxy.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        # new work on an existing connection is refused with 503, readiness included
        idle.sendall(b"GET /readyz HTTP/1.1\r\nHost: a\r\n\r\n")
        head = idle.recv(4096)
        assert head.startswith(b"HTTP/1.1 503") or head == b"", head[:100]
        idle.close()
        # new connections are refused
        try:
            socket.create_connection(("127.0.0.1", proxy_port), timeout=0.5).close()
            refused = False
        except OSError:
            refused = True
        assert refused
        # the open stream runs to its end
        rest = list(it)
        assert first.choices[0].delta.role == "assistant"
        assert len(rest) == 21 and rest[-1].choices[0].finish_reason == "stop"
        assert proxy.wait(15) == 0
        err = proxy.stderr.read().decode() if proxy.stderr else ""
        assert "Traceback" not in err, err
    finally:
        for p in (proxy, engine):
            if p.poll() is None:
                p.kill()
                p.wait()
        if proxy.stderr is not None:
            proxy.stderr.close()
