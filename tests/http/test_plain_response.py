"""A plainly written upstream response head read without httptools, its Content-Length body by
``_speedups.LengthBody`` (flexinfer/http/client.py: ``_Conn._take_head``), over real sockets: each
shape of a response is served twice, with a plain head and with the same head made not plain (an
obs-text byte in one value, so httptools reads it end to end), and both must read the same: the
body, its end, the error, and whether the connection goes back to the pool."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from typing import Any

import httptools
import pytest

from flexinfer.http.client import UpstreamError, UpstreamPool
from tests.http._support import FAST_UPSTREAM, HOST, BackendConn, RawBackend, counting_parser, read_request
from tests.http.test_chunked_upstream import backend_writes

_Counting = counting_parser(httptools.HttpResponseParser)


@pytest.fixture(autouse=True)
def counting(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setattr(httptools, "HttpResponseParser", _Counting)
    _Counting.fed = 0
    yield _Counting


async def read_body(pool: UpstreamPool) -> tuple[bytes, bool]:
    """The body, and whether httptools read none of the response."""
    before = _Counting.fed
    resp = await pool.request("GET", "/", [], b"")
    pieces = []
    while piece := await resp.read():
        pieces.append(piece)
    return b"".join(pieces), _Counting.fed == before

BODY = b'{"id":"x","choices":[]}'
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\nServer: t\r\n\r\n" % len(BODY)
NOT_PLAIN = HEAD.replace(b"Server: t", b"Server: t\xe9")


def _both(shapes):  # type: ignore[no-untyped-def]
    return [pytest.param(shape(head), plain, id=f"{name}-{'plain' if plain else 'parser'}")
            for name, shape in shapes for head, plain in ((HEAD, True), (NOT_PLAIN, False))]


SHAPES = [
    ("one-read", lambda h: [h + BODY]),
    ("head-alone", lambda h: [h, BODY[:5], BODY[5:]]),
    ("body-cut", lambda h: [h + BODY[:1], BODY[1:-1], BODY[-1:]]),
    ("byte-per-read", lambda h: [h + BODY[:3]] + [bytes([b]) for b in BODY[3:]]),
]


ENDS = [
    ("close", lambda h: [h.replace(b"Server: t", b"Connection: close\r\nServer: t") + BODY]),
    ("bytes-after", lambda h: [h + BODY + b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\npoison"]),
    ("bytes-after-later", lambda h: [h + BODY[:4], BODY[4:] + b"X"]),
]


@pytest.mark.parametrize(("writes", "plain", "reused"),
                         [pytest.param(*p.values, True, id=p.id) for p in _both(SHAPES)]
                         + [pytest.param(*p.values, False, id=p.id) for p in _both(ENDS)])
async def test_a_content_length_body_reads_the_same(writes: list[bytes], plain: bool, reused: bool) -> None:
    """The body, read three times: on one connection, or (Connection: close, bytes after the
    body) on a new connection each time, never reused."""
    async with RawBackend(backend_writes(writes)) as backend:
        pool = UpstreamPool(HOST, backend.port, FAST_UPSTREAM)
        for _ in range(3):
            body, owned = await read_body(pool)
            assert body == BODY and owned == plain
        assert (len(backend.conns), pool.idle) == ((1, 1) if reused else (3, 0))
        await pool.close()


def _answers(payload: bytes, close: bool):  # type: ignore[no-untyped-def]
    """A backend that answers one request with ``payload`` in one write, then closes (``close``)
    or holds the connection open for a second."""
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: BackendConn) -> None:
        await read_request(reader)
        writer.write(payload)
        await writer.drain()
        await asyncio.sleep(0.05 if close else 1.0)
        if close:
            writer.close()
    return script


@pytest.mark.parametrize("head", [HEAD, NOT_PLAIN], ids=["plain", "parser"])
async def test_the_upstream_closing_inside_the_body_is_an_error(head: bytes) -> None:
    async with RawBackend(_answers(head + BODY[:7], close=True)) as backend:
        pool = UpstreamPool(HOST, backend.port, FAST_UPSTREAM)
        resp = await pool.request("GET", "/", [], b"")
        assert await resp.read() == BODY[:7]
        with pytest.raises(UpstreamError) as ei:
            while await resp.read():
                pass
        assert ei.value.reason == "closed"
        assert pool.idle == 0 and pool.active == 0
        await pool.close()


@pytest.mark.parametrize(("head", "body"), [
    (b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", b""),  # no body: the parser's
    (b"HTTP/1.1 204 No Content\r\n\r\n", b""),
    (b"HTTP/1.1 200 OK\r\n\r\n", BODY),  # close-delimited: the parser's
    (b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999\r\n\r\n", None),  # past 2**64: refused
    (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n", None),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n", None),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 1 2\r\n\r\n", None),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close, x\r\n\r\n", b"ok"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: keep-alive\r\nConnection: close\r\n\r\n", b"ok"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nUpgrade: h2c\r\n\r\n", b"ok"),
], ids=["cl-0", "204", "close-delimited", "cl-overflow", "two-cl", "cl-te", "cl-space", "connection-tokens",
        "connection-twice", "upgrade"])
async def test_heads_left_to_the_parser(head: bytes, body: bytes | None) -> None:
    """Heads the plain path leaves to httptools: read (or refused) as before, nothing owned."""
    close = b"Content-Length" not in head  # (a close-delimited body ends at EOF)
    async with RawBackend(_answers(head + (body if body else b"ok"), close)) as backend:
        pool = UpstreamPool(HOST, backend.port, FAST_UPSTREAM)
        if body is None:
            with pytest.raises(UpstreamError) as ei:
                await pool.request("GET", "/", [], b"")
            assert ei.value.reason == "protocol"
        else:
            resp = await pool.request("GET", "/", [], b"")
            assert _Counting.fed > 0
            pieces = []
            while piece := await resp.read():
                pieces.append(piece)
            assert b"".join(pieces) == body
        await pool.close()


@pytest.mark.parametrize("head", [HEAD, NOT_PLAIN], ids=["plain", "parser"])
async def test_a_head_over_the_limit_is_refused_either_way(head: bytes) -> None:
    big = head.replace(b"Server: t", b"X-Big: " + b"v" * 300 + b"\r\nServer: t")

    settings = dataclasses.replace(FAST_UPSTREAM, max_response_header_bytes=256)
    async with RawBackend(_answers(big + BODY, close=False)) as backend:
        pool = UpstreamPool(HOST, backend.port, settings)
        with pytest.raises(UpstreamError) as ei:
            await pool.request("GET", "/", [], b"")
        assert ei.value.reason == "protocol" and "too large" in str(ei.value)
        await pool.close()
