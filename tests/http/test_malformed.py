"""Reliability plan §3.1 (malformed HTTP, byte level) against the real server on a real socket.

Oracle per row: (a) the exact status, (b) ``Connection: close`` and EOF within 1 s, (c) the handler
never handled it (nothing would be forwarded), (d) a following valid request on a new connection
succeeds, (e) exactly one rejection counter moved.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import orjson
import pytest

from flexinfer.http.protocol import Request, ResponseWriter
from tests.http._support import RecordingHandler, exchange, fast_settings, parse_responses, serve

P = b"POST / HTTP/1.1\r\nHost: a\r\n"
CH = P + b"Transfer-Encoding: chunked\r\n\r\n"
MiB = 1024 * 1024


@dataclass(frozen=True)
class Row:
    id: str
    data: bytes
    status: tuple[int, ...] = (400,)
    reason: str | None = None
    after_headers: bool = False  # the error is in the body: on_headers may have run, handle never


ROWS = [
    Row("M01", P + b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
    Row("M02", P + b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n"),
    Row("M03", P + b"Content-Length: 1\r\nContent-Length: 0\r\n\r\nZ"),
    Row("M04", P + b"Content-Length: 1\r\nContent-Length: 1\r\n\r\nZ"),
    Row("M05", P + b"Content-Length: 1, 1\r\n\r\nZ"),
    Row("M06", P + b"Content-Length: +1\r\n\r\nZ"),
    Row("M07", P + b"Content-Length: -1\r\n\r\nZ"),
    Row("M08", P + b"Content-Length: 0x10\r\n\r\nZ"),
    Row("M09", P + b"Content-Length: \r\n\r\nZ"),
    Row("M10", P + b"Content-Length: 1Z\r\n\r\nZ"),
    Row("M11", P + b"Content-Length: 1_0\r\n\r\nZ"),
    Row("M12", P + b"Content-Length: 18446744073709551616\r\n\r\nZ", (400, 413)),
    Row("M13", P + b"Content-Length : 1\r\n\r\nZ"),
    Row("M14", b"GET / HTTP/1.1\r\n Content-Length: 1\r\n\r\nX"),
    Row("M15", P + b"Transfer-Encoding: xchunked\r\n\r\n0\r\n\r\n", (400, 501)),
    Row("M16", P + b"Transfer-Encoding: chunked, gzip\r\n\r\n0\r\n\r\n"),
    Row("M17", P + b"Transfer-Encoding: ,chunked\r\n\r\n0\r\n\r\n", reason="bad_framing"),
    Row("M18", P + b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
    Row("M19", P + b"Transfer-Encoding: \xa0chunked\xa0\r\n\r\n0\r\n\r\n"),
    Row("M20", b"POST / HTTP/1.0\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        reason="bad_framing"),
    Row("M21", P + b"Transfer-Encoding:\r\n chunked\r\n\r\n0\r\n\r\n"),
    Row("M22", P + b"X-A: a\r\n b\r\nContent-Length: 0\r\n\r\n"),
    Row("M23", b"GET / HTTP/1.1\nHost: a\n\n"),
    Row("M24", P + b"X-A: a\rb\r\nContent-Length: 0\r\n\r\n"),
    Row("M25", P + b"X-Model-ID: m\rX-Evil: 1\r\nContent-Length: 0\r\n\r\n"),
    Row("M26", P + b"X-A: a\x00b\r\nContent-Length: 0\r\n\r\n"),
    Row("M27", P + b"X-A: a\x7fb\r\nContent-Length: 0\r\n\r\n"),
    Row("M28", P + b"X-Model-ID: ll\xffama\r\nContent-Length: 0\r\n\r\n", reason="bad_header_value"),
    Row("M29", P + b"X A: b\r\nContent-Length: 0\r\n\r\n"),
    Row("M30", P + b": b\r\nContent-Length: 0\r\n\r\n"),
    Row("M31", P + b"Content-Length 10\r\n\r\n0123456789"),
    Row("M32", P + b"\xefoo: bar\r\nContent-Length: 0\r\n\r\n"),
    Row("M33a", P + b"Content_Length: 5\r\n\r\nhello", reason="bad_header_name"),
    Row("M33b", P + b"X_Model_ID: m\r\nContent-Length: 0\r\n\r\n", reason="bad_header_name"),
    Row("M34", P + b"Content-Length: 0\r\n\rZGET /evil HTTP/1.1\r\n\r\n"),
    Row("M35", CH + b"0x1\r\nZ\r\n0\r\n\r\n", after_headers=True),
    Row("M36", CH + b"0_2e\r\nZ\r\n0\r\n\r\n", after_headers=True),
    Row("M37", CH + b" 1\r\nZ\r\n0\r\n\r\n", after_headers=True),
    Row("M38", CH + b"fffffffffffffffff\r\nZ\r\n0\r\n\r\n", (400, 413), after_headers=True),
    Row("M39", CH + b"1\nZ\r\n0\r\n\r\n", after_headers=True),
    Row("M40", CH + b"1\rXZ\r\n0\r\n\r\n", after_headers=True),
    Row("M41", CH + b"1;a=\nx\r\nZ\r\n0\r\n\r\n", after_headers=True),
    Row("M42", CH + b"1\r\nZX0\r\n\r\n", after_headers=True),
    Row("M43", CH + b"1\r\nZ\r\n0\r\nContent-Length: 50\r\n\r\n", after_headers=True),
    Row("M44", b"GET / HTTP/1.32\r\nHost: a\r\n\r\n", (400, 505)),
    Row("M45", b"GET / HTTP/2.0\r\nHost: a\r\n\r\n", (505,), reason="version_not_supported"),
    Row("M46", b"G(T / HTTP/1.1\r\nHost: a\r\n\r\n"),
    Row("M47", b"GET /a\x00b HTTP/1.1\r\nHost: a\r\n\r\n"),
    Row("M48", b"GET /a b HTTP/1.1\r\nHost: a\r\n\r\n"),
    Row("M49", b"GET /\nHTTP/1.1\r\nHost: a\r\n\r\n"),
    Row("M50", b"GET / HTTP/1.1\r\n\r\n", reason="bad_host"),
    Row("M51", b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", reason="bad_host"),
    Row("M52", b"CONNECT 10.0.0.1:443 HTTP/1.1\r\nHost: 10.0.0.1:443\r\n\r\n", (405,),
        reason="method_not_allowed"),
    Row("M53", b"GET / HTTP/1.1\r\nHost: a\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
        b"HTTP2-Settings: AAMAAABkAAQAAP__\r\n\r\n", reason="upgrade_rejected"),
    Row("M53b", b"GET / HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\n\r\n", reason="upgrade_rejected"),
    Row("M54", b"GET http://169.254.169.254/latest/meta-data/ HTTP/1.1\r\nHost: a\r\n\r\n",
        reason="bad_target"),
    Row("M55", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", (400, 505)),
    Row("M62", P + b"Transfer-Encoding: identity\r\nContent-Length: 1\r\n\r\nZ"),
    Row("M63", P + b"X-Big: " + b"a" * MiB + b"\r\n\r\n", (431,), reason="header_too_large"),
    Row("M64", P + b"X: y\r\n" * 100_000 + b"\r\n", (431,), reason="too_many_headers"),
    Row("M65", b"GET /" + b"a" * MiB + b" HTTP/1.1\r\nHost: a\r\n\r\n", (414,), reason="uri_too_long"),
    Row("M66", CH + b"1;" + b"a" * (10 * MiB) + b"\r\nZ\r\n0\r\n\r\n",
        reason="chunk_extension_too_large", after_headers=True),
    Row("fragment", b"GET /a#b HTTP/1.1\r\nHost: a\r\n\r\n", reason="bad_target"),
    Row("http09", b"GET / HTTP/0.9\r\nHost: a\r\n\r\n", (505,)),
    Row("te-case-list", P + b"Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", reason="bad_framing"),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
async def test_malformed_row(row: Row) -> None:
    handler = RecordingHandler()
    async with serve(handler) as server:
        ex = await exchange(server.port, row.data, timeout=1.5)
        resps = parse_responses(ex.data)
        assert len(resps) == 1, ex.data[:500]
        r = resps[0]
        assert r.status in row.status, ex.data[:500]
        assert r.header(b"connection") == b"close"
        err = orjson.loads(r.body)["error"]
        assert set(err) == {"message", "type", "param", "code"}
        assert ex.eof and ex.eof_after < 1.0, ex
        assert handler.handled == []  # (c): nothing reaches the handler, nothing is forwarded
        if not row.after_headers:
            assert handler.seen_headers == []
        assert sum(server.stats.rejections.values()) == 1, server.stats.rejections
        if row.reason is not None:
            assert server.stats.rejections == {row.reason: 1}
        ok = await exchange(server.port, b"GET /ok HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        assert [x.status for x in parse_responses(ok.data)] == [200]


async def test_m56_valid_then_invalid_pipelined() -> None:
    handler = RecordingHandler()
    async with serve(handler) as server:
        ex = await exchange(server.port, b"GET / HTTP/1.1\r\nHost: a\r\n\r\nInvalid\r\n\r\n")
        resps = parse_responses(ex.data)
        assert [r.status for r in resps] == [200, 400]
        assert resps[0].header(b"connection") is None
        assert resps[1].header(b"connection") == b"close"
        assert ex.eof and ex.eof_after < 1.0
        assert len(handler.handled) == 1
        assert server.stats.rejections == {"bad_request": 1}


async def test_m57_nothing_after_connection_close() -> None:
    handler = RecordingHandler()
    async with serve(handler) as server:
        ex = await exchange(server.port, b"GET /1 HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"
                                         b"GET /2 HTTP/1.1\r\nHost: a\r\n\r\n")
        resps = parse_responses(ex.data)
        assert [r.status for r in resps] == [200]
        assert resps[0].header(b"connection") == b"close"
        assert ex.eof and ex.eof_after < 1.0
        assert [r.path for r in handler.seen_headers] == ["/1"]
        assert [r.path for r in handler.handled] == ["/1"]


async def test_m57_nothing_after_connection_close_in_later_packet() -> None:
    handler = RecordingHandler()
    async with serve(handler) as server:
        ex = await exchange(server.port, [b"GET /1 HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
                                          b"GET /2 HTTP/1.1\r\nHost: a\r\n\r\n"], pace=0.05)
        assert [r.status for r in parse_responses(ex.data)] == [200]
        assert [r.path for r in handler.handled] == ["/1"]


async def test_m58_expect_with_huge_length_is_413_without_continue() -> None:
    handler = RecordingHandler()
    async with serve(handler) as server:
        ex = await exchange(server.port, P + b"Expect: 100-continue\r\nContent-Length: 99999999999\r\n\r\n")
        assert b"100 Continue" not in ex.data
        resps = parse_responses(ex.data)
        assert [r.status for r in resps] == [413]
        assert ex.eof and ex.eof_after < 1.0
        assert handler.seen_headers == [] and handler.handled == []
        assert server.stats.rejections == {"body_too_large": 1}


async def test_m59_expect_refused_by_handler_without_continue() -> None:
    handler = RecordingHandler()
    async with serve(handler) as server:
        ex = await exchange(server.port, b"POST /auth HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\n"
                                         b"Content-Length: 5\r\n\r\n")
        assert b"100 Continue" not in ex.data
        resps = parse_responses(ex.data)
        assert [r.status for r in resps] == [401]
        assert resps[0].header(b"connection") == b"close"
        assert orjson.loads(resps[0].body)["error"]["code"] == "invalid_api_key"
        assert ex.eof
        assert handler.handled == []
        assert server.stats.rejections == {}  # the handler's refusal is not a core rejection


async def test_m60_empty_body_then_second_request_in_order() -> None:
    handler = RecordingHandler()
    async with serve(handler) as server:
        ex = await exchange(server.port, P + b"Content-Length: 0\r\n\r\n"
                                         b"GET /second HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        resps = parse_responses(ex.data)
        assert [r.body for r in resps] == [b"ok /", b"ok /second"]


async def test_m61_get_with_body_is_consumed() -> None:
    handler = RecordingHandler()
    async with serve(handler) as server:
        ex = await exchange(server.port, b"GET /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\n"
                                         b"0123456789GET /next HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        resps = parse_responses(ex.data)
        assert [r.body for r in resps] == [b"0123456789", b"ok /next"]


async def test_m67_one_byte_per_tick_hits_header_deadline() -> None:
    handler = RecordingHandler()
    settings = fast_settings(header_timeout=0.3)
    async with serve(handler, settings) as server:
        req = b"GET / HTTP/1.1\r\nHost: a\r\nX-Slow: " + b"a" * 40 + b"\r\n\r\n"
        t0 = asyncio.get_running_loop().time()
        ex = await exchange(server.port, [bytes([b]) for b in req], pace=0.05, timeout=0.1)
        took = asyncio.get_running_loop().time() - t0
        resps = parse_responses(ex.data)
        assert [r.status for r in resps] == [408]
        assert ex.eof
        assert 0.25 <= took < 3.0  # the 10 s default would be far later; slack for loaded CI
        assert handler.seen_headers == [] and handler.handled == []
        assert server.stats.rejections == {"header_timeout": 1}


@pytest.mark.parametrize("conn", [b"Proxy-Connection: keep-alive\r\n", b"Connection: close, keep-alive\r\n", b""],
                         ids=["proxy-connection", "close-and-keep-alive", "no-connection"])
async def test_http10_persists_only_on_connection_keep_alive(conn: bytes) -> None:
    """Found by the mutation run (F2): llhttp keeps an HTTP/1.0 connection open on the non-standard
    ``Proxy-Connection: keep-alive`` and on ``Connection: close, keep-alive``; h11 and RFC 9112
    §9.3 end it after the response. The core must not read (nor forward) the next request."""
    handler = RecordingHandler()
    async with serve(handler) as server:
        ex = await exchange(server.port, b"GET /1 HTTP/1.0\r\n" + conn + b"\r\nGET /2 HTTP/1.1\r\nHost: a\r\n\r\n")
        resps = parse_responses(ex.data)
        assert [r.status for r in resps] == [200]
        assert resps[0].header(b"connection") == b"close"
        assert ex.eof
        assert [r.path for r in handler.seen_headers] == ["/1"]


async def test_http10_keep_alive_still_persists() -> None:
    handler = RecordingHandler()
    async with serve(handler) as server:
        ex = await exchange(server.port, b"GET /1 HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n"
                                         b"GET /2 HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        resps = parse_responses(ex.data)
        assert [r.status for r in resps] == [200, 200]
        assert resps[0].header(b"connection") == b"keep-alive"
        assert [r.path for r in handler.handled] == ["/1", "/2"]


class _AnswersInExcept(RecordingHandler):
    """Answers ``/except`` from inside an ``except`` block, as the proxy pipeline answers its
    errors (``except FlexInferError: resp.send_error(...)``), after a short wait."""

    async def handle(self, req: Request, resp: ResponseWriter) -> None:
        if req.path != "/except":
            await super().handle(req, resp)
            return
        self.handled.append(req)
        await asyncio.sleep(0.2)
        try:
            raise LookupError("no such model")
        except LookupError:
            resp.send(404, [(b"content-type", b"text/plain")], b"nope")


@pytest.mark.parametrize(("second", "statuses", "reason"), [
    (b"GET /2 HTTP/1.1\r\n\r\n", [404, 400], "bad_host"),
    (b"GET /2 HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\nGET /3 HTTP/1.1\r\nHost: a\r\n\r\n", [404, 200], None),
], ids=["reject", "connection-close"])
async def test_pipelined_bytes_parsed_inside_an_except_block(second: bytes, statuses: list[int],
                                                             reason: str | None) -> None:
    """Found by the mutation run (F2): bytes that arrived while a request was handled are parsed
    when its response is sent; when the handler sent it from inside an ``except`` block, Python
    overwrote the parser error's ``__context__`` with that exception, so a plain rejection (or the
    stop after ``Connection: close``) was logged as a failed callback and answered 500."""
    handler = _AnswersInExcept()
    async with serve(handler) as server:
        ex = await exchange(server.port, [b"GET /except HTTP/1.1\r\nHost: a\r\n\r\n", second], pace=0.05)
        assert [r.status for r in parse_responses(ex.data)] == statuses, ex.data[:600]
        assert ex.eof
        assert "internal_error" not in server.stats.rejections
        assert server.stats.rejections == ({reason: 1} if reason else {})
