"""The relay started from the upstream head callback (``UpstreamPool.request(on_head=...)`` +
``UpstreamResponse.start_relay``): the client gets the head and the first body bytes from the
upstream read that carried them, before the task awaiting the head resumes; a failing callback
fails the exchange and the connection is not reused; a finished stream's connection is reused."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from flexinfer.http.client import UpstreamPool, UpstreamResponse
from flexinfer.http.protocol import Request, ResponseWriter
from flexinfer.http.upstream import BodyTap
from flexinfer.settings import UpstreamSettings
from tests.http._support import HOST, BackendConn, RawBackend, RecordingHandler, read_request, serve

FAST = UpstreamSettings(connect_timeout=1.0, response_timeout=2.0, stream_idle_timeout=2.0,
                        pool_idle_timeout=5.0)
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def _event(i: int) -> bytes:
    ev = b"data: %d\n\n" % i
    return b"%x\r\n%b\r\n" % (len(ev), ev)


def _relaying_handler(pool: UpstreamPool, head: Callable[[UpstreamResponse, ResponseWriter], None],
                      then: Callable[[UpstreamResponse, ResponseWriter], Awaitable[None]]) -> RecordingHandler:
    """A handler that answers from the upstream head callback, as the forwarder does: ``head``
    starts the response, the relay starts there, and ``then`` runs once the exchange returns."""
    handler = RecordingHandler()

    async def forward(req: Request, resp: ResponseWriter) -> None:
        def on_head(up: UpstreamResponse) -> None:
            head(up, resp)
            assert up.start_relay(resp)

        await then(await pool.request("GET", "/", [], b"", on_head=on_head), resp)

    handler.upstream = forward
    return handler


def _early_handler(pool: UpstreamPool, order: list[str], results: list[int]) -> RecordingHandler:
    def head(up: UpstreamResponse, resp: ResponseWriter) -> None:
        resp.start(up.status, [(b"content-type", b"text/event-stream")], up.content_length)
        order.append("head")

    async def then(up: UpstreamResponse, resp: ResponseWriter) -> None:
        order.append(f"resumed after {up._relayed} bytes relayed")  # to the client writer, from the head's read
        results.append(await up.relay(resp))

    return _relaying_handler(pool, head, then)


async def test_first_event_leaves_before_the_task_resumes() -> None:
    release = asyncio.Event()

    async def sse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: BackendConn) -> None:
        while True:
            await read_request(reader)
            writer.write(HEAD + _event(0))  # the head and the first event in one write (one read)
            await release.wait()
            release.clear()
            writer.write(_event(1) + b"0\r\n\r\n")

    order: list[str] = []
    results: list[int] = []
    async with RawBackend(sse) as backend:
        pool = UpstreamPool(HOST, backend.port, FAST)
        async with serve(_early_handler(pool, order, results)) as server:
            reader, writer = await asyncio.open_connection(HOST, server.port)
            for _ in range(2):  # the second request reuses the connection of the finished stream
                writer.write(b"GET /proxy HTTP/1.1\r\nHost: a\r\n\r\n")
                await reader.readuntil(b"data: 0\n\n")  # while the backend holds the rest back
                assert order[:2] == ["head", "resumed after 9 bytes relayed"], order  # b"data: 0\n\n"
                release.set()
                await reader.readuntil(b"0\r\n\r\n")
                order.clear()
            writer.close()
        assert len(backend.conns) == 1
        assert results == [len(b"data: 0\n\ndata: 1\n\n")] * 2
        await pool.close()


async def test_a_failing_head_callback_fails_the_exchange_and_closes_the_connection() -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: BackendConn) -> None:
        while True:
            await read_request(reader)
            writer.write(HEAD + _event(0) + b"0\r\n\r\n")

    def boom(up: UpstreamResponse) -> None:
        raise LookupError("the caller's own failure")

    async with RawBackend(answer) as backend:
        pool = UpstreamPool(HOST, backend.port, FAST)
        with pytest.raises(LookupError):
            await pool.request("GET", "/", [], b"", on_head=boom)
        assert pool.active == 0 and pool.idle == 0  # never reused
        up = await pool.request("GET", "/", [], b"")  # the pool goes on, on a new connection
        assert await up.read_all(1 << 16) == b"data: 0\n\n"
        assert len(backend.conns) == 2
        await pool.close()


def _answers(*responses: bytes) -> Any:
    """A backend that answers its connection's requests with ``responses``, in order, then stops."""
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: BackendConn) -> None:
        for raw in responses:
            await read_request(reader)
            writer.write(raw)

    return answer


