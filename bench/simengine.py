"""A simulated OpenAI engine for the scheduling benchmark: capacity, FIFO queue, prefix cache, metrics.

Owns: one simulated LLM engine on 127.0.0.1 (asyncio + httptools, the patterns of
``tests/stub_engine.py``) that answers ``POST /v1/chat/completions`` and ``/v1/completions``
(streaming and not), ``GET /v1/models``, ``/health`` and a vLLM-shaped ``GET /metrics``.
The cost model, all in *model seconds* multiplied by ``time_scale`` (so a CI run takes seconds):

- at most ``capacity`` requests run at once; the rest wait in a FIFO queue (``waiting``);
- the prompt text (chat contents concatenated, as the proxy's ``prompt_text`` does) is cut into
  64-char blocks with chained hashes; the leading blocks found in a bounded LRU cache of
  ``cache_blocks`` hashes are hits, the rest cost ``prefill_block_s`` each (prefill), and enter the
  cache when the prefill is done;
- token ``i`` (0-based) of ``max_tokens`` is emitted ``(i + 1) * decode_token_s`` after the prefill,
  so TTFT = queue wait + prefill + one token, e2e = wait + prefill + ``max_tokens`` tokens;
- ``slow`` multiplies prefill and decode (a slow replica).

Every request gets a :class:`Record` in :attr:`SimEngine.records` with the engine's own timestamps
and accounting, so tests check queueing and cache hits without wall-clock bounds. ``/metrics``
serves ``vllm:num_requests_running``, ``vllm:num_requests_waiting``, ``vllm:kv_cache_usage_perc``
(cached blocks / ``cache_blocks``), the ``vllm:time_to_first_token_seconds`` and
``vllm:time_per_output_token_seconds`` histograms, and the counters ``vllm:prefix_cache_queries`` /
``vllm:prefix_cache_hits`` (in blocks, not tokens as vLLM counts them; the ratio is the hit rate).

Must not: import FlexInfer (it stands for a real engine, outside the system under test); block the
loop (no per-token sleeps: tokens due by a deadline are written together); keep a slot or a queue
place for a client that has gone away.

CLI: ``python bench/simengine.py --port P --capacity 4 --cache-blocks 2000 --slow 1.0``; in-process:
``eng = await SimEngine(SimConfig(...)).start(); ...; await eng.stop()``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httptools

BLOCK_CHARS = 64
# vLLM's buckets (vllm/v1/metrics/loggers.py), in seconds
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0)


@dataclass
class SimConfig:
    """The engine's shape and costs (model seconds; ``time_scale`` turns them into real seconds)."""

    capacity: int = 4
    cache_blocks: int = 2000
    slow: float = 1.0
    prefill_block_s: float = 0.004
    decode_token_s: float = 0.02
    time_scale: float = 1.0
    model: str = "sim"
    name: str = "sim"


@dataclass
class Record:
    """One request as the engine saw it (times are ``time.monotonic()``; costs in real seconds)."""

    id: int
    arrived: float
    prompt_chars: int
    blocks: int = 0
    cached_blocks: int = 0
    max_tokens: int = 0
    stream: bool = False
    prefill_s: float = 0.0
    decode_s: float = 0.0
    admitted: float = 0.0
    first_token: float = 0.0
    finished: float = 0.0
    aborted: bool = False

    @property
    def wait(self) -> float:
        return self.admitted - self.arrived

    @property
    def ttft(self) -> float:
        return self.first_token - self.arrived

    @property
    def service(self) -> float:
        """Time the request held its slot (admission to finish)."""
        return self.finished - self.admitted


def block_hashes(text: str, block: int = BLOCK_CHARS) -> list[bytes]:
    """Chained hashes of ``text``'s ``block``-char blocks (the last one may be partial)."""
    out: list[bytes] = []
    prev = b""
    for i in range(0, len(text), block):
        prev = hashlib.blake2b(prev + text[i:i + block].encode("utf-8", "surrogatepass"),
                               digest_size=8).digest()
        out.append(prev)
    return out


