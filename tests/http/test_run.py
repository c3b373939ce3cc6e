"""``run()`` in a real process: SO_REUSEPORT workers share one port, SIGTERM drains and exits 0."""

from __future__ import annotations

import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import asyncio, os, sys
from flexinfer.http.server import run
from flexinfer.settings import HTTPSettings

class H:
    def on_headers(self, req):
        return None

    async def handle(self, req, resp):
        if req.path == "/slow":
            print("slow", os.getpid(), flush=True)
            await asyncio.sleep(0.6)
        resp.send(200, [], str(os.getpid()).encode())

async def on_start(server):
    print("ready", os.getpid(), server.port, flush=True)

async def on_stop(server):
    print("stopped", os.getpid(), flush=True)

sys.exit(run(H, HTTPSettings(drain_timeout=3.0), host="127.0.0.1", port=int(sys.argv[1]),
             workers=int(sys.argv[2]), on_start=on_start, on_stop=on_stop))
"""


def _get(port: int, path: str = "/", timeout: float = 10.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(b"GET %s HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n" % path.encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return data


def _read_lines(proc: subprocess.Popen[bytes], n: int, timeout: float) -> list[list[str]]:
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    lines: list[list[str]] = []
    end = time.monotonic() + timeout
    while len(lines) < n and time.monotonic() < end:
        if sel.select(max(0.0, end - time.monotonic())):
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line.decode().split())
    return lines


@pytest.mark.parametrize("workers", [1, 2])
def test_run_workers_reuseport_and_sigterm_drain(workers: int) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, "0", str(workers)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        ready = _read_lines(proc, workers, timeout=20.0)
        if len(ready) != workers:
            proc.kill()
            _, err = proc.communicate(timeout=5)
            pytest.fail(f"workers did not start: {ready} {err.decode(errors='replace')[-2000:]}")
        ports = {int(r[2]) for r in ready}
        assert len(ports) == 1  # one port shared by every worker
        port = ports.pop()
        worker_pids = {r[1] for r in ready}
        seen = {_get(port).rsplit(b"\r\n\r\n", 1)[1].decode() for _ in range(40)}
        assert seen <= worker_pids
        if workers == 2:
            assert seen == worker_pids  # the kernel spread the connections over both listeners

        slow: list[bytes] = []
        t = threading.Thread(target=lambda: slow.append(_get(port, "/slow")))
        t.start()
        started = _read_lines(proc, 1, timeout=10.0)  # the slow request is in flight
        assert started and started[0][0] == "slow", started
        proc.send_signal(signal.SIGTERM)
        t.join(10.0)
        assert slow and slow[0].startswith(b"HTTP/1.1 200 OK")  # in-flight response finished
        assert proc.wait(10.0) == 0
        stopped = _read_lines(proc, workers, timeout=2.0)
        assert len(stopped) == workers and all(line[0] == "stopped" for line in stopped)
        with pytest.raises(OSError):
            _get(port, timeout=1.0)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