class _Proto:  # a writer's connection that is never used: the writer is only started
    draining = False
    transport = None
    flow = None


async def test_start_relay_refuses_a_response_that_is_not_fresh() -> None:
    got: list[Any] = []
    async with RawBackend(_answers(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")) as backend:
        pool = UpstreamPool(HOST, backend.port, FAST)
        up = await pool.request("GET", "/", [], b"")
        got.append(await up.read_all(16))

        writer = ResponseWriter(_Proto(), Request("GET", b"/", "/", "", "1.1", [], True, "127.0.0.1:1", b""))
        writer.started = True  # never written to: start_relay must refuse before using it
        assert not up.start_relay(writer)
        assert got == [b"ok"]
        await pool.close()


def _done_handler(pool: UpstreamPool, declared: int | None, got: list[Any]) -> RecordingHandler:
    """A handler that starts the relay at the head, then ends it with relay_done where it can,
    else with relay (what the forwarder does); ``got``: (relay_done's answer, relay's or the error)."""
    def head(up: UpstreamResponse, resp: ResponseWriter) -> None:
        resp.start(up.status, [], declared if declared is not None else up.content_length)

    async def then(up: UpstreamResponse, resp: ResponseWriter) -> None:
        try:
            n = up.relay_done(resp)
        except ValueError as exc:
            got.append(("raised", str(exc), resp.finished))
            resp.abort()
            return
        got.append((n, resp.finished))
        if n < 0:
            got.append(await up.relay(resp))

    return _relaying_handler(pool, head, then)


async def test_relay_done_ends_a_body_that_came_with_its_head() -> None:
    release = asyncio.Event()

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: BackendConn) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")  # whole: one read
        await read_request(reader)
        writer.write(HEAD + _event(0))  # the rest waits: relay_done must leave it to relay()
        await release.wait()
        writer.write(_event(1) + b"0\r\n\r\n")

    got: list[Any] = []
    async with RawBackend(answer) as backend:
        pool = UpstreamPool(HOST, backend.port, FAST)
        async with serve(_done_handler(pool, None, got)) as server:
            reader, writer = await asyncio.open_connection(HOST, server.port)
            writer.write(b"GET /proxy HTTP/1.1\r\nHost: a\r\n\r\n")
            head = await reader.readuntil(b"\r\n\r\n")
            assert b"content-length: 5" in head.lower()
            assert await reader.readexactly(5) == b"hello"
            assert got == [(5, True)]  # relayed at the head, ended without a wait
            writer.write(b"GET /proxy HTTP/1.1\r\nHost: a\r\n\r\n")
            await reader.readuntil(b"data: 0\n\n")
            release.set()
            await reader.readuntil(b"0\r\n\r\n")
            writer.close()
        assert got[1:] == [(-1, False), len(b"data: 0\n\ndata: 1\n\n")]  # not done: relay() waited
        assert len(backend.conns) == 1  # both exchanges on one pooled connection
        await pool.close()


async def test_relay_done_raises_what_the_writer_refused() -> None:
    got: list[Any] = []
    async with RawBackend(_answers(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")) as backend:
        pool = UpstreamPool(HOST, backend.port, FAST)
        async with serve(_done_handler(pool, 3, got)) as server:  # the client was promised 3 bytes
            reader, writer = await asyncio.open_connection(HOST, server.port)
            writer.write(b"GET /proxy HTTP/1.1\r\nHost: a\r\n\r\n")
            await reader.read()  # the connection is aborted: no more than the head and what fit
            writer.close()
        assert got == [("raised", "body longer than the declared Content-Length", False)]
        await pool.close()


async def test_a_body_tap_sees_each_read_and_may_replace_its_pieces() -> None:
    release = asyncio.Event()

    async def sse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: BackendConn) -> None:
        await read_request(reader)
        writer.write(HEAD + _event(0))
        await release.wait()
        writer.write(_event(1) + b"0\r\n\r\n")

    class Upper(BodyTap):  # a Python subclass: the build calls its override through the C method
        def __init__(self) -> None:
            self.seen: list[tuple[bytes, bool]] = []

        def observe(self, buf: bytes, end: bool) -> list[bytes] | None:
            self.seen.append((buf, end))
            return [buf.upper()]

    tap = Upper()

    def head(up: UpstreamResponse, resp: ResponseWriter) -> None:
        up.tap = tap
        resp.start(up.status, [], None)

    async def then(up: UpstreamResponse, resp: ResponseWriter) -> None:
        await up.relay(resp)

    assert BodyTap().observe(b"x", False) is None  # the base observes nothing
    async with RawBackend(sse) as backend:
        pool = UpstreamPool(HOST, backend.port, FAST)
        async with serve(_relaying_handler(pool, head, then)) as server:
            reader, writer = await asyncio.open_connection(HOST, server.port)
            writer.write(b"GET /proxy HTTP/1.1\r\nHost: a\r\n\r\n")
            await reader.readuntil(b"DATA: 0\n\n")
            release.set()
            await reader.readuntil(b"DATA: 1\n\n")
            await reader.readuntil(b"0\r\n\r\n")
            writer.close()
        assert tap.seen == [(b"data: 0\n\n", False), (b"data: 1\n\n", True)]
        await pool.close()


class _Ends(BodyTap):
    """A tap that records, each time it is told the body is complete, what had been relayed to the
    client writer then (bytes) and whether the client's response had ended."""

    def __init__(self, resp: list[ResponseWriter]) -> None:
        self.resp = resp
        self.up: UpstreamResponse | None = None
        self.ends: list[tuple[int, bool]] = []

    def complete(self) -> None:
        assert self.up is not None
        self.ends.append((self.up._relayed, self.resp[0].finished))


@pytest.mark.parametrize(("name", "answer", "seen", "expected", "body"), [
    # the last event and the terminating chunk in one read: told before that read's write
    ("one read", [HEAD + _event(0), _event(1) + b"0\r\n\r\n"], [b"data: 0\n\n"], 9, b"data: 0\n\ndata: 1\n\n"),
    # the terminating chunk alone in the last read: told before the write that ends the response
    ("end alone", [HEAD + _event(0), _event(1), b"0\r\n\r\n"], [b"data: 0\n\n", b"data: 1\n\n"], 18,
     b"data: 0\n\ndata: 1\n\n"),
    # a Content-Length body that came with its head (relay_done): told before its one write
    ("with head", [b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"], [], 0, b"hello"),
])
async def test_the_tap_is_told_the_body_is_complete_before_the_last_write(
        name: str, answer: list[bytes], seen: list[bytes], expected: int, body: bytes) -> None:
    chunked = b"chunked" in answer[0]
    relayed = asyncio.Event()  # the client has what the backend wrote last: its next write is a read of its own

    async def backend_side(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: BackendConn) -> None:
        await read_request(reader)
        for i, raw in enumerate(answer):
            if i:
                await relayed.wait()
                relayed.clear()
            writer.write(raw)

    resps: list[ResponseWriter] = []
    tap = _Ends(resps)

    def head(up: UpstreamResponse, resp: ResponseWriter) -> None:
        tap.up = up
        up.tap = tap
        resps.append(resp)
        resp.start(up.status, [], up.content_length)

    async def then(up: UpstreamResponse, resp: ResponseWriter) -> None:
        if up.relay_done(resp) < 0:
            await up.relay(resp)

    async with RawBackend(backend_side) as backend:
        pool = UpstreamPool(HOST, backend.port, FAST)
        async with serve(_relaying_handler(pool, head, then)) as server:
            reader, writer = await asyncio.open_connection(HOST, server.port)
            writer.write(b"GET /proxy HTTP/1.1\r\nHost: a\r\n\r\n")
            raw = b""
            for marker in seen:
                raw += await asyncio.wait_for(reader.readuntil(marker), 5)
                relayed.set()
            raw += await asyncio.wait_for(reader.readuntil(b"0\r\n\r\n" if chunked else body), 5)
            writer.close()
        assert raw.replace(b"9\r\n", b"").replace(b"\r\n", b"").endswith(body + (b"0" if chunked else b""))
        assert tap.ends, f"{name}: the tap was never told"
        assert tap.ends[0] == (expected, False), (name, tap.ends)
        await pool.close()


async def test_a_failing_body_never_tells_the_tap_it_is_complete() -> None:
    async def backend_side(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: BackendConn) -> None:
        await read_request(reader)
        writer.write(HEAD + _event(0))
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.transport.abort()  # gone mid-body

    resps: list[ResponseWriter] = []
    tap = _Ends(resps)
    failed: list[BaseException] = []

    def head(up: UpstreamResponse, resp: ResponseWriter) -> None:
        tap.up = up
        up.tap = tap
        resps.append(resp)
        resp.start(up.status, [], None)

    async def then(up: UpstreamResponse, resp: ResponseWriter) -> None:
        try:
            await up.relay(resp)
        except Exception as exc:
            failed.append(exc)
            resp.abort()

    async with RawBackend(backend_side) as backend:
        pool = UpstreamPool(HOST, backend.port, FAST)
        async with serve(_relaying_handler(pool, head, then)) as server:
            reader, writer = await asyncio.open_connection(HOST, server.port)
            writer.write(b"GET /proxy HTTP/1.1\r\nHost: a\r\n\r\n")
            await reader.read()
            writer.close()
        assert failed and tap.ends == []
        await pool.close()


async def test_a_last_read_without_body_bytes_ends_the_client_response_in_that_read() -> None:
    """llama-cpp-python's server (uvicorn) writes a stream's last chunk alone:
    the client's response ends in the read that brought it, not when the handler's task gets to
    it. Here the task waits until the client has the end, so only the read can have written it."""
    client_has_last_event = asyncio.Event()

    async def backend_side(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: BackendConn) -> None:
        await read_request(reader)
        writer.write(HEAD + _event(0) + _event(1))
        await client_has_last_event.wait()  # so the last chunk is a read of its own at the proxy
        writer.write(b"0\r\n\r\n")

    client_has_end = asyncio.Event()
    results: list[int] = []

    def head(up: UpstreamResponse, resp: ResponseWriter) -> None:
        resp.start(up.status, [], up.content_length)

    async def then(up: UpstreamResponse, resp: ResponseWriter) -> None:
        await client_has_end.wait()
        results.append(await up.relay(resp))  # the body is all in and the response ended: no wait

    async with RawBackend(backend_side) as backend:
        pool = UpstreamPool(HOST, backend.port, FAST)
        async with serve(_relaying_handler(pool, head, then)) as server:
            reader, writer = await asyncio.open_connection(HOST, server.port)
            try:
                writer.write(b"GET /proxy HTTP/1.1\r\nHost: a\r\n\r\n")
                raw = await asyncio.wait_for(reader.readuntil(b"data: 1\n\n"), 5)
                client_has_last_event.set()
                raw += await asyncio.wait_for(reader.readuntil(b"0\r\n\r\n"), 5)
                assert raw.endswith(b"data: 0\n\ndata: 1\n\n\r\n0\r\n\r\n")
                client_has_end.set()
                for _ in range(100):
                    if results:
                        break
                    await asyncio.sleep(0.01)
            finally:  # (a failure here lets the handler and the backend finish too)
                client_has_last_event.set()
                client_has_end.set()
                writer.close()
        assert results == [len(b"data: 0\n\ndata: 1\n\n")]
        await pool.close()
