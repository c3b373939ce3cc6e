"""The benchmark gate's paced SSE probe: time to the first ``data:`` event (TTFE) under load.

Owns: a few keep-alive connections to the proxy, each sending one streaming chat request every
``--interval`` seconds (paced: the next request leaves at the scheduled time, or at once when the
previous stream ended late), reading each response to its terminating chunk, and recording the time
from the request's send to the first ``data:`` byte. Prints one JSON object on stdout:
``{"ttfe_ms": [...], "completed": N, "errors": N, "stalled": N}``.
Must not: import flexinfer, or count a request whose answer was not a 200 stream as a sample.
Run: ``python bench/ttfe_probe.py --port N --duration S [--connections 3] [--interval 0.02]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time


def request_bytes(port: int, model: str, chars: int) -> bytes:
    body = json.dumps({"model": model, "stream": True,
                       "messages": [{"role": "user", "content": "x" * chars}]}).encode()
    return (b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:%d\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%s" % (port, len(body), body))


async def _conn(port: int, req: bytes, start: float, stop: float, interval: float, stall: float,
                out: list[float], counts: dict[str, int]) -> None:
    """One paced connection; a response that stalls ``stall`` seconds is counted in ``stalled`` (and,
    when its first event had not come, recorded as a TTFE of ``stall``), then the connection is
    replaced."""
    due = start
    while time.perf_counter() < stop:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while True:
                now = time.perf_counter()
                if due > now:
                    await asyncio.sleep(due - now)
                if time.perf_counter() >= stop:
                    return
                t0 = time.perf_counter()
                writer.write(req)
                due = max(due + interval, t0)
                buf = b""
                first: float | None = None
                while not buf.endswith(b"\r\n0\r\n\r\n"):
                    try:
                        data = await asyncio.wait_for(reader.read(65536), stall)
                    except TimeoutError:
                        counts["stalled"] += 1
                        if first is None:
                            out.append(stall * 1000)
                        break
                    if not data:
                        counts["errors"] += 1  # closed mid-response
                        break
                    if first is None and b"data:" in (buf[-8:] + data):
                        first = time.perf_counter()
                    buf = (buf + data)[-64:] if first is not None else buf + data
                    if first is None and len(buf) > 12 and not buf.startswith(b"HTTP/1.1 200"):
                        counts["errors"] += 1  # not a stream: no sample
                        break
                else:
                    if first is None:
                        counts["errors"] += 1
                    else:
                        out.append((first - t0) * 1000)
                        counts["completed"] += 1
                    continue
                break  # a stall, a close or an error: a new connection
        finally:
            writer.close()
            try:
                await writer.wait_closed()
            except OSError:
                pass


async def run(port: int, duration: float, connections: int, interval: float, delay: float,
              model: str, chars: int, stall: float = 2.0) -> dict[str, object]:
    req = request_bytes(port, model, chars)
    out: list[float] = []
    counts = {"completed": 0, "errors": 0, "stalled": 0}
    start = time.perf_counter() + delay
    stop = start + duration
    # the connections' schedules are spread over one interval so they do not arrive together
    await asyncio.gather(*(_conn(port, req, start + i * interval / connections, stop, interval, stall, out, counts)
                           for i in range(connections)))
    return {"ttfe_ms": out, **counts}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--duration", type=float, required=True)
    ap.add_argument("--connections", type=int, default=3)
    ap.add_argument("--interval", type=float, default=0.02)
    ap.add_argument("--delay", type=float, default=0.0, help="seconds before the first request")
    ap.add_argument("--model", default="gate")
    ap.add_argument("--chars", type=int, default=1000)
    ap.add_argument("--stall", type=float, default=2.0, help="seconds of silence that count as a stall")
    a = ap.parse_args()
    import uvloop

    res = uvloop.run(run(a.port, a.duration, a.connections, a.interval, a.delay, a.model, a.chars, a.stall))
    print(json.dumps(res))


if __name__ == "__main__":
    main()
