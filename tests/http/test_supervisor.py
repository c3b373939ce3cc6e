"""The supervisor of ``run(..., workers=N)`` in real processes: a killed worker or sidecar is restarted in
its slot while the other worker keeps answering, ``on_worker_exit`` runs in the parent, the slot is
visible to the worker, restarts back off, and SIGTERM still drains in order and exits 0."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.http.test_run import _Lines

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import asyncio, os, signal, sys, time
from flexinfer.http.server import Sidecar, current_worker, run
from flexinfer.settings import HTTPSettings

workers, mode, drain = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])

def say(*words):
    os.write(1, (" ".join(map(str, words)) + "\n").encode())

class H:
    def on_headers(self, req):
        return None

    async def handle(self, req, resp):
        if req.path == "/crash":
            os._exit(3)
        slot = current_worker()
        resp.send(200, [], f"{os.getpid()} {slot.index if slot else '-'}".encode())

async def on_start(server):
    s = current_worker()
    if s is None:
        say("ready", os.getpid(), server.port, "None")
        return
    if mode == "flaky" and s.index == 1 and s.restarts < 2:
        os._exit(4)  # the slot fails twice at start, then comes up
    say("ready", os.getpid(), server.port, s.index, s.count, s.restarts)

async def on_stop(server):
    say("stopped", os.getpid())

def on_worker_exit(index):
    say("exit", index, os.getpid(), current_worker())

def sidecar():
    say("sidecar", os.getpid(), current_worker())
    if mode == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        while True:
            time.sleep(1)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    signal.sigwait({signal.SIGTERM})
    say("sidecar-stopped", os.getpid())
    return 0

sidecars = [] if mode == "plain" else [Sidecar("side", sidecar)]
sys.exit(run(H, HTTPSettings(drain_timeout=drain), host="127.0.0.1", port=0, workers=workers,
             on_start=on_start, on_stop=on_stop, on_worker_exit=on_worker_exit, sidecars=sidecars))
"""


