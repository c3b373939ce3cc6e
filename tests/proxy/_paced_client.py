"""A paced load client in its own process (so its latencies are the proxy's, not the GIL's).

``python -m tests.proxy._paced_client PORT N SPACING MODEL``: N chat POSTs on fresh connections,
SPACING seconds apart (0: all at once), request i naming ``req-<i>`` as its content; prints one JSON
list of ``[status, seconds from write to end, retry-after header or "", error code or ""]``.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from tests.proxy._rel import chat_body, timed_post


async def main(port: int, n: int, spacing: float, model: str) -> list[list[object]]:
    async def one(i: int) -> list[object]:
        status, took, data = await timed_post(port, chat_body(model, f"req-{i}"))
        head, _, body = data.partition(b"\r\n\r\n")
        retry = next((ln.split(b":", 1)[1].strip().decode() for ln in head.split(b"\r\n")
                      if ln.lower().startswith(b"retry-after:")), "")
        code = ""
        if status >= 400:
            try:
                code = json.loads(body)["error"]["code"] or ""
            except (ValueError, KeyError, TypeError):
                code = "?"
        return [status, took, retry, code]

    tasks = []
    t0 = time.monotonic()
    for i in range(n):
        if spacing:
            await asyncio.sleep(max(0.0, t0 + i * spacing - time.monotonic()))
        tasks.append(asyncio.ensure_future(one(i)))
    return await asyncio.gather(*tasks)


if __name__ == "__main__":
    port, n, spacing, model = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
    print(json.dumps(asyncio.run(main(port, n, spacing, model))))
