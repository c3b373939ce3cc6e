"""``run()`` in a real process: SO_REUSEPORT workers share one port, SIGTERM drains and exits 0."""

from __future__ import annotations

import os
import select
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

def say(*words):
    # One write(2) per line: with PYTHONUNBUFFERED set, print() issues a write per word and two
    # workers sharing the pipe interleave them ("ready ready 12 34 ...").
    os.write(1, (" ".join(map(str, words)) + "\n").encode())

class H:
    def on_headers(self, req):
        return None

    async def handle(self, req, resp):
        if req.path == "/slow":
            say("slow", os.getpid())
            await asyncio.sleep(0.6)
        resp.send(200, [], str(os.getpid()).encode())

async def on_start(server):
    say("ready", os.getpid(), server.port)

async def on_stop(server):
    say("stopped", os.getpid())

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


class _Lines:
    """Whole lines from a child's stdout, read from the raw fd with a deadline.

    ``readline()`` on the buffered pipe after ``select()`` can strand a second line in Python's
    buffer (select then waits for bytes that already arrived); splitting here cannot.
    """

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        self.fd = proc.stdout.fileno()
        self.pending = b""
        self.eof = False

    def read(self, n: int, timeout: float) -> list[list[str]]:
        lines: list[list[str]] = []
        end = time.monotonic() + timeout
        while len(lines) < n:
            if b"\n" in self.pending:
                line, self.pending = self.pending.split(b"\n", 1)
                lines.append(line.decode().split())
                continue
            left = end - time.monotonic()
            if self.eof or left <= 0:
                break
            readable, _, _ = select.select([self.fd], [], [], left)
            if readable:
                chunk = os.read(self.fd, 65536)
                self.pending += chunk
                self.eof = not chunk
        return lines


@pytest.mark.parametrize("workers", [1, 2])
def test_run_workers_reuseport_and_sigterm_drain(workers: int) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, "0", str(workers)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out = _Lines(proc)
    try:
        ready = out.read(workers, timeout=20.0)
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
        started = out.read(1, timeout=10.0)  # the slow request is in flight
        assert started and started[0][0] == "slow", started
        proc.send_signal(signal.SIGTERM)
        t.join(10.0)
        assert slow and slow[0].startswith(b"HTTP/1.1 200 OK")  # in-flight response finished
        assert proc.wait(10.0) == 0
        stopped = out.read(workers, timeout=2.0)
        assert len(stopped) == workers and all(line[0] == "stopped" for line in stopped)
        with pytest.raises(OSError):
            _get(port, timeout=1.0)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()


@pytest.mark.parametrize("workers", [1, 2])
def test_a_taken_port_is_one_error_line(workers: int) -> None:
    """Another process listens on the port: exit status 2 at once with one line that says so (no
    traceback; with workers, the supervisor finds out before it forks instead of restarting
    workers that cannot bind, forever)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run([sys.executable, "-c", SCRIPT, str(port), str(workers)], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out
    assert f"cannot listen on 127.0.0.1:{port}: the address is already in use" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and "ready" not in out.stdout and "restarting" not in out.stderr
