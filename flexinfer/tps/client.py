"""Bench runner HTTP: an OpenAI-compatible :class:`Endpoint` and one timed chat request (:func:`measure_once`).

HTTP is the standard library's ``http.client`` (keep-alive off, one connection per request, opened
before the clock starts, so TTFT excludes TCP/TLS setup): no dependency beyond the runtime's, sync
and sequential like the measurement itself. Per streamed request it records TTFT (request sent →
first content chunk), the decode window (first → last content chunk) and the tokens
(``usage.completion_tokens`` when the server sends a usage chunk, which the request asks for with
``stream_options.include_usage``, else the number of content chunks: llama.cpp sends no usage chunk).
With ``--no-stream`` the sample is ``usage.completion_tokens`` over the wall time. It owns the wire,
not the run: warm-up, readiness and the iteration rules are :mod:`flexinfer.tps.measure`'s.
"""

from __future__ import annotations

import http.client
import ssl
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

import orjson

from flexinfer.tps.config import BenchConfig, BenchError, HTTPStatusError
from flexinfer.tps.stats import Sample

MAX_LINE = 1 << 20  # longest SSE line accepted
MAX_ERROR_BODY = 64 * 1024


class Endpoint:
    """An OpenAI-compatible base URL; opens one fresh connection per request."""

    def __init__(self, base_url: str, api_key: str = "", timeout: float = 180.0) -> None:
        u = urllib.parse.urlsplit(base_url)
        self.base_url = base_url
        self.https = u.scheme == "https"
        self.host = u.hostname or "127.0.0.1"
        self.port = u.port or (443 if self.https else 80)
        self.path = u.path.rstrip("/")
        self.timeout = timeout
        self.headers = {"Content-Type": "application/json", "Accept": "text/event-stream, application/json",
                        "User-Agent": "flexinfer-bench", "Connection": "close"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"

    def connect(self) -> http.client.HTTPConnection:
        conn: http.client.HTTPConnection
        if self.https:
            conn = http.client.HTTPSConnection(self.host, self.port, timeout=self.timeout,
                                               context=ssl.create_default_context())
        else:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            conn.connect()
        except OSError as exc:
            conn.close()
            raise ConnectionError(f"cannot connect to {self.host}:{self.port}: {exc.strerror or exc}") from None
        return conn

    def get_json(self, path: str) -> Any:
        conn = self.connect()
        try:
            conn.request("GET", self.path + path, headers=self.headers)
            resp = conn.getresponse()
            body = resp.read(MAX_ERROR_BODY * 16)
            if resp.status != 200:
                raise HTTPStatusError(resp.status, _error_message(body))
            return orjson.loads(body)
        finally:
            conn.close()


def _error_message(body: bytes) -> str:
    try:
        obj = orjson.loads(body)
        err = obj.get("error") if isinstance(obj, dict) else None
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])[:300]
        if isinstance(err, str):
            return err[:300]
    except orjson.JSONDecodeError:
        pass
    text = body.decode("utf-8", "replace").strip().replace("\n", " ")
    return text[:300] or "(empty body)"


def request_body(cfg: BenchConfig, model: str) -> bytes:
    body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": cfg.prompt}],
                            "max_tokens": cfg.max_tokens, "stream": cfg.stream}
    if cfg.stream:
        body["stream_options"] = {"include_usage": True}
    return orjson.dumps(body)


def _content_of(choice: Any) -> str:
    if not isinstance(choice, dict):
        return ""
    delta = choice.get("delta")
    if isinstance(delta, dict):
        for k in ("content", "reasoning_content", "reasoning"):
            v = delta.get(k)
            if isinstance(v, str) and v:
                return v
        return ""
    text = choice.get("text")  # legacy completions chunks
    return text if isinstance(text, str) else ""


def measure_once(ep: Endpoint, body: bytes, stream: bool,
                 clock: Callable[[], float] = time.perf_counter) -> Sample:
    """Send one chat request and time it. Raises HTTPStatusError, ConnectionError or BenchError."""
    conn = ep.connect()
    try:
        t0 = clock()
        try:
            conn.request("POST", ep.path + "/chat/completions", body=body, headers=ep.headers)
            resp = conn.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            raise ConnectionError(f"request to {ep.base_url} failed: {exc}") from None
        if resp.status != 200:
            raise HTTPStatusError(resp.status, _error_message(resp.read(MAX_ERROR_BODY)))
        if not stream:
            raw = resp.read()
            latency = clock() - t0
            try:
                obj = orjson.loads(raw)
            except orjson.JSONDecodeError:
                raise BenchError("response is not JSON") from None
            usage = obj.get("usage") if isinstance(obj, dict) else None
            tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
            if not isinstance(tokens, int):
                raise BenchError("non-stream response has no usage.completion_tokens; try streaming")
            return Sample(tokens=tokens, chunks=0, latency=latency, usage=True)
        first: float | None = None
        last = 0.0
        chunks = 0
        usage_tokens: int | None = None
        try:
            while True:
                line = resp.readline(MAX_LINE)
                if not line:
                    break
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                try:
                    obj = orjson.loads(data)
                except orjson.JSONDecodeError:
                    raise BenchError(f"bad SSE data line: {data[:80]!r}") from None
                if not isinstance(obj, dict):
                    continue
                if obj.get("error"):
                    err = obj["error"]
                    msg = err.get("message") if isinstance(err, dict) else err
                    raise BenchError(f"error in stream: {msg}")
                choices = obj.get("choices")
                if isinstance(choices, list) and any(_content_of(c) for c in choices):
                    now = clock()
                    if first is None:
                        first = now
                    last = now
                    chunks += 1
                u = obj.get("usage")
                if isinstance(u, dict) and isinstance(u.get("completion_tokens"), int):
                    usage_tokens = u["completion_tokens"]
        except (OSError, http.client.HTTPException) as exc:
            raise ConnectionError(f"stream from {ep.base_url} broke: {exc}") from None
        end = clock()
        if chunks == 0:
            raise BenchError("the stream carried no content tokens")
        assert first is not None
        tokens = usage_tokens if usage_tokens is not None else chunks
        decode = (last - first) if chunks >= 2 and last > first else None
        return Sample(tokens=tokens, chunks=chunks, latency=end - t0, ttft=first - t0,
                      decode_seconds=decode, usage=usage_tokens is not None)
    finally:
        conn.close()
