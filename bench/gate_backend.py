"""The benchmark gate's backend: a cheap OpenAI-shaped engine (raw asyncio + httptools + uvloop).

Owns: answering ``POST /v1/chat/completions`` from prebuilt bytes, so that the proxy in front of it is
the costly part of a request: a JSON chat completion (Content-Length) for a plain request, and a
chunked SSE stream of 35 events (role, 32 tokens, finish, ``[DONE]``) when the body asks for
``"stream":true``, written in ONE write: measured on the 2-core CI machine, one write per event made
the backend itself the bottleneck (940 streams/s against 16,500 in one write, wrk alone on the other
core), so the gate would have measured the backend. Keep-alive as the client asks; any other path
gets the same answers. ``--event-gap-ms G`` (not used by the gate; bench/instr.py's paced mode)
writes a stream one event per write instead, G ms apart, the shape of an engine producing tokens, so
that each event reaches the proxy in a read of its own.
Must not: import flexinfer (it measures both the baseline and HEAD), parse JSON, or sleep (the event
gap is a loop timer, asked for explicitly).
Run: ``python bench/gate_backend.py --port N [--event-gap-ms G]``.
"""

from __future__ import annotations

import argparse
import asyncio

import httptools

_CHAT = (b'{"id":"chatcmpl-gate","object":"chat.completion","created":1700000000,"model":"gate",'
         b'"choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"logprobs":null,'
         b'"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}')
NONSTREAM = (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(_CHAT)
             + _CHAT)
STREAM_HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
               b"cache-control: no-store\r\ntransfer-encoding: chunked\r\n\r\n")
_CHUNK = b'{"id":"chatcmpl-gate","object":"chat.completion.chunk","created":1700000000,"model":"gate","choices":[{"index":0,"delta":%s,"logprobs":null,"finish_reason":%s}]}'
_EVENTS = ([_CHUNK % (b'{"role":"assistant","content":""}', b"null")]
           + [_CHUNK % (b'{"content":"tok%d "}' % i, b"null") for i in range(32)]
           + [_CHUNK % (b"{}", b'"stop"'), b"[DONE]"])
#: one chunked-encoding piece per SSE event (35), then the terminating chunk
STREAM_CHUNKS = [b"%x\r\n%s\r\n" % (len(p), p) for p in (b"data: " + e + b"\n\n" for e in _EVENTS)]
STREAM_END = b"0\r\n\r\n"
EVENTS = len(STREAM_CHUNKS)
STREAM = STREAM_HEAD + b"".join(STREAM_CHUNKS) + STREAM_END


class _Conn(asyncio.Protocol):
    #: seconds between the events of a stream; 0: the whole stream in one write
    gap = 0.0

    def __init__(self) -> None:
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.stream = False
        self.tail = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if self.transport is not None:
                self.transport.close()

    def on_message_begin(self) -> None:
        self.stream = False
        self.tail = b""

    def on_body(self, body: bytes) -> None:
        if not self.stream:
            both = self.tail + body  # the marker may straddle two reads
            self.stream = b'"stream":true' in both or b'"stream": true' in both
            self.tail = both[-16:]

    def on_message_complete(self) -> None:
        t = self.transport
        if t is None or t.is_closing():
            return
        if self.stream and self.gap > 0:
            t.write(STREAM_HEAD)
            self._paced(t, 0)
            return  # (the stream ends the exchange; the next request waits for it, as clients do)
        if self.stream:
            t.write(STREAM)
        else:
            t.write(NONSTREAM)
        if not self.parser.should_keep_alive():
            t.close()

    def _paced(self, t: asyncio.Transport, i: int) -> None:
        if t.is_closing():
            return
        if i == EVENTS:
            t.write(STREAM_END)
            if not self.parser.should_keep_alive():
                t.close()
            return
        t.write(STREAM_CHUNKS[i])
        asyncio.get_running_loop().call_later(self.gap, self._paced, t, i + 1)


def main() -> None:
    ap = argparse.ArgumentParser(description="the benchmark gate's backend")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--event-gap-ms", type=float, default=0.0,
                    help="write a stream one event per write, this far apart (0: one write)")
    args = ap.parse_args()
    _Conn.gap = max(0.0, args.event_gap_ms) / 1000.0
    import uvloop

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(_Conn, args.host, args.port, backlog=1024)
        async with server:
            await server.serve_forever()

    uvloop.run(serve())


if __name__ == "__main__":
    main()
