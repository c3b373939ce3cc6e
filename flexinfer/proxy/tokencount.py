"""Exact input-token counts from the engine's tokenizer (``PROXY_TOKEN_COUNT=tokenizer``).

Owns: one ``POST /tokenize`` to a replica of the model (vLLM and llama.cpp server both serve it:
the body carries ``prompt`` for vLLM and ``content`` for llama.cpp; the answer's ``count`` (vLLM) or
the length of its ``tokens`` list (both) is the count), bounded by ``PROXY_TOKEN_COUNT_TIMEOUT`` and
a 4 MiB answer, and the fall back to the caller's estimate on any failure (None).
Must not: fail or delay a request past the timeout, or route (every replica of a model runs the
same tokenizer, so the model's first endpoint is asked; the request itself is routed later).
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from flexinfer.http.client import Pools, UpstreamError
from flexinfer.runtime.base import ModelView

MAX_ANSWER = 4 * 1024 * 1024
_HEADERS = [(b"content-type", b"application/json"), (b"accept", b"application/json")]


def prompt_text(data: dict[str, Any]) -> str:
    """The prompt text of a request body (messages' text contents, prompt, input), joined by newlines."""
    parts: list[str] = []

    def add(v: Any, depth: int = 0) -> None:
        if isinstance(v, str):
            parts.append(v)
        elif isinstance(v, list) and depth < 4:
            for x in v:
                add(x, depth + 1)
        elif isinstance(v, dict) and isinstance(v.get("text"), str):
            parts.append(v["text"])

    msgs = data.get("messages")
    if isinstance(msgs, list):
        for m in msgs:
            if isinstance(m, dict):
                add(m.get("content"))
    for field in ("prompt", "input"):
        add(data.get(field))
    return "\n".join(parts)


class TokenCounter:
    """Counts a request's prompt tokens on an engine's ``/tokenize``."""

    def __init__(self, pools: Pools, timeout: float) -> None:
        self.pools = pools
        self.timeout = timeout

    async def count(self, view: ModelView, data: dict[str, Any] | None) -> float | None:
        """The exact count, or None (no endpoint, no JSON body, timeout, any error)."""
        if data is None or not view.endpoints:
            return None
        text = prompt_text(data)
        body = orjson.dumps({"model": view.upstream_model, "prompt": text, "content": text})
        ep = view.endpoints[0]
        try:
            async with asyncio.timeout(self.timeout):
                pool = (self.pools.get(ep.host, ep.port) if ep.link is None
                        else self.pools.get_linked(ep.host, ep.port, ep.link))
                up = await pool.request("POST", "/tokenize", _HEADERS, body, response_timeout=self.timeout)
                try:
                    raw = await up.read_all(MAX_ANSWER)
                finally:
                    up.close()
            if up.status != 200:
                return None
            ans = orjson.loads(raw)
            n = ans.get("count") if isinstance(ans, dict) else None
            if not isinstance(n, int) or isinstance(n, bool):
                toks = ans.get("tokens") if isinstance(ans, dict) else None
                n = len(toks) if isinstance(toks, list) else None
            return float(n) if n is not None and n >= 0 else None
        except (TimeoutError, UpstreamError, orjson.JSONDecodeError, ValueError, OSError):
            return None
