"""A chunked upstream body read without httptools (flexinfer/http/client.py: ``_Conn.data_received``
reads a whole plain head itself, or cuts a whole head that is not plain off its read for httptools,
and hands the body to ``_speedups.ChunkedBody``), over real sockets, both heads:
the same bytes, ends, reuse and failures as when httptools reads the whole response, and the
responses it must leave to httptools (a head in pieces, interim responses, HEAD) still read right."""

from __future__ import annotations

import asyncio

import pytest

from flexinfer.http.client import UpstreamError, UpstreamPool
from flexinfer.http.protocol import Request, ResponseWriter
from flexinfer.http.upstream import UpstreamResponse
from tests.http._support import (
    FAST_UPSTREAM,
    HOST,
    BackendConn,
    RawBackend,
    RecordingHandler,
    parse_responses,
    read_request,
    serve,
    until,
)

HEAD = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/event-stream\r\n\r\n"
#: not plain (obs-text in a value): httptools reads this head, cut off its read (head_end)
HEAD_CUT = HEAD.replace(b"\r\n\r\n", b"\r\nX-Name: caf\xc3\xa9\r\n\r\n")
both_heads = pytest.mark.parametrize("head", [HEAD, HEAD_CUT], ids=["plain", "cut"])


def _each_head(shapes, ids):  # type: ignore[no-untyped-def]
    """``shapes(head)`` for both heads, as pytest params with ids."""
    return [pytest.param(w, id=f"{i}-{name}") for head, name in ((HEAD, "plain"), (HEAD_CUT, "cut"))
            for w, i in zip(shapes(head), ids, strict=True)]


def backend_writes(*responses: list[bytes]):  # type: ignore[no-untyped-def]
    """A backend that answers its n-th request (over all connections) with the n-th list of writes,
    each write drained and followed by a short pause, so that each arrives in a read of its own."""
    served = [0]

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: BackendConn) -> None:
        while True:
            await read_request(reader)
            writes = responses[min(served[0], len(responses) - 1)]
            served[0] += 1
            for w in writes:
                writer.write(w)
                await writer.drain()
                await asyncio.sleep(0.02)
    return script


def decoder_reads(resp: UpstreamResponse) -> bool:
    """Whether the response's body is read by the decoder (not httptools) after its head."""
    return getattr(resp._conn, "framing", None) is not None


async def read_body(pool: UpstreamPool, path: str = "/") -> tuple[bytes, bool]:
    """The body, and whether the decoder (not httptools) read it after the head."""
    resp = await pool.request("GET", path, [], b"")
    owned = decoder_reads(resp)
    pieces = []
    while True:
        piece = await resp.read()
        if not piece:
            break
        pieces.append(piece)
    return b"".join(pieces), owned


@both_heads
async def test_a_stream_is_read_by_the_decoder_and_the_connection_reused(head: bytes) -> None:
    """Head and first event in one read, the events in reads of their own, then two more responses
    on the same connection: the parser left inside the first body is replaced for the next."""
    events = [b"data: %d\n\n" % i for i in range(5)]
    writes = [head + b"%x\r\n%b\r\n" % (len(events[0]), events[0])]
    writes += [b"%x\r\n%b\r\n" % (len(e), e) for e in events[1:]] + [b"0\r\n\r\n"]
    async with RawBackend(backend_writes(writes)) as backend:
        pool = UpstreamPool(HOST, backend.port, FAST_UPSTREAM)
        for _ in range(3):
            body, owned = await read_body(pool)
            assert body == b"".join(events) and owned
        assert len(backend.conns) == 1 and pool.idle == 1
        await pool.close()


