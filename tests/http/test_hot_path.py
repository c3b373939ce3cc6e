"""The hot path's fewer sends and fewer timers, checked for behaviour: held heads still leave (never
held across a wait, still sent by abort()), writelines() frames pieces as one chunk, relay() hands
one upstream read to the client in one call, cancel_on_disconnect() cancels the handler, and the
upstream's lazy per-connection timer still enforces deadlines on reused connections."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from flexinfer.http.client import UpstreamPool, UpstreamTimeout
from flexinfer.http.protocol import Request, ResponseWriter
from flexinfer.http.upstream import serialize_request
from flexinfer.settings import UpstreamSettings
from tests.http._support import (
    HOST,
    BackendConn,
    RawBackend,
    RecordingHandler,
    exchange,
    parse_responses,
    read_request,
    serve,
    until,
)

CLOSE = b"GET /x HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"


class _Counting:
    """Wraps a transport; records what each write/writelines call handed over. :meth:`install` puts
    it in a writer's way: its transport, and the connection's bound ``flow.write`` the writer sends
    through (the connection's later writers then count into this one's list too, until they
    install their own)."""

    def __init__(self, transport: Any) -> None:
        self._tr = transport
        self.calls: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.calls.append(bytes(data))
        self._tr.write(data)

    def writelines(self, parts: Any) -> None:
        parts = list(parts)
        self.calls.append(b"".join(parts))
        self._tr.writelines(parts)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tr, name)

    @classmethod
    def install(cls, resp: ResponseWriter) -> _Counting:
        counting = cls(resp._transport)
        resp._transport = counting  # type: ignore[assignment]
        resp.flow.write = counting.write
        return counting


class _Handler(RecordingHandler):
    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[str, list[bytes]] = {}
        self.events: list[str] = []
        self.release = asyncio.Event()

    async def handle(self, req: Request, resp: ResponseWriter) -> None:
        counting = _Counting.install(resp)
        self.calls[req.path] = counting.calls
        path = req.path
        if path == "/lines":
            resp.start(200, [(b"content-type", b"text/event-stream")])
            resp.writelines([b"data: 1\n\n", b"data: 2\n\n"])
            resp.writelines([b"data: 3\n\n"], end=True)
        elif path == "/lines-cl":
            resp.start(200, [], content_length=6)
            try:
                resp.writelines([b"abcd", b"efg"])
            except ValueError:
                self.events.append("too-long")
            resp.writelines([b"abc", b"def"], end=True)
        elif path == "/held":
            resp.start(200, [(b"content-type", b"text/event-stream")])
            await self.release.wait()
            resp.write(b"data: late\n\n")
            resp.end()
        elif path == "/abort":
            resp.start(200, [])
            resp.abort()
        elif path == "/cancel":
            resp.cancel_on_disconnect()
            resp.start(200, [])
            resp.write(b"x")
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.events.append("cancelled")
                raise
        else:
            await super().handle(req, resp)


async def test_writelines_one_chunk_per_call_and_end_in_the_same_send() -> None:
    handler = _Handler()
    async with serve(handler) as server:
        ex = await exchange(server.port, b"GET /lines HTTP/1.1\r\nHost: a\r\n\r\n" + CLOSE)
    first, second = parse_responses(ex.data)
    assert first.complete and first.body == b"data: 1\n\ndata: 2\n\ndata: 3\n\n"
    assert second.status == 200 and second.complete  # keep-alive went on
    calls = handler.calls["/lines"]
    assert len(calls) == 2
    assert calls[0].startswith(b"HTTP/1.1 200 OK\r\n") and calls[0].endswith(b"\r\n\r\n12\r\ndata: 1\n\ndata: 2\n\n\r\n")  # 0x12 = 18
    assert calls[1] == b"9\r\ndata: 3\n\n\r\n0\r\n\r\n"


async def test_writelines_content_length_checked_and_sent_with_the_head() -> None:
    handler = _Handler()
    async with serve(handler) as server:
        ex = await exchange(server.port, b"GET /lines-cl HTTP/1.1\r\nHost: a\r\n\r\n" + CLOSE)
    first, second = parse_responses(ex.data)
    assert first.body == b"abcdef" and first.header(b"content-length") == b"6"
    assert second.status == 200
    assert handler.events == ["too-long"]
    assert len(handler.calls["/lines-cl"]) == 1


async def test_streamed_head_is_not_held_across_a_wait() -> None:
    handler = _Handler()
    async with serve(handler) as server:
        reader, writer = await asyncio.open_connection(HOST, server.port)
        writer.write(b"GET /held HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)  # while the handler waits
        assert head.startswith(b"HTTP/1.1 200 OK\r\n") and b"transfer-encoding: chunked" in head
        handler.release.set()
        rest = await asyncio.wait_for(reader.read(), 5.0)
        assert rest == b"c\r\ndata: late\n\n\r\n0\r\n\r\n"
        writer.close()


async def test_abort_still_sends_a_streamed_head() -> None:
    handler = _Handler()
    async with serve(handler) as server:
        ex = await exchange(server.port, b"GET /abort HTTP/1.1\r\nHost: a\r\n\r\n")
    assert ex.eof
    (resp,) = parse_responses(ex.data)
    assert resp.status == 200 and not resp.complete
    assert not ex.data.endswith(b"0\r\n\r\n")


async def test_cancel_on_disconnect_cancels_the_handler() -> None:
    handler = _Handler()
    async with serve(handler) as server:
        reader, writer = await asyncio.open_connection(HOST, server.port)
        writer.write(b"GET /cancel HTTP/1.1\r\nHost: a\r\n\r\n")
        await asyncio.wait_for(reader.readuntil(b"1\r\nx\r\n"), 5.0)
        writer.transport.abort()
        assert await until(lambda: handler.events == ["cancelled"], 5.0), handler.events


# ---- relay: one client send per upstream read -------------------------------------------------

_EVENTS = [b"data: %d\n\n" % i for i in range(5)]
_CHUNKED_HEAD = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/event-stream\r\n\r\n"
_CHUNKS = b"".join(b"%x\r\n%b\r\n" % (len(e), e) for e in _EVENTS) + b"0\r\n\r\n"


def _relaying(pool: UpstreamPool) -> _Handler:
    handler = _Handler()

    async def forward(req: Request, resp: ResponseWriter) -> None:
        up = await pool.request("GET", "/", [], b"")
        resp.start(up.status, [(b"content-type", b"text/event-stream")], up.content_length)
        handler.events.append(f"done:{await up.relay(resp)}")

    handler.upstream = forward
    return handler


async def test_relay_sends_a_whole_buffered_response_in_one_call() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: BackendConn) -> None:
        await read_request(reader)
        writer.write(_CHUNKED_HEAD + _CHUNKS)  # one send: head, every event and the end
        await reader.read()

    async with RawBackend(script) as backend:
        pool = UpstreamPool(HOST, backend.port, UpstreamSettings())
        handler = _relaying(pool)
        async with serve(handler) as server:
            ex = await exchange(server.port, b"GET /proxy HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        await pool.close()
    (resp,) = parse_responses(ex.data)
    assert resp.complete and resp.body == b"".join(_EVENTS)
    assert handler.events == [f"done:{sum(map(len, _EVENTS))}"]
    calls = handler.calls["/proxy"]
    assert len(calls) == 1 and calls[0].startswith(b"HTTP/1.1 200 OK\r\n")
    assert calls[0].endswith(b"\r\n\r\n%x\r\n%b\r\n0\r\n\r\n" % (sum(map(len, _EVENTS)), b"".join(_EVENTS)))


async def test_relay_one_call_per_upstream_read() -> None:
    head_seen = asyncio.Event()

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: BackendConn) -> None:
        await read_request(reader)
        writer.write(_CHUNKED_HEAD)
        await head_seen.wait()  # the client has the head: the events are a later read
        writer.write(_CHUNKS)
        await reader.read()

    async with RawBackend(script) as backend:
        pool = UpstreamPool(HOST, backend.port, UpstreamSettings())
        handler = _relaying(pool)
        async with serve(handler) as server:
            reader, writer = await asyncio.open_connection(HOST, server.port)
            writer.write(b"GET /proxy HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)
            head_seen.set()
            body = await asyncio.wait_for(reader.read(), 5.0)
            writer.close()
        await pool.close()
    joined = b"".join(_EVENTS)
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    assert body == b"%x\r\n%b\r\n0\r\n\r\n" % (len(joined), joined)
    calls = handler.calls["/proxy"]
    assert calls == [head, body]


# ---- the upstream's lazy timer -----------------------------------------------------------------

def _ok(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body)


async def test_response_timeout_on_a_reused_connection() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: BackendConn) -> None:
        await read_request(reader)
        writer.write(_ok(b"first"))
        await read_request(reader)
        await reader.read()  # never answers the second request

    async with RawBackend(script) as backend:
        pool = UpstreamPool(HOST, backend.port, UpstreamSettings(response_timeout=30.0))
        assert await (await pool.request("GET", "/", [], b"")).read_all(100) == b"first"
        assert pool.idle == 1
        t0 = time.monotonic()
        with pytest.raises(UpstreamTimeout) as ei:
            await pool.request("GET", "/", [], b"", response_timeout=0.3)
        assert ei.value.reason == "response_timeout"
        assert 0.25 <= time.monotonic() - t0 < 5.0
        assert len(backend.conns) == 1  # the reused connection timed out
        await pool.close()


async def test_a_timer_firing_on_an_idle_pooled_connection_does_nothing() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: BackendConn) -> None:
        for body in (b"one", b"two"):
            await read_request(reader)
            writer.write(_ok(body))
        await reader.read()

    async with RawBackend(script) as backend:
        pool = UpstreamPool(HOST, backend.port, UpstreamSettings(response_timeout=0.1, pool_idle_timeout=30.0))
        assert await (await pool.request("GET", "/", [], b"")).read_all(100) == b"one"
        await asyncio.sleep(0.3)  # the first exchange's deadline passes while the connection is idle
        assert await (await pool.request("GET", "/", [], b"")).read_all(100) == b"two"
        assert len(backend.conns) == 1
        await pool.close()


async def test_stream_idle_timeout_on_a_reused_connection() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: BackendConn) -> None:
        await read_request(reader)
        writer.write(_ok(b"first"))
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nabc")
        await reader.read()  # then silence

    async with RawBackend(script) as backend:
        pool = UpstreamPool(HOST, backend.port, UpstreamSettings(response_timeout=30.0, stream_idle_timeout=0.3))
        assert await (await pool.request("GET", "/", [], b"")).read_all(100) == b"first"
        resp = await pool.request("GET", "/", [], b"")
        assert await resp.read() == b"abc"
        t0 = time.monotonic()
        with pytest.raises(UpstreamTimeout) as ei:
            await resp.read()
        assert ei.value.reason == "idle_timeout"
        assert 0.15 <= time.monotonic() - t0 < 5.0
        assert len(backend.conns) == 1
        await pool.close()


# ---- serialization caches keep the rules -------------------------------------------------------

def test_serialize_connection_named_headers_and_invalid_names() -> None:
    host = b"host: up\r\n"
    for _ in range(2):  # the second round runs on the remembered names
        head = serialize_request("GET", "/a", [(b"Connection", b"X-Hop, bad name"), (b"x-hop", b"1"),
                                               (b"bad name", b"2"), (b"X-Keep", b"3")], b"", host)
        assert head == b"GET /a HTTP/1.1\r\nx-keep: 3\r\nhost: up\r\n\r\n"
        with pytest.raises(ValueError):
            serialize_request("GET", "/a", [(b"bad name", b"2")], b"", host)
        with pytest.raises(ValueError):
            serialize_request("GET", "/a", [(b"x-ok", b"a\r\nx-evil: 1")], b"", host)
        with pytest.raises(ValueError):
            serialize_request("GE T", "/a", [], b"", host)
        with pytest.raises(ValueError):
            serialize_request("GET", "/a b", [], b"", host)


# ---- when_complete: the caller's bookkeeping runs before the client has the last byte -----------

def _completing(pool: UpstreamPool) -> _Handler:
    handler = _Handler()

    async def forward(req: Request, resp: ResponseWriter) -> None:
        up = await pool.request("GET", "/", [], b"")
        resp.start(up.status, [(b"content-type", b"text/event-stream")], up.content_length)
        up.when_complete(lambda tag: handler.events.append(f"{tag}:finished={resp.finished}"), "complete")
        try:
            await up.relay(resp)
        except Exception as exc:  # the test records what the relay raised
            handler.events.append(type(exc).__name__)
            resp.abort()
        handler.events.append(f"notified={up.complete_notified}")

    handler.upstream = forward
    return handler


@pytest.mark.parametrize("split", [False, True])
async def test_when_complete_runs_once_before_the_last_write(split: bool) -> None:
    head_seen = asyncio.Event()

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: BackendConn) -> None:
        await read_request(reader)
        if split:  # the body arrives in a later read, while relay() runs
            writer.write(_CHUNKED_HEAD)
            await head_seen.wait()
            writer.write(_CHUNKS)
        else:  # the whole answer in one read: complete before when_complete() is called
            writer.write(_CHUNKED_HEAD + _CHUNKS)
        await reader.read()

    async with RawBackend(script) as backend:
        pool = UpstreamPool(HOST, backend.port, UpstreamSettings())
        handler = _completing(pool)
        async with serve(handler) as server:
            reader, writer = await asyncio.open_connection(HOST, server.port)
            writer.write(b"GET /proxy HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
            await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)
            head_seen.set()
            rest = await asyncio.wait_for(reader.read(), 5.0)
            writer.close()
        await pool.close()
    assert rest.endswith(b"0\r\n\r\n")
    assert handler.events == ["complete:finished=False", "notified=True"]


async def test_when_complete_not_called_when_the_body_fails() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: BackendConn) -> None:
        await read_request(reader)
        writer.write(_CHUNKED_HEAD + b"9\r\ndata: 0\n\n\r\n")
        await writer.drain()
        writer.close()  # dies mid-body

    async with RawBackend(script) as backend:
        pool = UpstreamPool(HOST, backend.port, UpstreamSettings())
        handler = _completing(pool)
        async with serve(handler) as server:
            await exchange(server.port, b"GET /proxy HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        await pool.close()
    assert handler.events[-1] == "notified=False"
    assert not any(e.startswith("complete:") for e in handler.events), handler.events