class PrefixCache:
    """A bounded LRU of block hashes; :meth:`lookup` counts the leading run of cached blocks."""

    def __init__(self, capacity: int) -> None:
        self.capacity = max(0, capacity)
        self._lru: collections.OrderedDict[bytes, None] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._lru)

    def __contains__(self, h: object) -> bool:
        return h in self._lru

    def lookup(self, hashes: list[bytes]) -> int:
        """How many leading blocks are cached (they are touched, i.e. made most recent)."""
        n = 0
        for h in hashes:
            if h not in self._lru:
                break
            self._lru.move_to_end(h)
            n += 1
        return n

    def insert(self, hashes: list[bytes]) -> None:
        for h in hashes:
            self._lru[h] = None
            self._lru.move_to_end(h)
        while len(self._lru) > self.capacity:
            self._lru.popitem(last=False)

    @property
    def usage(self) -> float:
        return len(self._lru) / self.capacity if self.capacity else 0.0


class Histogram:
    """A Prometheus histogram (cumulative buckets, sum, count) rendered by hand."""

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.sum = 0.0
        self.count = 0

    def observe(self, v: float) -> None:
        self.sum += v
        self.count += 1
        for i, b in enumerate(self.buckets):
            if v <= b:
                self.counts[i] += 1

    def render(self, name: str, labels: str) -> list[str]:
        lines = [f'{name}_bucket{{{labels},le="{b}"}} {c}' for b, c in zip(self.buckets, self.counts, strict=True)]
        lines.append(f'{name}_bucket{{{labels},le="+Inf"}} {self.count}')
        lines.append(f"{name}_sum{{{labels}}} {self.sum}")
        lines.append(f"{name}_count{{{labels}}} {self.count}")
        return lines


def prompt_of(data: dict[str, Any]) -> str:
    msgs = data.get("messages")
    if isinstance(msgs, list):
        parts: list[str] = []
        for m in msgs:
            c = m.get("content") if isinstance(m, dict) else None
            if isinstance(c, str):
                parts.append(c)
            elif isinstance(c, list):
                parts.extend(p.get("text", "") for p in c if isinstance(p, dict) and isinstance(p.get("text"), str))
        return "".join(parts)
    p = data.get("prompt")
    if isinstance(p, str):
        return p
    if isinstance(p, list) and p and isinstance(p[0], str):
        return p[0]
    return ""


_REASONS = {200: b"OK", 400: b"Bad Request", 404: b"Not Found"}


class _Conn(asyncio.Protocol):
    def __init__(self, engine: SimEngine) -> None:
        self.engine = engine
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.body: list[bytes] = []
        self.queue: asyncio.Queue[tuple[str, str, bytes]] = asyncio.Queue()
        self.worker: asyncio.Task[None] | None = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.engine._conns.add(self)
        self.worker = asyncio.get_running_loop().create_task(self._serve())

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.engine._conns.discard(self)
        if self.worker is not None:
            self.worker.cancel()

    def on_message_begin(self) -> None:
        self.url, self.body = b"", []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.queue.put_nowait((self.parser.get_method().decode(), self.url.decode("latin-1"), b"".join(self.body)))

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def send(self, status: int, body: bytes, ctype: bytes = b"application/json") -> None:
        self.write(b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n%s"
                   % (status, _REASONS.get(status, b"Status"), ctype, len(body), body))

    def chunk(self, payload: bytes) -> None:
        self.write(b"%x\r\n%s\r\n" % (len(payload), payload))

    async def _serve(self) -> None:
        while True:
            method, url, body = await self.queue.get()
            try:
                await self.engine._answer(self, method, url.split("?")[0], body)
            except Exception as e:  # a bug here: recorded for the tests, the connection dropped
                self.engine.errors.append(f"{type(e).__name__}: {e}")
                self.close()
                return


