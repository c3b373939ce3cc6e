"""Real processes for the shared-state tests: stub engines and ``flexinfer proxy`` (several workers or
replicas), and a small asyncio load client that counts answers by status."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.harness import free_port, wait_port

ROOT = Path(__file__).resolve().parents[2]
CHAT = b'{"model":"%s","messages":[{"role":"user","content":"hi"}]}'


def env(**extra: str) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("PROXY_")}
    return {**e, "PYTHONPATH": str(ROOT), **extra}


def stop(*procs: subprocess.Popen[bytes]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


@contextmanager
def stub_engines(n: int) -> Iterator[list[int]]:
    ports = [free_port() for _ in range(n)]
    procs = [subprocess.Popen([sys.executable, "-m", "tests.stub_engine", "--port", str(p)], cwd=ROOT, env=env(),
                              stdout=subprocess.DEVNULL) for p in ports]
    try:
        for p in ports:
            wait_port(p)
        yield ports
    finally:
        stop(*procs)


def inventory(tmp: Path, engines: list[int], *, pin: bool = False) -> Path:
    eps = ", ".join(f"http://127.0.0.1:{p}" for p in engines)
    text = f"models:\n  - name: m\n    routing: least-loaded\n    endpoints: [{eps}]\n"
    if pin:  # the first engine alone, under another name: load on it that "m" must see
        text += f"  - name: pin\n    endpoints: [http://127.0.0.1:{engines[0]}]\n"
    path = tmp / "inv.yaml"
    path.write_text(text)
    return path


@contextmanager
def proxy(inv: Path, *, workers: int = 1, **settings: str) -> Iterator[int]:
    port = free_port()
    p = subprocess.Popen([sys.executable, "-m", "flexinfer.cli", "--log-level", "warning", "proxy", "-c", str(inv),
                          "--port", str(port), "--workers", str(workers)], cwd=ROOT, env=env(**settings))
    try:
        wait_port(port, timeout=30)
        yield port
    finally:
        stop(p)
        assert p.returncode == 0, f"proxy exited {p.returncode}"


async def request(port: int, method: str, path: str, body: bytes = b"",
                  headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    """One request on a fresh connection (so SO_REUSEPORT picks a worker each time)."""
    r, w = await asyncio.open_connection("127.0.0.1", port)
    try:
        head = f"{method} {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Length: {len(body)}\r\n"
        if body:
            head += "Content-Type: application/json\r\n"
        for k, v in (headers or {}).items():
            head += f"{k}: {v}\r\n"
        w.write(head.encode() + b"\r\n" + body)
        data = await r.read()
    finally:
        w.close()
        await w.wait_closed()
    top, _, rest = data.partition(b"\r\n\r\n")
    lines = top.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    hdrs = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    return status, hdrs, rest


class Load:
    """``concurrency`` keep-alive-free clients sending chat requests to ``ports`` for ``seconds``."""

    def __init__(self, ports: list[int], seconds: float, concurrency: int = 16, model: str = "m") -> None:
        self.ports, self.seconds, self.concurrency, self.model = ports, seconds, concurrency, model
        self.codes: Counter[int | str] = Counter()
        self.first = self.last = self.end = 0.0

    async def _client(self, i: int, end: float) -> None:
        port = self.ports[i % len(self.ports)]
        body = CHAT % self.model.encode()
        while time.monotonic() < end:
            t = time.monotonic()
            if not self.first:
                self.first = t
            try:
                status, _, _ = await request(port, "POST", "/v1/chat/completions", body)
                self.codes[status] += 1
                if status == 200:
                    self.last = max(self.last, t)
            except OSError as exc:
                self.codes[type(exc).__name__] += 1

    @property
    def window(self) -> float:
        """Seconds from the first request sent to the end of the load (the bucket starts full)."""
        return self.end - self.first

    async def run(self) -> Load:
        end = self.end = time.monotonic() + self.seconds
        await asyncio.gather(*(self._client(i, end) for i in range(self.concurrency)))
        return self


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out
