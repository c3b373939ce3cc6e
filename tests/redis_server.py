"""A real ``redis-server`` for tests: a subprocess on a free port, without persistence.

``RedisServer`` starts ``redis-server --port <free> --save '' --appendonly no`` (bound to 127.0.0.1,
its log in a temporary directory), and can be stopped (SIGTERM), killed (SIGKILL) and started again
on the same port, with empty state (as a Redis without persistence comes back). ``make test`` installs
redis-server (``make redis-server``: apt).
"""

from __future__ import annotations

import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

REDIS_SERVER = shutil.which("redis-server")


def _ephemeral_low() -> int:
    """The first port the kernel hands out for bind(0) and outgoing connections (32768 by default)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def restartable_port() -> int:
    """A free port below the kernel's ephemeral range, for a server that is killed and started again
    on the same port. A port from bind(0) (``free_port``) is in that range: while the server is down,
    a test of another xdist worker could get the same number for its own bind(0) or as the local port
    of an outgoing connection, and the restart would fail with "Address already in use" (seen once
    in ``test_redis_killed_and_restarted_mid_run``). No such socket takes a port below the range."""
    low = max(1025, min(_ephemeral_low(), 65536) - 12000)
    for _ in range(200):
        port = random.randrange(low, low + 11000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port in {low}..{low + 11000}")


class RedisServer:
    """One redis-server process; ``url`` stays the same across restarts."""

    def __init__(self, port: int | None = None) -> None:
        if REDIS_SERVER is None:
            raise RuntimeError("redis-server is not installed (make redis-server)")
        self.port = port or restartable_port()
        self._dir = tempfile.TemporaryDirectory(prefix="flexinfer-redis-")
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def log(self) -> str:
        path = Path(self._dir.name) / "redis.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def start(self, timeout: float = 10.0) -> RedisServer:
        assert self.proc is None, "already running"
        assert REDIS_SERVER is not None
        self.proc = subprocess.Popen(
            [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", self._dir.name, "--logfile", "redis.log", "--daemonize", "no",
             "--enable-debug-command", "local"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.starts += 1
        end = time.monotonic() + timeout
        while not self.ping():
            if self.proc.poll() is not None or time.monotonic() > end:
                self._reap(signal.SIGKILL)
                raise RuntimeError(f"redis-server did not start on port {self.port}: {self.log[-2000:]}")
            time.sleep(0.02)
        return self

    def ping(self) -> bool:
        """True when the server answers PING (a raw RESP round trip, no client library)."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def command(self, *args: str, timeout: float = 5.0) -> bytes:
        """Send one command (RESP array) and return the raw first reply bytes."""
        wire = f"*{len(args)}\r\n".encode() + b"".join(f"${len(a.encode())}\r\n{a}\r\n".encode() for a in args)
        with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as s:
            s.sendall(wire)
            return s.recv(65536)

    def stop(self) -> None:
        """SIGTERM and wait (a clean shutdown)."""
        self._reap(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL and wait (a crash: connections are reset, nothing is saved)."""
        self._reap(signal.SIGKILL)

    def restart(self) -> RedisServer:
        self.kill()
        return self.start()

    def _reap(self, sig: signal.Signals) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)

    def close(self) -> None:
        self.kill()
        self._dir.cleanup()

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
