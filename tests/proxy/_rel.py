"""Small helpers of the reliability rows F10-F18: raw timed requests, percentiles, and figures.

Each row prints its measured figures as one ``FIGURE <row> key=value ...`` line (run pytest with
``-s`` to see them; bench/results/reliability-rel2.md records one full-size run of each).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from typing import Any


def figure(row: str, **values: Any) -> None:
    parts = " ".join(f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items())
    print(f"\nFIGURE {row} {parts}", flush=True)


def pct(values: list[float], q: float) -> float:
    """The q-quantile (0..1) by nearest rank; nan for no values."""
    if not values:
        return math.nan
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def chat_body(model: str, marker: str, stream: bool = False) -> bytes:
    return json.dumps({"model": model, "stream": stream,
                       "messages": [{"role": "user", "content": marker}]}).encode()


async def timed_post(port: int, body: bytes, path: str = "/v1/chat/completions",
                     headers: dict[str, str] | None = None) -> tuple[int, float, bytes]:
    """POST on a fresh connection (Connection: close): (status, seconds from the write to the end, raw)."""
    r, w = await asyncio.open_connection("127.0.0.1", port)
    try:
        head = (f"POST {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n")
        for k, v in (headers or {}).items():
            head += f"{k}: {v}\r\n"
        t0 = time.monotonic()
        w.write(head.encode() + b"\r\n" + body)
        data = await r.read()
        took = time.monotonic() - t0
    finally:
        w.close()
        await w.wait_closed()
    try:
        status = int(data.split(b" ", 2)[1])
    except (IndexError, ValueError):
        status = 0  # closed without an answer
    return status, took, data
