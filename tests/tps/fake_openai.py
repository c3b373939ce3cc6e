"""A fake OpenAI streaming server for the bench runner's tests, and the :class:`BenchConfig` aimed at it."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

from flexinfer import tps
from flexinfer.tps import BenchConfig

# ---- a fake OpenAI server ------------------------------------------------------------------------


@dataclass
class FakeOpenAI:
    """asyncio HTTP/1.1 server on 127.0.0.1 answering /v1/chat/completions with N SSE chunks.

    The first content chunk comes ``ttft`` seconds after the request, then one chunk every ``delay``
    seconds. ``usage``: send a final usage chunk (stream) with this completion_tokens, or the usage of a
    non-stream answer. ``fail_first``: answer the first K chat requests with ``fail_status``.
    """

    chunks: int = 10
    delay: float = 0.02
    ttft: float = 0.03
    usage: int | None = None
    fail_first: int = 0
    fail_status: int = 503
    models: list[dict[str, Any]] = field(default_factory=lambda: [{"id": "fake", "object": "model"}])
    error_mid_stream: bool = False
    bodies: list[dict[str, Any]] = field(default_factory=list)
    headers_seen: list[dict[str, str]] = field(default_factory=list)
    sent: list[tuple[float, float, float]] = field(default_factory=list)  # (received, first, last chunk)
    port: int = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode().split("\r\n")
            _method, path, _ = lines[0].split(" ", 2)
            headers = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:] if ":" in ln)}
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            t_recv = time.perf_counter()
            if path.endswith("/models"):
                await self._json(writer, 200, {"object": "list", "data": self.models})
                return
            req = json.loads(body)
            self.bodies.append(req)
            self.headers_seen.append(headers)
            if self.fail_first > 0:
                self.fail_first -= 1
                await self._json(writer, self.fail_status, {"error": {"message": "model is loading",
                                                                     "type": "server_error", "code": None}})
                return
            if not req.get("stream"):
                await asyncio.sleep(self.ttft + self.delay * (self.chunks - 1))
                out: dict[str, Any] = {"object": "chat.completion", "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": "x " * self.chunks},
                     "finish_reason": "length"}]}
                if self.usage is not None:
                    out["usage"] = {"prompt_tokens": 12, "completion_tokens": self.usage,
                                    "total_tokens": 12 + self.usage}
                await self._json(writer, 200, out)
                return
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
                         b"transfer-encoding: chunked\r\nconnection: close\r\n\r\n")
            await self._event(writer, {"choices": [{"index": 0, "delta": {"role": "assistant"}}]})
            sent: list[float] = []
            for i in range(self.chunks):  # on an absolute schedule: late wake-ups do not accumulate
                await asyncio.sleep(max(0.0, t_recv + self.ttft + i * self.delay - time.perf_counter()))
                if self.error_mid_stream and i == self.chunks // 2:
                    await self._event(writer, {"error": {"message": "engine crashed", "type": "server_error"}})
                    break
                await self._event(writer, {"choices": [{"index": 0, "delta": {"content": f"t{i} "}}]})
                sent.append(time.perf_counter())
            self.sent.append((t_recv, sent[0], sent[-1]))
            await self._event(writer, {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
            if self.usage is not None and (req.get("stream_options") or {}).get("include_usage"):
                await self._event(writer, {"choices": [], "usage": {"completion_tokens": self.usage}})
            self._chunk(writer, b"data: [DONE]\n\n")
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    @staticmethod
    def _chunk(writer: asyncio.StreamWriter, data: bytes) -> None:
        writer.write(b"%x\r\n%s\r\n" % (len(data), data))

    async def _event(self, writer: asyncio.StreamWriter, obj: dict[str, Any]) -> None:
        self._chunk(writer, b"data: " + json.dumps(obj).encode() + b"\n\n")
        await writer.drain()

    @staticmethod
    async def _json(writer: asyncio.StreamWriter, status: int, obj: Any) -> None:
        body = json.dumps(obj).encode()
        writer.write(b"HTTP/1.1 %d X\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
                     b"connection: close\r\n\r\n%s" % (status, len(body), body))
        await writer.drain()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def chat_requests(self) -> int:
        return len(self.bodies)


def bench_cfg(fake: FakeOpenAI, **kw: Any) -> BenchConfig:
    base: dict[str, Any] = {"base_url": fake.base_url, "model": "fake", "warmup": 0, "iterations": 3,
                            "min_duration": 0.0}
    base.update(kw)
    return tps.load_config({}, **base)
