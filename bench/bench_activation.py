"""Readiness-to-upstream latency of held requests (scale-from-zero activation).

N requests (1, 10 and 50 by default, from N client connections) wait for a model that is not ready; the runtime
then publishes the model as ready, and a recording engine in another process (so its work does not
share the proxy's loop) notes when each request's first bytes reached it. CLOCK_MONOTONIC is one
clock for every process of the machine, so the two times compare directly. Reported: p50/p99/max of (arrival at the engine - readiness signal), over several
rounds. Target: p99 <= 20 ms. Writes ``bench/results/activation.json``.
Usage: ``python bench/bench_activation.py [--requests 50] [--rounds 5]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from flexinfer.http.server import HTTPServer  # noqa: E402
from flexinfer.proxy.pipeline import ProxyHandler  # noqa: E402
from flexinfer.runtime.base import Endpoint, ModelView, StaticInventoryBase  # noqa: E402
from flexinfer.settings import ProxySettings  # noqa: E402

RECORDER = r"""
import asyncio, sys, time
RESP = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
class P(asyncio.Protocol):
    def connection_made(self, t): self.t, self.seen = t, False
    def data_received(self, d):
        if not self.seen:
            self.seen = True
            sys.stdout.write(f"{time.monotonic()}\n"); sys.stdout.flush()
        if d.endswith(b"}") or b"\r\n\r\n{" in d and d.rstrip().endswith(b"}"):
            self.t.write(RESP)
async def main():
    srv = await asyncio.get_running_loop().create_server(P, "127.0.0.1", 0)
    sys.stdout.write(f"port {srv.sockets[0].getsockname()[1]}\n"); sys.stdout.flush()
    await asyncio.Event().wait()
asyncio.run(main())
"""


class ManualRuntime(StaticInventoryBase):
    """An inventory + scaler whose model becomes ready when the benchmark says so."""

    async def wake(self, model: ModelView) -> None:
        return None

    def record_demand(self, model: ModelView) -> None:
        return None


async def one_round(n: int) -> list[float]:
    rec = await asyncio.create_subprocess_exec(sys.executable, "-c", RECORDER, stdout=asyncio.subprocess.PIPE)
    assert rec.stdout is not None
    port = int((await rec.stdout.readline()).split()[1])
    runtime = ManualRuntime([ModelView("m", ready=False)])
    settings = ProxySettings()
    handler = ProxyHandler(runtime, settings, scaler=runtime)
    server = HTTPServer(handler, settings.http, host="127.0.0.1", port=0)
    await server.start()
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * 1000}]}).encode()
    raw = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\n"
           b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))

    async def client() -> int:
        r, w = await asyncio.open_connection("127.0.0.1", server.port)
        w.write(raw)
        data = await r.read()
        w.close()
        return int(data.split(b" ", 2)[1])

    tasks = [asyncio.create_task(client()) for _ in range(n)]
    q = None
    while q is None or len(q.waiters) < n:  # every request is held
        await asyncio.sleep(0.01)
        q = handler.activator.queues.get("m") if handler.activator else None
    t0 = time.monotonic()
    runtime.update(ModelView("m", ready=True, endpoints=(Endpoint("127.0.0.1", port),)))
    codes = await asyncio.gather(*tasks)
    assert codes == [200] * n, codes
    arrivals = [float(await rec.stdout.readline()) - t0 for _ in range(n)]
    rec.kill()
    await rec.wait()
    await server.drain_and_close(1)
    await handler.pools.close_all()
    return sorted(arrivals)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, nargs="+", default=[1, 10, 50])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    out: dict[str, object] = {"rounds": args.rounds, "target_p99_ms": 20.0, "held_requests": {}}
    for n in args.requests:
        samples: list[float] = []
        for _ in range(args.rounds):
            samples += asyncio.run(one_round(n))
        ms = sorted(s * 1000 for s in samples)
        out["held_requests"][str(n)] = {  # type: ignore[index]
            "p50_ms": round(statistics.median(ms), 3), "p99_ms": round(ms[min(len(ms) - 1, int(len(ms) * 0.99))], 3),
            "max_ms": round(ms[-1], 3)}
    (ROOT / "bench" / "results").mkdir(parents=True, exist_ok=True)
    (ROOT / "bench" / "results" / "activation.json").write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