def _get(port: int, path: str = "/", timeout: float = 5.0) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(b"GET %s HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n" % path.encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK"), head
    return body.decode()


class Proc:
    def __init__(self, workers: int, mode: str, drain: float = 3.0) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.p = subprocess.Popen([sys.executable, "-c", SCRIPT, str(workers), mode, str(drain)], cwd=ROOT,
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        self.out = _Lines(self.p)
        self.seen: list[list[str]] = []
        self.unclaimed: list[list[str]] = []  # lines read while waiting for others, in order

    def expect(self, n: int, first: str, timeout: float = 20.0) -> list[list[str]]:
        """The next ``n`` lines starting with ``first``, the earliest first: lines read while an
        earlier call waited for other ones count too (processes print in any order)."""
        got = [line for line in self.unclaimed if line[0] == first][:n]
        for line in got:
            self.unclaimed.remove(line)
        end = time.monotonic() + timeout
        while len(got) < n:
            left = end - time.monotonic()
            lines = self.out.read(1, timeout=max(0.0, left))
            if not lines:
                self.fail(f"no {n} {first!r} lines: {got}")
            self.seen.append(lines[0])
            if lines[0][0] == first:
                got.append(lines[0])
            else:
                self.unclaimed.append(lines[0])
        return got

    def fail(self, what: str) -> None:
        self.p.kill()
        _, err = self.p.communicate(timeout=5)
        pytest.fail(f"{what}; seen {self.seen}; stderr: {err.decode(errors='replace')[-3000:]}")

    def stderr(self) -> str:
        assert self.p.stderr is not None
        return self.p.stderr.read().decode(errors="replace")

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.p.pid, signal.SIGKILL)  # the children too, whatever happened
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait()
        for pipe in (self.p.stdout, self.p.stderr):
            if pipe is not None:
                pipe.close()


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    made: list[Proc] = []
    yield made
    for p in made:
        p.close()


def _ready(lines: list[list[str]]) -> dict[int, tuple[int, int, int]]:
    """index -> (pid, count, restarts)"""
    return {int(r[3]): (int(r[1]), int(r[4]), int(r[5])) for r in lines}


def test_killed_worker_is_restarted_in_its_slot_while_the_other_keeps_answering(procs: list[Proc]) -> None:
    proc = Proc(2, "sidecar")
    procs.append(proc)
    (side,) = proc.expect(1, "sidecar")
    assert side[2] == "None"  # a sidecar is no worker slot
    ready = proc.expect(2, "ready")
    assert len({r[2] for r in ready}) == 1  # one port
    port = int(ready[0][2])
    slots = _ready(ready)
    assert set(slots) == {0, 1} and all(count == 2 and restarts == 0 for _, count, restarts in slots.values())

    # a client loop, a fresh connection per request, all along
    results: list[tuple[float, str | None]] = []
    stop = threading.Event()

    def client() -> None:
        while not stop.is_set():
            t = time.monotonic()
            try:
                results.append((t, _get(port)))
            except (OSError, AssertionError) as exc:
                results.append((t, None if not isinstance(exc, AssertionError) else f"bad {exc}"))

    thread = threading.Thread(target=client)
    thread.start()
    try:
        victim, (old_pid, _, _) = 1, slots[1]
        os.kill(old_pid, signal.SIGKILL)
        (exited,) = proc.expect(1, "exit")
        reaped_at = time.monotonic()  # the parent reaped it: its listener is closed
        assert exited[1] == str(victim) and exited[2] == str(proc.p.pid) and exited[3] == "None"  # in the parent
        (again,) = proc.expect(1, "ready")
        new = _ready([again])
        assert set(new) == {victim} and new[victim][0] != old_pid and new[victim][1:] == (2, 1)
        # a few more rounds: the new worker answers too
        end = time.monotonic() + 10
        while not any(r and r.split()[0] == str(new[victim][0]) for _, r in results) and time.monotonic() < end:
            time.sleep(0.02)
    finally:
        stop.set()
        thread.join(10)
    after = [r for t, r in results if t >= reaped_at]
    assert after and all(r is not None and not r.startswith("bad") for r in after), after[-20:]
    answered = {r.split()[0] for r in after if r}
    assert str(new[victim][0]) in answered and str(slots[0][0]) in answered

    # a worker that exits on its own is restarted too
    with pytest.raises((OSError, AssertionError)):  # whichever worker got it is gone before answering
        _get(port, "/crash")
    (crashed,) = proc.expect(1, "exit")
    (back,) = proc.expect(1, "ready")
    assert back[3] == crashed[1] and int(back[5]) >= 1
    current = {0: slots[0][0], victim: new[victim][0], int(back[3]): int(back[1])}

    # the sidecar is restarted after SIGKILL
    os.kill(int(side[1]), signal.SIGKILL)
    (side2,) = proc.expect(1, "sidecar")
    assert side2[1] != side[1]

    proc.p.send_signal(signal.SIGTERM)
    assert proc.p.wait(15) == 0
    stopped = proc.expect(2, "stopped", timeout=2)
    proc.expect(1, "sidecar-stopped", timeout=2)
    tail = [line[0] for line in proc.seen]
    assert tail.index("sidecar-stopped") > max(i for i, w in enumerate(tail) if w == "stopped")  # after the workers
    assert {int(s[1]) for s in stopped} == set(current.values())  # the workers alive at the end drained
    err = proc.stderr()
    assert f"worker 1 (pid {old_pid}) was killed by signal SIGKILL; restarting in 0.1s" in err
    assert "exited with status 3; restarting in" in err
    assert f"sidecar side (pid {side[1]}) was killed by signal SIGKILL" in err
    assert "Traceback" not in err


def test_restarts_back_off_and_a_single_worker_with_a_sidecar_is_supervised(procs: list[Proc]) -> None:
    proc = Proc(2, "flaky")
    procs.append(proc)
    ready = proc.expect(2, "ready")
    slots = _ready(ready)
    assert slots[0][2] == 0 and slots[1][2] == 2  # slot 1 failed twice at start, then came up
    exits = [line for line in proc.seen if line[0] == "exit"]
    assert [e[1] for e in exits] == ["1", "1"]
    proc.p.send_signal(signal.SIGTERM)
    assert proc.p.wait(15) == 0
    err = proc.stderr()
    assert "worker 1 (pid" in err and "exited with status 4; restarting in 0.1s (restart 1)" in err
    assert "exited with status 4; restarting in 0.2s (restart 2)" in err  # doubled

    single = Proc(1, "sidecar")
    procs.append(single)
    single.expect(1, "sidecar")
    # the worker and the sidecar start side by side: the worker's line may come first
    (r,) = [line for line in single.seen if line[0] == "ready"] or single.expect(1, "ready")
    assert r[3:] == ["0", "1", "0"]  # the supervisor runs with one worker when there is a sidecar
    single.p.send_signal(signal.SIGINT)
    assert single.p.wait(15) == 0
    single.expect(1, "sidecar-stopped", timeout=2)

    plain = Proc(1, "plain")
    procs.append(plain)
    (r,) = plain.expect(1, "ready")
    assert r[3] == "None"  # single-process mode: no slot
    plain.p.send_signal(signal.SIGTERM)
    assert plain.p.wait(15) == 0


def test_a_child_that_ignores_sigterm_is_killed_after_the_drain_grace(procs: list[Proc]) -> None:
    proc = Proc(1, "stubborn", drain=0.2)
    procs.append(proc)
    proc.expect(1, "sidecar")
    proc.expect(1, "ready")
    proc.p.send_signal(signal.SIGTERM)
    proc.expect(1, "stopped")
    assert proc.p.wait(20) == 1  # the sidecar's last exit was SIGKILL
    err = proc.stderr()
    assert "sidecar side (pid" in err and "did not exit 5.2s after its signal: SIGKILL" in err


def test_children_stop_when_the_supervisor_is_killed(procs: list[Proc]) -> None:
    import psutil

    proc = Proc(2, "sidecar")
    procs.append(proc)
    (side,) = proc.expect(1, "sidecar")
    ready = proc.expect(2, "ready")
    children = [int(side[1])] + [int(r[1]) for r in ready]
    proc.p.kill()
    assert proc.p.wait(10) == -signal.SIGKILL
    stopped = proc.expect(2, "stopped")  # the workers drained on the SIGTERM their parent's death sent
    assert {int(s[1]) for s in stopped} == set(children[1:])
    if not any(line[0] == "sidecar-stopped" for line in proc.seen):  # no order without the parent
        proc.expect(1, "sidecar-stopped")

    def gone(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    end = time.monotonic() + 10
    while not all(map(gone, children)) and time.monotonic() < end:
        time.sleep(0.02)
    assert all(map(gone, children))