@both_heads
async def test_a_whole_body_in_the_head_s_read_and_a_content_length_response_after(head: bytes) -> None:
    writes_a = [head + b"3\r\nabc\r\n2\r\nde\r\n0\r\nX-Trailer: t\r\n\r\n"]
    writes_b = [b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-Obs: \xff\r\n\r\nplain"]  # not plain
    async with RawBackend(backend_writes(writes_a, writes_b)) as backend:
        pool = UpstreamPool(HOST, backend.port, FAST_UPSTREAM)
        assert (await read_body(pool))[0] == b"abcde"
        assert pool.idle == 1
        body, owned = await read_body(pool)
        assert body == b"plain" and not owned  # httptools reads it, with a fresh parser
        assert len(backend.conns) == 1 and pool.idle == 1
        await pool.close()


@pytest.mark.parametrize("writes", _each_head(lambda head: [
    [head[:20], head[20:] + b"3\r\nabc\r\n", b"0\r\n\r\n"],  # a head in two reads: httptools' from end to end
    [b"HTTP/1.1 100 Continue\r\n\r\n" + head + b"3\r\nabc\r\n", b"0\r\n\r\n"],  # an interim response first
    [head, b"3\r\nab", b"c\r\n0\r", b"\n\r\n"],  # the head alone, the body cut anywhere
    [head.replace(b"chunked", b"CHUNKED") + b"3;ext=1\r\nabc\r\n0\r\n\r\n"],
], ["head-in-pieces", "interim-first", "body-cut-anywhere", "upper-case"]))
async def test_every_shape_reads_the_same(writes: list[bytes]) -> None:
    async with RawBackend(backend_writes(writes)) as backend:
        pool = UpstreamPool(HOST, backend.port, FAST_UPSTREAM)
        for _ in range(2):
            assert (await read_body(pool))[0] == b"abc"
        assert len(backend.conns) == 1 and pool.idle == 1
        await pool.close()


@both_heads
async def test_bytes_after_the_last_chunk_end_the_body_and_the_connection(head: bytes) -> None:
    writes = [head + b"2\r\nhi\r\n", b"0\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\npoison"]
    async with RawBackend(backend_writes(writes)) as backend:
        pool = UpstreamPool(HOST, backend.port, FAST_UPSTREAM)
        assert await read_body(pool) == (b"hi", True)
        assert pool.idle == 0
        assert (await read_body(pool))[0] == b"hi"  # a fresh connection, not the poisoned bytes
        assert len(backend.conns) == 2
        await pool.close()


@pytest.mark.parametrize("bad", [b"zz\r\nabc\r\n", b"3\r\nabcXX", b"3 \r\nabc\r\n", b"0\r\nno colon\r\n\r\n",
                                 b"ffffffffffffffffffff\r\n"])
@both_heads
async def test_broken_framing_in_a_later_read_is_a_protocol_error(bad: bytes, head: bytes) -> None:
    writes = [head + b"2\r\nhi\r\n", bad]

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: BackendConn) -> None:
        await backend_writes(writes)(reader, writer, conn)

    async with RawBackend(script) as backend:
        pool = UpstreamPool(HOST, backend.port, FAST_UPSTREAM)
        resp = await pool.request("GET", "/", [], b"")
        assert await resp.read() == b"hi"
        with pytest.raises(UpstreamError) as ei:
            while await resp.read():
                pass
        assert ei.value.reason == "protocol" and "malformed response" in str(ei.value)
        assert pool.idle == 0 and pool.active == 0
        assert await until(lambda: backend.conns[0].closed.is_set(), 3.0)
        await pool.close()


@both_heads
async def test_head_request_with_chunked_answer_is_not_cut(head: bytes) -> None:
    """A HEAD's response has no body whatever it says: nothing is handed to a decoder."""
    async with RawBackend(backend_writes([head])) as backend:
        pool = UpstreamPool(HOST, backend.port, FAST_UPSTREAM)
        resp = await pool.request("HEAD", "/", [], b"")
        assert resp.status == 200 and await resp.read() == b""
        await pool.close()


_EVENTS = [b"data: %d\n\n" % i for i in range(6)]
_FRAMED = [b"%x\r\n%b\r\n" % (len(e), e) for e in _EVENTS]


@pytest.mark.parametrize("writes", _each_head(lambda head: [
    [head + _FRAMED[0], *_FRAMED[1:], b"0\r\n\r\n"],  # an event per read, the end alone
    [head, _FRAMED[0] + _FRAMED[1], _FRAMED[2][:3], _FRAMED[2][3:] + _FRAMED[3], b"".join(_FRAMED[4:]) + b"0\r\n\r\n"],
    [head + b"".join(_FRAMED[:3]), b"".join(_FRAMED[3:]) + b"0\r\n\r\n"],
], ["event-per-read", "cut-anywhere", "bursts"]))
async def test_a_relayed_stream_reaches_the_client_whole_and_in_order(writes: list[bytes]) -> None:
    """Relayed as the proxy relays (``UpstreamResponse.relay`` into a ResponseWriter): each read's
    payload goes to the client in its read's one call, a read of framing only sends nothing, and
    the client gets every event once, in order, then the end; the connection goes back to the pool."""
    async with RawBackend(backend_writes(writes)) as backend:
        pool = UpstreamPool(HOST, backend.port, FAST_UPSTREAM)
        relayed: list[int] = []
        owned: list[bool] = []

        async def forward(req: Request, resp: ResponseWriter) -> None:
            up = await pool.request("GET", "/", [], b"")
            owned.append(decoder_reads(up))
            resp.start(up.status, [(b"content-type", b"text/event-stream")], up.content_length)
            relayed.append(await up.relay(resp))

        handler = RecordingHandler()
        handler.upstream = forward
        async with serve(handler) as server:
            reader, writer = await asyncio.open_connection(HOST, server.port)
            writer.write(b"GET /proxy HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
            raw = await asyncio.wait_for(reader.read(-1), 5.0)
            writer.close()
        [resp] = parse_responses(raw)
        assert resp.complete and resp.body == b"".join(_EVENTS)
        assert relayed == [len(resp.body)] and owned == [True]
        assert await until(lambda: pool.idle == 1, 2.0)
        await pool.close()
