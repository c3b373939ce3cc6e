"""Upstream side of flexinfer.http: pool reuse and non-reuse, timeouts, faults, malformed responses,
the keep-alive race retry, canonical serialization (h11 as the oracle) and relay()."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import struct
import time
from typing import Any

import h11
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flexinfer.http.client import (
    HOP_BY_HOP,
    Pools,
    UpstreamConnectError,
    UpstreamError,
    UpstreamPool,
    UpstreamTimeout,
    serialize_request,
)
from flexinfer.http.protocol import ClientGone, Request, ResponseWriter
from flexinfer.settings import UpstreamSettings
from tests.http._support import (
    FAST_UPSTREAM,
    HOST,
    BackendConn,
    RawBackend,
    RecordingHandler,
    free_port,
    parse_responses,
    read_request,
    serve,
    until,
)


def ok_response(body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%b\r\n%b" % (len(body), extra, body)


async def echo_script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: BackendConn) -> None:
    while True:
        _head, body = await read_request(reader)
        writer.write(ok_response(b"echo:" + body))
        await writer.drain()


# ---- pool basics ------------------------------------------------------------------------------

async def test_reuse_keepalive_connection() -> None:
    async with RawBackend(echo_script) as backend:
        pool = UpstreamPool(HOST, backend.port, FAST_UPSTREAM)
        for i in range(3):
            resp = await pool.request("POST", "/v1/x", [(b"content-type", b"application/json")], b"%d" % i)
            assert resp.status == 200
            assert await resp.read_all(1000) == b"echo:%d" % i
        assert len(backend.conns) == 1
        assert pool.idle == 1 and pool.active == 0
        await pool.close()


async def test_cancelled_while_waiting_for_the_head_closes_the_connection() -> None:
    """A caller cancelled before the head is in: the connection is aborted (the backend sees it go)
    and never pooled; the next request gets a new connection."""
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: BackendConn) -> None:
        await read_request(reader)
        if conn.index == 0:
            await reader.read()  # never answers; returns when the proxy side goes away
            return
        writer.write(ok_response(b"second"))
        await writer.drain()
        await read_request(reader)

    async with RawBackend(script) as backend:
        pool = UpstreamPool(HOST, backend.port, FAST_UPSTREAM)
        task = asyncio.ensure_future(pool.request("GET", "/slow", [], b""))
        await until(lambda: len(backend.conns) == 1 and b"/slow" in backend.conns[0].captured)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.wait_for(backend.conns[0].closed.wait(), 2.0)
        assert pool.idle == 0 and pool.active == 0
        resp = await pool.request("GET", "/next", [], b"")
        assert await resp.read_all(100) == b"second"
        assert len(backend.conns) == 2
        await pool.close()


async def test_read_pieces_and_end() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: BackendConn) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-Up: 1\r\n\r\n3\r\nabc\r\n")
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(b"2\r\nde\r\n0\r\n\r\n")
        await writer.drain()
        await read_request(reader)

    async with RawBackend(script) as backend:
        pool = UpstreamPool(HOST, backend.port, FAST_UPSTREAM)
        resp = await pool.request("GET", "/", [], b"")
        assert resp.chunked and resp.content_length is None
        assert (b"x-up", b"1") in resp.headers
        assert await resp.read() == b"abc"
        assert await resp.read() == b"de"
        assert await resp.read() == b""
        assert pool.idle == 1
        await pool.close()


async def test_interim_1xx_skipped_close_delimited_and_204() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: BackendConn) -> None:
        await read_request(reader)
        if conn.index == 0:
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
                         b"HTTP/1.1 204 No Content\r\n\r\n")
            await writer.drain()
            await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\n\r\nuntil-eof")
        await writer.drain()
        writer.close()

    async with RawBackend(script) as backend:
        pool = UpstreamPool(HOST, backend.port, FAST_UPSTREAM)
        resp = await pool.request("GET", "/", [], b"")
        assert resp.status == 204 and await resp.read_all(10) == b""
        resp = await pool.request("GET", "/", [], b"")
        assert resp.status == 200 and resp.content_length is None and not resp.chunked
        assert await resp.read_all(100) == b"until-eof"
        assert pool.idle == 0  # a close-delimited response never returns its connection
        await pool.close()


async def test_connect_refused_not_sent() -> None:
    pool = UpstreamPool(HOST, free_port(), FAST_UPSTREAM)
    with pytest.raises(UpstreamConnectError) as ei:
        await pool.request("GET", "/", [], b"")
    assert ei.value.sent is False and ei.value.reason == "connect_refused"
    assert pool.active == 0 and pool.idle == 0


async def test_connect_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    loop = asyncio.get_running_loop()

    async def never(*a: object, **k: object) -> None:
        await asyncio.sleep(10)

    monkeypatch.setattr(loop, "create_connection", never)
    pool = UpstreamPool(HOST, 9, UpstreamSettings(connect_timeout=0.2))
    t0 = time.monotonic()
    with pytest.raises(UpstreamConnectError) as ei:
        await pool.request("GET", "/", [], b"")
    assert ei.value.reason == "connect_timeout" and ei.value.sent is False
    assert 0.15 <= time.monotonic() - t0 < 3.0  # vs the 10 s sleep


async def test_response_timeout() -> None:
    async def blackhole(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: BackendConn) -> None:
        await read_request(reader)
        await reader.read()  # never answers; returns when the client goes

    async with RawBackend(blackhole) as backend:
        pool = UpstreamPool(HOST, backend.port, FAST_UPSTREAM)
        t0 = time.monotonic()
        with pytest.raises(UpstreamTimeout) as ei:
            await pool.request("POST", "/", [], b"{}", response_timeout=0.3)
        assert ei.value.reason == "response_timeout" and ei.value.sent is True
        assert 0.25 <= time.monotonic() - t0 < 3.0  # the default is 300 s
        assert await until(lambda: backend.conns[0].closed.is_set(), 3.0)  # upstream socket closed
        assert len(backend.conns) == 1  # never retried
        assert pool.active == 0 and pool.idle == 0


async def test_stream_idle_timeout() -> None:
    async def stall(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: BackendConn) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nabc")
        await writer.drain()
        await reader.read()

    async with RawBackend(stall) as backend:
        pool = UpstreamPool(HOST, backend.port, UpstreamSettings(stream_idle_timeout=0.3))
        resp = await pool.request("GET", "/", [], b"")
        assert await resp.read() == b"abc"
        t0 = time.monotonic()
        with pytest.raises(UpstreamTimeout) as ei:
            await resp.read()
        assert ei.value.reason == "idle_timeout"
        assert 0.15 <= time.monotonic() - t0 < 3.0  # the default is 300 s
        assert pool.idle == 0 and pool.active == 0


@pytest.mark.parametrize("how", ["rst", "fin"])
async def test_mid_body_failure(how: str) -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: BackendConn) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial")
        await writer.drain()
        await asyncio.sleep(0.05)
        if how == "rst":
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort() if how == "rst" else writer.close()

    async with RawBackend(script) as backend:
        pool = UpstreamPool(HOST, backend.port, FAST_UPSTREAM)
        resp = await pool.request("GET", "/", [], b"")
        assert await resp.read() == b"partial"
        with pytest.raises(UpstreamError) as ei:
            await resp.read()
        assert ei.value.reason == ("reset" if how == "rst" else "closed")
        assert ei.value.sent is True
        assert pool.idle == 0 and pool.active == 0


async def test_no_reuse_after_error_or_abandoned_body() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: BackendConn) -> None:
        while True:
            head, _ = await read_request(reader)
            if b"/bad" in head:
                writer.write(b"HTTP/1.1 200 OK\r\nX-A: a\x00b\r\nContent-Length: 0\r\n\r\n")
            elif b"/big" in head:
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n" + b"x" * 10)
            else:
                writer.write(ok_response(b"fine"))
            await writer.drain()

    async with RawBackend(script) as backend:
        pool = UpstreamPool(HOST, backend.port, FAST_UPSTREAM)
        with pytest.raises(UpstreamError) as ei:
            await pool.request("GET", "/bad", [], b"")
        assert ei.value.reason == "protocol"
        resp = await pool.request("GET", "/ok", [], b"")
        assert await resp.read_all(100) == b"fine"
        resp = await pool.request("GET", "/big", [], b"")
        assert await resp.read() == b"x" * 10
        resp.close()  # unfinished body: that connection must die
        resp = await pool.request("GET", "/ok", [], b"")
        assert await resp.read_all(100) == b"fine"
        assert len(backend.conns) == 3
        assert pool.idle == 1 and pool.active == 0
        await pool.close()


MALFORMED = [
    ("garbage-status", b"HTXP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"),
    ("garbage-line", b"hello world\r\n\r\n"),
    ("bad-header-char", b"HTTP/1.1 200 OK\r\nX-A: a\x01b\r\nContent-Length: 0\r\n\r\n"),
    ("cl-te", b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
    ("two-cl", b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nhi"),
    ("negative-cl", b"HTTP/1.1 200 OK\r\nContent-Length: -2\r\n\r\nhi"),
    ("huge-head", b"HTTP/1.1 200 OK\r\n" + b"X-Pad: " + b"p" * 70000 + b"\r\nContent-Length: 0\r\n\r\n"),
    ("huge-head-many", b"HTTP/1.1 200 OK\r\n" + b"X-P: 0123456789\r\n" * 5000 + b"\r\n"),
    ("unrequested-101", b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n"),
    ("te-gzip", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nabc"),
]


@pytest.mark.parametrize(("name", "raw"), MALFORMED, ids=[m[0] for m in MALFORMED])
async def test_malformed_upstream_response_is_protocol_error(name: str, raw: bytes) -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: BackendConn) -> None:
        await read_request(reader)
        writer.write(raw)
        await writer.drain()
        await reader.read()

    async with RawBackend(script) as backend:
        pool = UpstreamPool(HOST, backend.port, FAST_UPSTREAM)
        with pytest.raises(UpstreamError) as ei:
            resp = await pool.request("GET", "/", [], b"")
            await resp.read_all(1 << 20)
        assert ei.value.reason == "protocol"
        assert pool.idle == 0 and pool.active == 0
        assert await until(lambda: backend.conns[0].closed.is_set(), 3.0)


async def test_extra_bytes_after_body_dropped_and_not_reused() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: BackendConn) -> None:
        await read_request(reader)
        writer.write(ok_response(b"hi") + b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\npoison")
        await writer.drain()
        await reader.read()

    async with RawBackend(script) as backend:
        pool = UpstreamPool(HOST, backend.port, FAST_UPSTREAM)
        resp = await pool.request("GET", "/", [], b"")
        assert await resp.read_all(100) == b"hi"
        assert pool.idle == 0
        resp = await pool.request("GET", "/", [], b"")
        assert await resp.read_all(100) == b"hi"  # a fresh connection, not the poisoned response
        assert len(backend.conns) == 2


# ---- keep-alive race: a reused connection that fails before any response byte ----------------
# Only GET/HEAD/OPTIONS are written again (once, on a fresh connection): any other request whose
# bytes were written may already run on the engine, so it fails with reason "not_replayed".

def _idle_out_on_second_request(answer: bytes) -> Any:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: BackendConn) -> None:
        await read_request(reader)
        writer.write(ok_response(answer))
        await writer.drain()
        if conn.index == 0:
            await read_request(reader)  # the reused request arrives... and the backend idles out
            return
        while True:
            await read_request(reader)
            writer.write(ok_response(b"again"))
            await writer.drain()
    return script


@pytest.mark.parametrize("method", ["GET", "OPTIONS"])  # (a HEAD exchange is never pooled: see _Conn)
async def test_keepalive_race_replays_a_safe_method_once_on_a_fresh_connection(method: str) -> None:
    async with RawBackend(_idle_out_on_second_request(b"first")) as backend:
        pool = UpstreamPool(HOST, backend.port, FAST_UPSTREAM)
        resp = await pool.request(method, "/", [], b"")
        await resp.read_all(100)
        resp = await pool.request(method, "/", [], b"")
        assert resp.status == 200
        assert len(backend.conns) == 2
        assert [_requests(c) for c in backend.conns] == [2, 1]


@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE"])
async def test_keepalive_race_never_writes_other_methods_twice(method: str) -> None:
    async with RawBackend(_idle_out_on_second_request(b"first")) as backend:
        pool = UpstreamPool(HOST, backend.port, FAST_UPSTREAM)
        resp = await pool.request(method, "/", [], b"x")
        assert await resp.read_all(100) == b"first"
        with pytest.raises(UpstreamError) as ei:
            await pool.request(method, "/", [], b"y")
        assert ei.value.reason == "not_replayed" and ei.value.sent is True
        assert len(backend.conns) == 1  # no second connection: the request was written once
        assert [_requests(c) for c in backend.conns] == [2]


def _requests(conn: BackendConn) -> int:
    return bytes(conn.captured).count(b" HTTP/1.1\r\n")


async def test_pooled_connection_with_pending_eof_is_not_reused() -> None:
    # A backend (in a thread, so that its FIN does not depend on our loop) answers, then closes the
    # idle connection. The FIN is in the kernel but the loop has not read it when the next request
    # takes the connection from the pool: the poll(2) check before reuse must catch it, so the POST
    # is written once, on a new connection, and never meets the dead one.
    import threading

    close_now = threading.Event()
    seen: list[bytes] = []
    srv = socket.create_server((HOST, 0))
    port = srv.getsockname()[1]

    def serve() -> None:
        for index in range(2):
            c, _ = srv.accept()
            buf = b""
            while not buf.endswith(b"x"):
                buf += c.recv(65536)
            seen.append(buf)
            c.sendall(ok_response(b"ok%d" % index))
            if index == 0:
                close_now.wait(5)
            else:
                c.recv(1)
            c.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        pool = UpstreamPool(HOST, port, dataclasses.replace(FAST_UPSTREAM, pool_check_after=0.0))
        resp = await pool.request("POST", "/", [], b"x")
        assert await resp.read_all(100) == b"ok0"
        conn = pool._idle[-1]
        assert not conn.pending_close()
        close_now.set()
        deadline = time.monotonic() + 3
        while not conn.pending_close() and time.monotonic() < deadline:
            time.sleep(0.001)  # blocks the loop on purpose: it must not read the FIN first
        assert conn.pending_close()
        resp = await pool.request("POST", "/", [], b"x")
        assert resp.status == 200 and await resp.read_all(100) == b"ok1"
        assert len(seen) == 2  # one POST per connection: none was written to the closed one
    finally:
        close_now.set()
        srv.close()
        t.join(5)


async def test_fresh_connection_failure_is_never_retried() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: BackendConn) -> None:
        await read_request(reader)  # reads the POST, then drops it without a byte of response

    async with RawBackend(script) as backend:
        pool = UpstreamPool(HOST, backend.port, FAST_UPSTREAM)
        with pytest.raises(UpstreamError) as ei:
            await pool.request("POST", "/", [], b"{}")
        assert ei.value.sent is True and ei.value.reason in ("closed", "reset")
        assert len(backend.conns) == 1


async def test_reused_then_fresh_failure_gives_up_after_one_retry() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: BackendConn) -> None:
        await read_request(reader)
        if conn.index == 0:
            writer.write(ok_response(b"first"))
            await writer.drain()
            await read_request(reader)

    async with RawBackend(script) as backend:
        pool = UpstreamPool(HOST, backend.port, FAST_UPSTREAM)
        resp = await pool.request("GET", "/", [], b"")
        await resp.read_all(100)
        with pytest.raises(UpstreamError) as ei:
            await pool.request("GET", "/", [], b"")
        assert ei.value.sent is True
        assert len(backend.conns) == 2  # the original and exactly one retry


async def test_partial_response_on_reused_connection_not_retried() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: BackendConn) -> None:
        await read_request(reader)
        writer.write(ok_response(b"first"))
        await writer.drain()
        await read_request(reader)
        writer.write(b"HTTP/1.1 20")
        await writer.drain()

    async with RawBackend(script) as backend:
        pool = UpstreamPool(HOST, backend.port, FAST_UPSTREAM)
        await (await pool.request("GET", "/", [], b"")).read_all(100)
        with pytest.raises(UpstreamError):
            await pool.request("GET", "/", [], b"")
        assert len(backend.conns) == 1


async def test_pool_idle_timeout_closes_and_does_not_reuse() -> None:
    async with RawBackend(echo_script) as backend:
        pool = UpstreamPool(HOST, backend.port, UpstreamSettings(pool_idle_timeout=0.2))
        await (await pool.request("GET", "/", [], b"")).read_all(100)
        assert pool.idle == 1
        assert await until(lambda: backend.conns[0].closed.is_set(), 3.0)  # swept, socket closed
        assert pool.idle == 0
        await (await pool.request("GET", "/", [], b"")).read_all(100)
        assert len(backend.conns) == 2
        await pool.close()


async def test_pool_max_idle_and_pools_registry() -> None:
    async def slow_echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: BackendConn) -> None:
        while True:
            await read_request(reader)
            await asyncio.sleep(0.05)
            writer.write(ok_response(b"slow"))
            await writer.drain()

    async with RawBackend(slow_echo) as backend:
        pools = Pools(UpstreamSettings(pool_max_idle=1))
        pool = pools.get(HOST, backend.port)
        assert pools.get(HOST, backend.port) is pool
        pending = [asyncio.ensure_future(pool.request("GET", "/", [], b"")) for _ in range(3)]
        await until(lambda: pool.active == 3)
        for resp in await asyncio.gather(*pending):
            assert await resp.read_all(100) == b"slow"
        assert len(backend.conns) == 3
        assert pool.active == 0 and pool.idle == 1  # only pool_max_idle are kept
        assert await until(lambda: sum(c.closed.is_set() for c in backend.conns) == 2)
        await pools.close_all()
        assert pool.idle == 0


async def test_read_all_limit() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: BackendConn) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b"x" * 100000)
        await writer.drain()
        await reader.read()

    async with RawBackend(script) as backend:
        pool = UpstreamPool(HOST, backend.port, FAST_UPSTREAM)
        resp = await pool.request("GET", "/", [], b"")
        with pytest.raises(UpstreamError):
            await resp.read_all(1000)


# ---- canonical serialization, h11 as the oracle ----------------------------------------------

def h11_parse(raw: bytes) -> tuple[h11.Request, bytes]:
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(raw)
    req = conn.next_event()
    assert isinstance(req, h11.Request)
    body = b""
    while True:
        ev = conn.next_event()
        if isinstance(ev, h11.Data):
            body += ev.data
        elif isinstance(ev, h11.EndOfMessage):
            return req, body
        else:
            raise AssertionError(f"unexpected h11 event {ev!r}")


def expected_headers(headers: list[tuple[bytes, bytes]], host: bytes, body: bytes, method: str,
                     ) -> list[tuple[bytes, bytes]]:
    named = {t.strip().lower() for n, v in headers if n.lower() == b"connection" for t in v.split(b",")}
    out = [(n.lower(), v) for n, v in headers
           if n.lower() not in HOP_BY_HOP and n.lower() not in (b"host", b"content-length", b"expect")
           and n.lower() not in named]
    out.append((b"host", host))
    if body or method not in ("GET", "HEAD", "DELETE", "OPTIONS"):
        out.append((b"content-length", b"%d" % len(body)))
    return out


async def test_wire_bytes_are_canonical_h11_oracle() -> None:
    async with RawBackend(echo_script) as backend:
        pool = UpstreamPool(HOST, backend.port, FAST_UPSTREAM)
        given_headers = [
            (b"Content-Type", b"application/json"), (b"connection", b"keep-alive, X-Secret"),
            (b"x-secret", b"hop"), (b"TE", b"trailers"), (b"Upgrade", b"h2c"), (b"keep-alive", b"300"),
            (b"transfer-encoding", b"chunked"), (b"proxy-connection", b"x"), (b"trailer", b"x"),
            (b"host", b"evil.example"), (b"content-length", b"999"), (b"expect", b"100-continue"),
            (b"authorization", b"Bearer abc"), (b"x-model-id", b"llama"),
        ]
        body = b'{"model":"llama"}'
        resp = await pool.request("POST", "/v1/chat/completions?x=1", given_headers, body)
        await resp.read_all(1000)
        req, got_body = h11_parse(bytes(backend.conns[0].captured))
        assert req.method == b"POST" and req.target == b"/v1/chat/completions?x=1"
        assert list(req.headers) == expected_headers(given_headers, b"%s:%d" % (HOST.encode(), backend.port),
                                                     body, "POST")
        assert got_body == body
        await pool.close()


async def test_server_to_client_forwarding_is_canonical() -> None:
    """A client request through the real server and the pool: the upstream sees canonical bytes."""
    async with RawBackend(echo_script) as backend:
        pool = UpstreamPool(HOST, backend.port, FAST_UPSTREAM)
        handler = RecordingHandler()

        async def forward(req: Request, resp: ResponseWriter) -> None:
            up = await pool.request(req.method, req.path, req.headers, req.body)
            resp.start(up.status, [], up.content_length)
            await up.relay(resp)

        handler.upstream = forward
        async with serve(handler) as server:
            from tests.http._support import exchange

            ex = await exchange(server.port, b"POST /proxy HTTP/1.1\r\nHost: front\r\nTransfer-Encoding: chunked\r\n"
                                             b"X-A:   spaced   \r\nConnection: close, X-Drop\r\nX-Drop: 1\r\n\r\n"
                                             b"3\r\nabc\r\n0\r\n\r\n")
            assert [r.body for r in parse_responses(ex.data)] == [b"echo:abc"]
        req, body = h11_parse(bytes(backend.conns[0].captured))
        assert body == b"abc"
        assert list(req.headers) == [(b"x-a", b"spaced"), (b"host", b"%s:%d" % (HOST.encode(), backend.port)),
                                     (b"content-length", b"3")]
        await pool.close()


_TCHAR = "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
_names = st.one_of(
    st.text(_TCHAR, min_size=1, max_size=20).map(str.encode),
    st.sampled_from([b"Connection", b"TE", b"Upgrade", b"Host", b"Content-Length", b"Transfer-Encoding",
                     b"Keep-Alive", b"Expect", b"Trailer", b"Proxy-Connection"]),
)
_values = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=30).map(str.encode)


@settings(max_examples=150, deadline=None)
@given(headers=st.lists(st.tuples(_names, _values), max_size=12),
       body=st.binary(max_size=64), method=st.sampled_from(["GET", "POST", "PUT", "DELETE"]),
       path=st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=30))
def test_serialize_property_h11(headers: list[tuple[bytes, bytes]], body: bytes, method: str, path: str) -> None:
    target = "/" + path
    head = serialize_request(method, target, headers, body, b"host: up:8000\r\n")
    req, got_body = h11_parse(head + body)
    assert req.method == method.encode() and req.target == target.encode()
    assert list(req.headers) == expected_headers(headers, b"up:8000", body, method)
    assert got_body == body
    assert sum(1 for n, _ in req.headers if n == b"content-length") <= 1
    assert not any(n in HOP_BY_HOP for n, _ in req.headers)


@pytest.mark.parametrize("bad", [
    [(b"x-a", b"a\r\nx-evil: 1")], [(b"x-a", b"a\nb")], [(b"x-a", b"a\x00")], [(b"x a", b"1")],
    [(b"x:a", b"1")], [(b"", b"1")],
])
def test_serialize_refuses_injection(bad: list[tuple[bytes, bytes]]) -> None:
    with pytest.raises(ValueError):
        serialize_request("GET", "/", bad, b"", b"host: a\r\n")


def test_serialize_refuses_bad_target() -> None:
    for target in ("/a b", "/a\r\nX: 1", "/é"):
        with pytest.raises(ValueError):
            serialize_request("GET", target, [], b"", b"host: a\r\n")


# ---- relay ----------------------------------------------------------------------------------

def _relay_handler(pool: UpstreamPool, events: list[str]) -> RecordingHandler:
    handler = RecordingHandler()

    async def forward(req: Request, resp: ResponseWriter) -> None:
        up = await pool.request("GET", "/", [], b"")
        resp.on_disconnect(lambda: events.append("on_disconnect"))
        resp.start(up.status, [(b"content-type", b"text/event-stream")], up.content_length)
        try:
            n = await up.relay(resp)
            events.append(f"done:{n}")
        except ClientGone:
            events.append("client_gone")
        except UpstreamError as exc:
            events.append(f"upstream:{exc.reason}")
            resp.write(b"data: {\"error\": \"upstream\"}\n\n")
            resp.abort()

    handler.upstream = forward
    return handler


async def test_relay_backpressure_slow_reader() -> None:
    total = 24 * 1024 * 1024
    progress = {"sent": 0}

    async def big(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: BackendConn) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % total)
        piece = b"z" * 65536
        for _ in range(total // 65536):
            writer.write(piece)
            await writer.drain()
            progress["sent"] += 65536

    async with RawBackend(big) as backend:
        pool = UpstreamPool(HOST, backend.port, FAST_UPSTREAM)
        events: list[str] = []
        async with serve(_relay_handler(pool, events)) as server:
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
            sock.connect((HOST, server.port))
            sock.setblocking(False)
            reader, writer = await asyncio.open_connection(sock=sock)
            writer.write(b"GET /proxy HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
            await asyncio.sleep(0.5)  # the client reads nothing
            conn = next(iter(server._connections))
            assert conn.flow.write_paused
            buffered = conn._transport.get_write_buffer_size()
            assert buffered <= 64 * 1024 + 256 * 1024, buffered  # bounded: high-water + one piece
            assert progress["sent"] < total  # the backend is held back by TCP backpressure
            got = 0
            while chunk := await reader.read(1 << 20):
                got += len(chunk)
            assert got >= total
            assert events == [f"done:{total}"]
            writer.close()
        await pool.close()


async def test_client_disconnect_closes_upstream_and_relay_raises_client_gone() -> None:
    async def sse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: BackendConn) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        i = 0
        while True:
            event = b"data: %d\n\n" % i
            writer.write(b"%x\r\n%b\r\n" % (len(event), event))
            await writer.drain()
            i += 1
            await asyncio.sleep(0.02)

    async with RawBackend(sse) as backend:
        pool = UpstreamPool(HOST, backend.port, FAST_UPSTREAM)
        events: list[str] = []
        async with serve(_relay_handler(pool, events)) as server:
            reader, writer = await asyncio.open_connection(HOST, server.port)
            writer.write(b"GET /proxy HTTP/1.1\r\nHost: a\r\n\r\n")
            await asyncio.wait_for(reader.readuntil(b"data: 3\n\n"), 5.0)  # fails, not hangs, on a lost event
            t0 = time.monotonic()
            writer.transport.abort()
            assert await until(lambda: backend.conns[0].closed.is_set(), 3.0)
            assert time.monotonic() - t0 < 3.0
            assert await until(lambda: events == ["on_disconnect", "client_gone"], 3.0), events
            assert pool.active == 0 and pool.idle == 0
        await pool.close()


async def test_relay_upstream_failure_leaves_writer_to_caller() -> None:
    async def dies(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: BackendConn) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n8\r\ndata: 1\n\r\n")
        await writer.drain()
        await asyncio.sleep(0.05)

    async with RawBackend(dies) as backend:
        pool = UpstreamPool(HOST, backend.port, FAST_UPSTREAM)
        events: list[str] = []
        async with serve(_relay_handler(pool, events)) as server:
            from tests.http._support import exchange

            ex = await exchange(server.port, b"GET /proxy HTTP/1.1\r\nHost: a\r\n\r\n")
            assert events == ["upstream:closed"]
            assert b"data: 1\n" in ex.data and b'{"error": "upstream"}' in ex.data
            assert not ex.data.endswith(b"0\r\n\r\n") and ex.eof  # no terminating chunk
        await pool.close()


async def test_a_connection_reused_at_once_is_not_polled() -> None:
    # under load a connection goes back out within microseconds: no poll(2) per request then
    polls: list[bool] = []

    class Counting:  # the connection's poll(2) object, counted (the compiled _Conn's methods are fixed)
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def poll(self, timeout: int) -> list[tuple[int, int]]:
            polls.append(True)
            return list(self.inner.poll(timeout))

    def counted(pool: UpstreamPool) -> None:
        for conn in pool._idle:
            if not isinstance(conn.poller, Counting):
                conn.poller = Counting(conn.poller)

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: BackendConn) -> None:
        while True:
            await read_request(reader)
            writer.write(ok_response(b"ok"))
            await writer.drain()

    async with RawBackend(script) as backend:
        pool = UpstreamPool(HOST, backend.port, dataclasses.replace(FAST_UPSTREAM, pool_check_after=0.5))
        for _ in range(3):
            resp = await pool.request("POST", "/", [], b"x")
            await resp.read_all(100)
            counted(pool)
        assert polls == []
        await asyncio.sleep(0.6)
        resp = await pool.request("POST", "/", [], b"x")
        await resp.read_all(100)
        assert polls == [True] and len(backend.conns) == 1
