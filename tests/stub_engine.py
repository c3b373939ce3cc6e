"""A fast stub OpenAI engine for tests and benchmarks (asyncio + httptools, no FlexInfer code).

It answers ``/v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings``, ``/v1/models`` and
``/health`` in OpenAI's shapes, echoing the ``model`` it received. Request headers script faults:

- ``x-stub-delay: S``       wait S seconds before the response head
- ``x-stub-chunks: N``      stream N content chunks (default 32) when ``"stream": true``
- ``x-stub-interval: S``    pause S seconds between streamed events
- ``x-stub-fail-after: K``  stream K events, then close the connection (no terminating chunk)
- ``x-stub-mode: M``        ``reset`` (RST before answering), ``hang`` (never answer), ``garbage``
                            (an invalid status line), ``close`` (FIN without answering),
                            ``status:<code>`` (an OpenAI error with that status)
- ``x-stub-big: N``         a non-streaming answer of N content bytes
- ``POST /tokenize``        vLLM's answer ``{"count": N, "tokens": [...]}``, N = the words of ``prompt``
                            (after :attr:`StubEngine.tokenize_delay` seconds)
- ``x-stub-usage: P,C``     the ``usage`` to report (prompt, completion tokens) in the chat answer
                            and in the final SSE usage chunk (sent when ``stream_options.include_usage``)

Every request is recorded in :attr:`StubEngine.requests` and every closed connection in
:attr:`StubEngine.closed_at` (time.monotonic() of the close), so tests can see exactly what reached
the engine and how fast an abort propagated. Run standalone: ``python -m tests.stub_engine --port N``.

Engine metrics (optional, off by default): set :attr:`StubEngine.metrics_text` and ``GET /metrics``
serves it (``metrics_status``, ``metrics_delay`` seconds before the head, ``metrics_framing``
``length``/``chunked``/``close``); set :attr:`StubEngine.lora_adapters` and ``GET /v1/models`` also
lists them the way vLLM does (``"parent"``: the base model ``stub``). With neither set, nothing changes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import struct
import time
from dataclasses import dataclass, field
from typing import Any

import httptools

_ROLE = b'{"id":"chatcmpl-stub","object":"chat.completion.chunk","created":1700000000,"model":%s,"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}'
_TOKEN = b'{"id":"chatcmpl-stub","object":"chat.completion.chunk","created":1700000000,"model":%s,"choices":[{"index":0,"delta":{"content":"tok%d "},"logprobs":null,"finish_reason":null}]}'
_FINISH = b'{"id":"chatcmpl-stub","object":"chat.completion.chunk","created":1700000000,"model":%s,"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}]}'
_CMPL_TOKEN = b'{"id":"cmpl-stub","object":"text_completion","created":1700000000,"model":%s,"choices":[{"index":0,"text":"tok%d ","logprobs":null,"finish_reason":null}]}'


@dataclass
class Captured:
    method: str
    path: str
    headers: dict[str, str]
    raw_headers: list[tuple[bytes, bytes]]
    body: bytes
    conn_id: int
    at: float = field(default_factory=time.monotonic)


class _Conn(asyncio.Protocol):
    def __init__(self, engine: StubEngine) -> None:
        self.engine = engine
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: list[bytes] = []
        self.tasks: set[asyncio.Task[None]] = set()
        self.closed = False
        self.queue: asyncio.Queue[Captured] = asyncio.Queue()
        self.worker: asyncio.Task[None] | None = None
        self.cid = 0

    # asyncio callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.engine.connections_total += 1
        self.cid = self.engine.connections_total
        self.engine.open_connections += 1
        self.worker = asyncio.get_running_loop().create_task(self._serve())

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self._close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.engine.open_connections -= 1
        self.engine.closed_at.append(time.monotonic())
        if self.worker is not None:
            self.worker.cancel()

    # parser callbacks
    def on_message_begin(self) -> None:
        self.url, self.headers, self.body = b"", [], []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        cap = Captured(self.parser.get_method().decode(), self.url.decode("latin-1"),
                       {k.decode("latin-1"): v.decode("latin-1") for k, v in self.headers},
                       list(self.headers), b"".join(self.body), self.cid)
        self.engine.requests.append(cap)
        self.queue.put_nowait(cap)

    # responses
    def _close(self, rst: bool = False) -> None:
        t = self.transport
        if t is None or t.is_closing():
            return
        if rst:
            sock = t.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            t.abort()
        else:
            t.close()

    def _write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def _send(self, status: int, body: bytes, ctype: bytes = b"application/json") -> None:
        reason = {200: b"OK", 400: b"Bad Request", 404: b"Not Found", 429: b"Too Many Requests",
                  500: b"Internal Server Error", 503: b"Service Unavailable"}.get(status, b"Status")
        self._write(b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\ncontent-length: %d\r\nx-request-id: stub-%d\r\n\r\n%s"
                    % (status, reason, ctype, len(body), self.cid, body))

    async def _serve(self) -> None:
        while True:
            cap = await self.queue.get()
            await self._answer(cap)

    async def _answer(self, cap: Captured) -> None:
        h = cap.headers
        mode = h.get("x-stub-mode", "")
        delay = float(h.get("x-stub-delay", "0") or 0)
        if mode == "reset":
            self._close(rst=True)
            return
        if mode == "close":
            self._close()
            return
        if mode == "hang":
            await asyncio.sleep(3600)
        if delay:
            await asyncio.sleep(delay)
        if mode == "garbage":
            self._write(b"HTTX/9.9 what\r\n\r\n")
            self._close()
            return
        if mode.startswith("status:"):
            code = int(mode[7:])
            self._send(code, json.dumps({"error": {"message": f"stub error {code}", "type": "server_error",
                                                    "param": None, "code": f"stub_{code}"}}).encode())
            return
        path = cap.path.split("?")[0]
        if cap.method == "GET" and path == "/metrics" and self.engine.metrics_text is not None:
            await self._metrics()
            return
        if cap.method == "GET" and path in ("/v1/models", "/models"):
            if self.engine.lora_adapters:
                self._send(200, json.dumps({"object": "list", "data": [
                    {"id": "stub", "object": "model", "owned_by": "stub", "root": "stub", "parent": None},
                    *({"id": a, "object": "model", "owned_by": "stub", "root": f"/adapters/{a}",
                       "parent": "stub"} for a in self.engine.lora_adapters)]}).encode())
                return
            self._send(200, b'{"object":"list","data":[{"id":"stub","object":"model","owned_by":"stub"}]}')
            return
        if cap.method == "GET" and path in ("/health", "/healthz", "/"):
            self.engine.health_hits += 1
            ok = self.engine.health_status == 200
            self._send(self.engine.health_status, b'{"status":"ok"}' if ok else b'{"status":"unhealthy"}')
            return
        try:
            data: dict[str, Any] = json.loads(cap.body) if cap.body else {}
        except ValueError:
            data = {}
        model = json.dumps(data.get("model", "stub")).encode()
        if path == "/tokenize":
            await asyncio.sleep(self.engine.tokenize_delay)
            n = len(str(data.get("prompt", "")).split())
            self._send(200, json.dumps({"count": n, "max_model_len": 4096, "tokens": list(range(n))}).encode())
            return
        if data.get("stream") is True:
            await self._stream(cap, model, path)
            return
        if path.endswith("/embeddings"):
            body = b'{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.1,0.2,0.3]}],"model":%s,"usage":{"prompt_tokens":3,"total_tokens":3}}' % model
        elif path.endswith("/completions") and not path.endswith("/chat/completions"):
            body = b'{"id":"cmpl-stub","object":"text_completion","created":1700000000,"model":%s,"choices":[{"index":0,"text":"hello from stub","logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":3,"total_tokens":6}}' % model
        else:
            content = "hello from stub"
            big = int(h.get("x-stub-big", "0") or 0)
            if big:
                content = "x" * big
            body = (b'{"id":"chatcmpl-stub","object":"chat.completion","created":1700000000,"model":%s,'
                    b'"choices":[{"index":0,"message":{"role":"assistant","content":%s},"logprobs":null,'
                    b'"finish_reason":"stop"}],"usage":%s}'
                    % (model, json.dumps(content).encode(), _usage(h, 5, 4)))
        self._send(200, body)

    async def _metrics(self) -> None:
        eng = self.engine
        eng.metrics_hits += 1
        if eng.metrics_delay:
            await asyncio.sleep(eng.metrics_delay)
        text = eng.metrics_text or b""
        body = text.encode() if isinstance(text, str) else text
        ctype = b"text/plain; version=0.0.4; charset=utf-8"
        if eng.metrics_status != 200 or eng.metrics_framing == "length":
            self._send(eng.metrics_status, body, ctype)
            return
        if eng.metrics_framing == "chunked":
            self._write(b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\ntransfer-encoding: chunked\r\n\r\n" % ctype)
            for i in range(0, len(body), 4096):
                part = body[i:i + 4096]
                self._write(b"%x\r\n%s\r\n" % (len(part), part))
            self._write(b"0\r\n\r\n")
            return
        self._write(b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\nconnection: close\r\n\r\n%s" % (ctype, body))
        self._close()

    async def _stream(self, cap: Captured, model: bytes, path: str) -> None:
        h = cap.headers
        n = int(h.get("x-stub-chunks", "32") or 32)
        interval = float(h.get("x-stub-interval", "0") or 0)
        fail_after = int(h.get("x-stub-fail-after", "-1") or -1)
        hang_mid = h.get("x-stub-mode") == "hang-mid"
        self._write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
                    b"cache-control: no-store\r\ntransfer-encoding: chunked\r\nx-request-id: stub-%d\r\n\r\n"
                    % self.cid)
        chat = path.endswith("/chat/completions")
        events: list[bytes] = [_ROLE % model] if chat else []
        tmpl = _TOKEN if chat else _CMPL_TOKEN
        events.extend(tmpl % (model, i) for i in range(n))
        if chat:
            events.append(_FINISH % model)
        opts = json.loads(cap.body).get("stream_options") if cap.body else None
        if isinstance(opts, dict) and opts.get("include_usage"):
            events.append(b'{"id":"chatcmpl-stub","object":"chat.completion.chunk","created":1700000000,'
                          b'"model":%s,"choices":[],"usage":%s}' % (model, _usage(h, 5, n)))
        events.append(b"[DONE]")
        for i, ev in enumerate(events):
            if i == fail_after:
                self._close(rst=h.get("x-stub-fail-rst") == "1")
                return
            if hang_mid and i == 2:
                await asyncio.sleep(3600)
            payload = b"data: " + ev + b"\n\n"
            self._write(b"%x\r\n%s\r\n" % (len(payload), payload))
            if interval and i < len(events) - 1:  # between events: the body ends with the last one
                await asyncio.sleep(interval)
            if self.closed:
                return
        self._write(b"0\r\n\r\n")


def _usage(h: dict[str, str], prompt: int, completion: int) -> bytes:
    """The usage object: ``x-stub-usage: P,C`` or the defaults."""
    if "x-stub-usage" in h:
        prompt, completion = (int(x) for x in h["x-stub-usage"].split(","))
    return b'{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}' % (prompt, completion, prompt + completion)


class StubEngine:
    """A stub OpenAI engine listening on 127.0.0.1."""

    def __init__(self) -> None:
        self.requests: list[Captured] = []
        self.closed_at: list[float] = []
        self.connections_total = 0
        self.open_connections = 0
        self.server: asyncio.base_events.Server | None = None
        self.port = 0
        # optional engine-metrics page and LoRA adapters (module doc); None / empty: not served
        self.metrics_text: str | bytes | None = None
        self.metrics_status = 200
        self.metrics_delay = 0.0
        self.metrics_framing = "length"  # "length" | "chunked" | "close"
        self.metrics_hits = 0
        self.health_status = 200  # what GET /health answers
        self.health_hits = 0
        self.lora_adapters: list[str] = []
        self.tokenize_delay = 0.0

    async def start(self, host: str = "127.0.0.1", port: int = 0, ssl: Any = None) -> StubEngine:
        """``ssl``: a server ``ssl.SSLContext`` (the engine behind TLS; ``connections_total`` then
        counts TLS connections, each after its handshake)."""
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(lambda: _Conn(self), host, port, backlog=1024, ssl=ssl)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


def main() -> None:
    ap = argparse.ArgumentParser(description="stub OpenAI engine")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=18001)
    ap.add_argument("--start-delay", type=float, default=0.0, help="sleep before listening (slow cold start)")
    ap.add_argument("--fail-once", default="", help="exit 1 the first time (creates this marker file)")
    ap.add_argument("--metrics-file", default="", help="serve this file's text on GET /metrics")
    args = ap.parse_args()
    import os
    import sys
    if args.fail_once and not os.path.exists(args.fail_once):
        open(args.fail_once, "w").close()
        print("stub engine: failing on purpose (first start)", flush=True)
        sys.exit(1)
    if args.start_delay:
        time.sleep(args.start_delay)
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass

    async def serve() -> None:
        eng = StubEngine()
        if args.metrics_file:
            with open(args.metrics_file, encoding="utf-8") as f:
                eng.metrics_text = f.read()
        await eng.start(args.host, args.port)
        print(f"stub engine on http://{args.host}:{eng.port}", flush=True)
        eng.requests = _Discard()  # type: ignore[assignment]  # don't grow forever when standalone
        eng.closed_at = _Discard()  # type: ignore[assignment]
        await asyncio.Event().wait()

    asyncio.run(serve())


class _Discard(list):  # type: ignore[type-arg]
    def append(self, item: Any) -> None:
        pass


if __name__ == "__main__":
    main()
