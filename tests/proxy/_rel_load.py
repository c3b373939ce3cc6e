"""Load generators for rows F4, F6 and F7, each run as its OWN process (so the latency a test
reports is the proxy's, not the test process's): ``python -m tests.proxy._rel_load MODE ...``.
Prints one JSON object on stdout.

Owns: ``legit PORT RATE SECONDS [keepalive]`` (open-loop chat requests at RATE/s: latency of each,
successes, failures); ``slow PORT N INTERVAL SECONDS`` (slowloris: N connections that send a
request line, then one header line every INTERVAL s and never finish; per connection the seconds
from connect to the server's close, or null if still open at the end); ``sse PORT IDLE STREAMS
INTERVAL EVENTS`` (IDLE keep-alive connections after one ``/healthz`` each, held open, then
STREAMS concurrent SSE chat streams; inter-event gaps minus INTERVAL, errors; the test samples
the proxy's RSS while it waits between the phases, on a line ``idle-ready`` on stderr).
Must not: talk to anything but 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

CHAT = b'{"model":"m","messages":[{"role":"user","content":"hi"}]}'
#: the slow connections' source address (see slow())
SLOW_FROM = "127.0.0.2"
SSE = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}'


def _req(body: bytes, close: bool, extra: bytes = b"") -> bytes:
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            + (b"Connection: close\r\n" if close else b"") + extra
            + b"Content-Length: %d\r\n\r\n" % len(body) + body)


async def _read_response(r: asyncio.StreamReader) -> int:
    head = await r.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    n = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            n = int(line.split(b":", 1)[1])
    await r.readexactly(n)
    return status


async def legit(port: int, rate: float, seconds: float, keepalive: bool = False) -> dict[str, object]:
    lat: list[float] = []
    fail: dict[str, int] = {}
    pool: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    at: list[float] = []

    async def one() -> None:
        t = time.monotonic()
        try:
            conn = pool.pop() if keepalive and pool else await asyncio.open_connection("127.0.0.1", port)
            r, w = conn
            w.write(_req(CHAT, not keepalive))
            status = await asyncio.wait_for(_read_response(r), 30)
            if status == 200:
                lat.append(time.monotonic() - t)
                at.append(t - t0)
            else:
                fail[str(status)] = fail.get(str(status), 0) + 1
            if keepalive:
                pool.append(conn)
            else:
                w.close()
        except (TimeoutError, OSError, asyncio.IncompleteReadError) as exc:
            fail[type(exc).__name__] = fail.get(type(exc).__name__, 0) + 1

    tasks = []
    t0 = time.monotonic()
    n = int(rate * seconds)
    for i in range(n):
        delay = t0 + i / rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(one()))
    await asyncio.gather(*tasks)
    for _, w in pool:
        w.close()
    slowest = sorted(zip(lat, at, strict=True), reverse=True)[:12]  # (latency, sent at): where a tail comes from
    return {"sent": n, "ok": len(lat), "fail": fail, "lat": lat, "wall": time.monotonic() - t0,
            "slowest": [(round(a, 4), round(b, 3)) for a, b in slowest]}


async def slow(port: int, n: int, interval: float, seconds: float) -> dict[str, object]:
    closed: list[float | None] = [None] * n
    end = time.monotonic() + seconds

    async def one(i: int) -> None:
        try:
            # from another loopback address, as an attacker is another host: the proxy closes these
            # first (TIME_WAIT on its side), and the kernel reuses the freed client ports at once;
            # from 127.0.0.1 the legit load's new connections then hit those TIME_WAIT 4-tuples
            r, w = await asyncio.open_connection("127.0.0.1", port, local_addr=(SLOW_FROM, 0))
        except OSError:
            closed[i] = -1.0
            return
        t0 = time.monotonic()
        w.write(b"GET /v1/models HTTP/1.1\r\nHost: t\r\n")
        k = 0
        while time.monotonic() < end:
            try:
                data = await asyncio.wait_for(r.read(65536), interval)
                if not data:
                    closed[i] = time.monotonic() - t0
                    break
            except TimeoutError:
                try:
                    w.write(b"X-Slow-%d: a\r\n" % k)
                    k += 1
                except OSError:
                    closed[i] = time.monotonic() - t0
                    break
            except OSError:
                closed[i] = time.monotonic() - t0
                break
        w.close()

    await asyncio.gather(*(one(i) for i in range(n)))
    return {"closed_after": closed}


async def sse(port: int, idle: int, streams: int, interval: float, events: int) -> dict[str, object]:
    conns = []
    for _ in range(idle):
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
        conns.append((r, w))
    statuses = await asyncio.gather(*(_read_response(r) for r, _ in conns))
    print("idle-ready", file=sys.stderr, flush=True)
    await asyncio.sleep(1.0)  # the test (after 0.5 s) samples the proxy's RSS now
    gaps: list[float] = []
    errors = {"stream": 0}

    async def stream() -> None:
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(_req(SSE, True, b"x-stub-interval: %g\r\nx-stub-chunks: %d\r\n" % (interval, events)))
        last = None
        n = 0
        try:
            await r.readuntil(b"\r\n\r\n")
            while True:
                line = await r.readline()
                if not line:
                    break
                if line.startswith(b"data: "):
                    now = time.monotonic()
                    n += 1
                    if last is not None and b'"content"' in line and 2 < n < events:
                        gaps.append(now - last - interval)
                    last = now
                    if line.startswith(b"data: [DONE]"):
                        break  # (the stub, asked directly, may keep the connection open)
        except (OSError, asyncio.IncompleteReadError):
            errors["stream"] += 1
        w.close()
        if n < events:
            errors["stream"] += 1

    await asyncio.gather(*(stream() for _ in range(streams)))
    still_open = sum(1 for r, _ in conns if not r.at_eof())
    for _, w in conns:
        w.close()
    return {"idle_ok": statuses.count(200), "idle_open_after": still_open, "gaps": gaps, "errors": errors}


def main() -> None:
    mode, *a = sys.argv[1:]
    try:
        import uvloop
        uvloop.install()
    except ImportError:  # pragma: no cover
        pass
    if mode == "legit":
        out = asyncio.run(legit(int(a[0]), float(a[1]), float(a[2]), len(a) > 3 and a[3] == "keepalive"))
    elif mode == "slow":
        out = asyncio.run(slow(int(a[0]), int(a[1]), float(a[2]), float(a[3])))
    else:
        out = asyncio.run(sse(int(a[0]), int(a[1]), int(a[2]), float(a[3]), int(a[4])))
    data = memoryview(json.dumps(out).encode() + b"\n")
    while data:  # (with PYTHONUNBUFFERED a print to a pipe may write only part of a long line)
        data = data[os.write(1, data):]


if __name__ == "__main__":
    main()