class SimEngine:
    """A simulated engine listening on 127.0.0.1 (see the module doc for the cost model)."""

    def __init__(self, config: SimConfig | None = None) -> None:
        self.config = config or SimConfig()
        self.cache = PrefixCache(self.config.cache_blocks)
        self.records: list[Record] = []
        self.errors: list[str] = []  # exceptions raised while answering (a simulator bug)
        self.keep_records = True
        self.running = 0
        self._queue: collections.deque[asyncio.Future[None]] = collections.deque()
        self.queries = 0  # prompt blocks looked up
        self.hits = 0  # of which cached
        self.requests_total = 0
        self._next_id = 0
        self.ttft_hist = Histogram(TTFT_BUCKETS)
        self.tpot_hist = Histogram(TPOT_BUCKETS)
        self.server: asyncio.base_events.Server | None = None
        self.port = 0
        self._conns: set[_Conn] = set()
        self._changed = asyncio.Event()

    @property
    def waiting(self) -> int:
        return len(self._queue)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> SimEngine:
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(lambda: _Conn(self), host, port, backlog=1024)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            for c in list(self._conns):
                c.close()
            await self.server.wait_closed()
            self.server = None

    async def wait_for(self, pred: Callable[[], bool]) -> None:
        """Return once ``pred()`` holds; it is re-checked on every admission, queueing or finish."""
        while not pred():
            self._changed.clear()
            await self._changed.wait()

    def _notify(self) -> None:
        self._changed.set()

    # scheduling
    async def _acquire(self) -> None:
        if self.running < self.config.capacity and not self._queue:
            self.running += 1
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.append(fut)
        self._notify()
        try:
            await fut  # the releaser hands its slot over (running stays counted)
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self._release()  # the slot was handed to us just as we were cancelled
            else:
                if fut in self._queue:  # (a release may have dropped it already)
                    self._queue.remove(fut)
                self._notify()
            raise

    def _release(self) -> None:
        while self._queue:
            fut = self._queue.popleft()
            if not fut.done():
                fut.set_result(None)
                self._notify()
                return
        self.running -= 1
        self._notify()

    def metrics_text(self) -> str:
        lab = f'engine="0",model_name="{self.config.model}"'
        out = [
            "# HELP vllm:num_requests_running Number of requests in model execution batches.",
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{{{lab}}} {self.running}",
            "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
            "# TYPE vllm:num_requests_waiting gauge",
            f"vllm:num_requests_waiting{{{lab}}} {self.waiting}",
            "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.",
            "# TYPE vllm:kv_cache_usage_perc gauge",
            f"vllm:kv_cache_usage_perc{{{lab}}} {self.cache.usage}",
            "# HELP vllm:prefix_cache_queries Prefix cache queries, in blocks.",
            "# TYPE vllm:prefix_cache_queries counter",
            f"vllm:prefix_cache_queries_total{{{lab}}} {self.queries}",
            "# HELP vllm:prefix_cache_hits Prefix cache hits, in blocks.",
            "# TYPE vllm:prefix_cache_hits counter",
            f"vllm:prefix_cache_hits_total{{{lab}}} {self.hits}",
            "# HELP vllm:request_success Count of successfully processed requests.",
            "# TYPE vllm:request_success counter",
            f"vllm:request_success_total{{{lab}}} {self.requests_total}",
            "# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.",
            "# TYPE vllm:time_to_first_token_seconds histogram",
            *self.ttft_hist.render("vllm:time_to_first_token_seconds", lab),
            "# HELP vllm:time_per_output_token_seconds Histogram of time per output token in seconds.",
            "# TYPE vllm:time_per_output_token_seconds histogram",
            *self.tpot_hist.render("vllm:time_per_output_token_seconds", lab),
        ]
        return "\n".join(out) + "\n"

    # requests
    async def _answer(self, conn: _Conn, method: str, path: str, body: bytes) -> None:
        if method == "GET" and path == "/metrics":
            conn.send(200, self.metrics_text().encode(), b"text/plain; version=0.0.4; charset=utf-8")
        elif method == "GET" and path in ("/v1/models", "/models"):
            conn.send(200, json.dumps({"object": "list", "data": [
                {"id": self.config.model, "object": "model", "owned_by": "sim"}]}).encode())
        elif method == "GET" and path in ("/health", "/healthz", "/"):
            conn.send(200, b'{"status":"ok"}')
        elif method == "POST" and path in ("/v1/chat/completions", "/v1/completions"):
            try:
                data = json.loads(body) if body else {}
            except ValueError:
                data = None
            if not isinstance(data, dict):
                conn.send(400, b'{"error":{"message":"invalid JSON body","type":"invalid_request_error",'
                               b'"param":null,"code":null}}')
                return
            await self._generate(conn, data, path.endswith("/chat/completions"))
        else:
            conn.send(404, b'{"error":{"message":"not found","type":"invalid_request_error",'
                           b'"param":null,"code":null}}')

    async def _generate(self, conn: _Conn, data: dict[str, Any], chat: bool) -> None:
        cfg = self.config
        text = prompt_of(data)
        mt = data.get("max_completion_tokens", data.get("max_tokens"))
        max_tokens = max(1, int(mt)) if isinstance(mt, int | float) else 16
        stream = data.get("stream") is True
        so = data.get("stream_options")
        usage_chunk = isinstance(so, dict) and so.get("include_usage") is True
        m = data.get("model")
        model = m if isinstance(m, str) else cfg.model
        loop = asyncio.get_running_loop()
        self._next_id += 1
        rec = Record(id=self._next_id, arrived=loop.time(), prompt_chars=len(text), max_tokens=max_tokens, stream=stream)
        if self.keep_records:
            self.records.append(rec)
        await self._acquire()
        try:
            rec.admitted = loop.time()
            self._notify()
            hashes = block_hashes(text)
            rec.blocks = len(hashes)
            rec.cached_blocks = self.cache.lookup(hashes)
            self.queries += rec.blocks
            self.hits += rec.cached_blocks
            unit = cfg.slow * cfg.time_scale
            rec.prefill_s = (rec.blocks - rec.cached_blocks) * cfg.prefill_block_s * unit
            tpot = cfg.decode_token_s * unit
            rec.decode_s = max_tokens * tpot
            if rec.prefill_s > 0:
                await asyncio.sleep(rec.prefill_s)
            self.cache.insert(hashes)
            t0 = loop.time()
            ident = f"{'chatcmpl' if chat else 'cmpl'}-sim{rec.id}"
            if stream:
                if not await self._stream(conn, rec, chat, ident, model, t0, tpot, usage_chunk):
                    rec.aborted = True
                    return
            else:
                await asyncio.sleep(rec.decode_s)
                rec.first_token = t0 + tpot
                rec.finished = loop.time()
                content = "".join(f"t{i} " for i in range(max_tokens))
                usage = {"prompt_tokens": max(1, len(text) // 4), "completion_tokens": max_tokens,
                         "total_tokens": max(1, len(text) // 4) + max_tokens}
                choice: dict[str, Any] = ({"index": 0, "message": {"role": "assistant", "content": content},
                                           "logprobs": None, "finish_reason": "length"} if chat else
                                          {"index": 0, "text": content, "logprobs": None, "finish_reason": "length"})
                conn.send(200, json.dumps({"id": ident, "object": "chat.completion" if chat else "text_completion",
                                           "created": int(time.time()), "model": model, "choices": [choice],
                                           "usage": usage}).encode())
            self.requests_total += 1
            self.ttft_hist.observe(rec.first_token - rec.arrived)
            if max_tokens > 1:
                self.tpot_hist.observe((rec.finished - rec.first_token) / (max_tokens - 1))
        except asyncio.CancelledError:
            rec.aborted = True
            raise
        finally:
            self._release()

    async def _stream(self, conn: _Conn, rec: Record, chat: bool, ident: str, model: str, t0: float,
                      tpot: float, usage_chunk: bool) -> bool:
        """Stream the tokens; False when the client went away first."""
        loop = asyncio.get_running_loop()
        created = int(time.time())
        obj = "chat.completion.chunk" if chat else "text_completion"

        def event(choice: dict[str, Any], usage: dict[str, int] | None = None) -> bytes:
            ev: dict[str, Any] = {"id": ident, "object": obj, "created": created, "model": model,
                                  "choices": [choice] if choice else []}
            if usage is not None:
                ev["usage"] = usage
            return b"data: " + json.dumps(ev, separators=(",", ":")).encode() + b"\n\n"

        def token(i: int, last: bool) -> bytes:
            fin = "length" if last else None
            if chat:
                return event({"index": 0, "delta": {"content": f"t{i} "}, "logprobs": None, "finish_reason": fin})
            return event({"index": 0, "text": f"t{i} ", "logprobs": None, "finish_reason": fin})

        n = rec.max_tokens
        sent = 0
        while sent < n:
            due = t0 + (sent + 1) * tpot
            now = loop.time()
            if now < due:
                await asyncio.sleep(due - now)
                now = loop.time()
            if conn.closed:
                return False
            # every token whose time has come goes out now, in one write
            upto = min(n, max(sent + 1, int((now - t0) / tpot) if tpot > 0 else n))
            parts: list[bytes] = []
            if sent == 0:
                rec.first_token = now
                conn.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
                           b"cache-control: no-store\r\ntransfer-encoding: chunked\r\n\r\n")
                if chat:
                    parts.append(event({"index": 0, "delta": {"role": "assistant", "content": ""},
                                        "logprobs": None, "finish_reason": None}))
            parts.extend(token(i, i == n - 1) for i in range(sent, upto))
            sent = upto
            conn.chunk(b"".join(parts))
        rec.finished = loop.time()
        tail = b""
        if usage_chunk:
            pt = max(1, rec.prompt_chars // 4)
            tail += event({}, {"prompt_tokens": pt, "completion_tokens": n, "total_tokens": pt + n})
        tail += b"data: [DONE]\n\n"
        conn.chunk(tail)
        conn.write(b"0\r\n\r\n")
        return True


def main() -> None:
    ap = argparse.ArgumentParser(description="simulated OpenAI engine (capacity, queue, prefix cache, metrics)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=18001)
    ap.add_argument("--capacity", type=int, default=4, help="requests running at once; the rest queue")
    ap.add_argument("--cache-blocks", type=int, default=2000, help="prefix-cache size in 64-char blocks")
    ap.add_argument("--slow", type=float, default=1.0, help="multiplies prefill and decode time")
    ap.add_argument("--prefill-block-s", type=float, default=SimConfig.prefill_block_s,
                    help="model seconds per uncached prompt block")
    ap.add_argument("--decode-token-s", type=float, default=SimConfig.decode_token_s,
                    help="model seconds per output token")
    ap.add_argument("--time-scale", type=float, default=1.0, help="real seconds per model second")
    ap.add_argument("--model", default="sim", help="the model_name label and /v1/models id")
    args = ap.parse_args()
    cfg = SimConfig(capacity=args.capacity, cache_blocks=args.cache_blocks, slow=args.slow,
                    prefill_block_s=args.prefill_block_s, decode_token_s=args.decode_token_s,
                    time_scale=args.time_scale, model=args.model, name=f"sim:{args.port}")
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass

    async def serve() -> None:
        eng = SimEngine(cfg)
        eng.keep_records = False  # standalone: don't grow forever
        await eng.start(args.host, args.port)
        print(f"sim engine on http://{args.host}:{eng.port} capacity={cfg.capacity} "
              f"cache_blocks={cfg.cache_blocks} slow={cfg.slow}", flush=True)
        await asyncio.Event().wait()

    asyncio.run(serve())


if __name__ == "__main__":
    main()
