"""Server side of flexinfer.http: limits (scaled), deadlines, keep-alive, pipelining, Expect,
responses, flow control, disconnects and graceful drain. Real sockets on 127.0.0.1."""

from __future__ import annotations

import asyncio
import socket
import time

import orjson
import pytest

from flexinfer.errors import RateLimited
from flexinfer.http import responses
from flexinfer.http.protocol import ClientGone, Request, ResponseWriter
from tests.http._support import (
    HOST,
    RecordingHandler,
    exchange,
    fast_settings,
    parse_responses,
    serve,
    until,
)

GET_CLOSE = b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"


# ---- limits, with small settings ----------------------------------------------------------

SMALL = fast_settings(max_request_line=256, max_header_bytes=512, max_headers=8, max_body_json=1000,
                      max_body_multipart=3000, max_chunk_extension=64)


@pytest.mark.parametrize(("data", "status", "reason"), [
    (b"GET /" + b"a" * 300 + b" HTTP/1.1\r\nHost: a\r\n\r\n", 414, "uri_too_long"),
    (b"GET /" + b"a" * 250 + b" HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n", 200, None),
    (b"GET / HTTP/1.1\r\nHost: a\r\nX: " + b"v" * 600 + b"\r\n\r\n", 431, "header_too_large"),
    (b"GET / HTTP/1.1\r\nHost: a\r\n" + b"X-A: 1\r\n" * 9 + b"\r\n", 431, "too_many_headers"),
    (b"GET / HTTP/1.1\r\nHost: a\r\n" + b"X-A: 1\r\n" * 6 + b"Connection: close\r\n\r\n", 200, None),
    (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1001\r\n\r\n", 413, "body_too_large"),
    (b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 1000\r\nConnection: close\r\n\r\n" + b"x" * 1000,
     200, None),
    (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Type: multipart/form-data; boundary=x\r\n"
     b"Content-Length: 3001\r\n\r\n", 413, "body_too_large"),
    (b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Type: Multipart/Form-Data; boundary=x\r\n"
     b"Content-Length: 2000\r\nConnection: close\r\n\r\n" + b"x" * 2000, 200, None),
    (b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n" + b"200\r\n" + b"x" * 512 +
     b"\r\n" + b"200\r\n" + b"x" * 512 + b"\r\n0\r\n\r\n", 413, "body_too_large"),
])
async def test_limits(data: bytes, status: int, reason: str | None) -> None:
    handler = RecordingHandler()
    async with serve(handler, SMALL) as server:
        ex = await exchange(server.port, data)
        resps = parse_responses(ex.data)
        assert [r.status for r in resps] == [status], ex.data[:300]
        assert ex.eof
        if reason:
            assert server.stats.rejections == {reason: 1}
            assert handler.handled == []
        else:
            assert server.stats.rejections == {}


async def test_chunk_extension_limit_counts_across_reads() -> None:
    handler = RecordingHandler()
    async with serve(handler, SMALL) as server:
        head = b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
        ex = await exchange(server.port, [head, b"1;", b"e" * 100, b"e" * 100, b"\r\nZ\r\n0\r\n\r\n"],
                            pace=0.05)
        assert [r.status for r in parse_responses(ex.data)] == [400]
        assert server.stats.rejections == {"chunk_extension_too_large": 1}
        assert handler.handled == []


async def test_small_chunk_extension_and_trailer_accepted() -> None:
    handler = RecordingHandler()
    async with serve(handler, SMALL) as server:
        ex = await exchange(server.port, b"POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n"
                                         b"Connection: close\r\n\r\n3;x=y\r\nabc\r\n2\r\nde\r\n0\r\nX-T: 1\r\n\r\n")
        resps = parse_responses(ex.data)
        assert [(r.status, r.body) for r in resps] == [(200, b"abcde")]
        # trailer fields are dropped, never merged into the request headers
        assert handler.handled[0].get(b"x-t") is None


CHUNKED_HEAD = b"POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"


@pytest.mark.parametrize(("name", "body"), [
    # each extension is under the limit; together they are not (the per-line count used to restart)
    ("many small extensions", b"".join(b"1;e=" + b"x" * 40 + b"\r\nA\r\n" for _ in range(8)) + b"0\r\n\r\n"),
    ("extension on the last chunk", b"1\r\nA\r\n0;" + b"e" * 200 + b"\r\n\r\n"),
    ("one long trailer field", b"1\r\nA\r\n0\r\nX-T: " + b"v" * 200 + b"\r\n\r\n"),
    ("trailers under the count limit",
     b"1\r\nA\r\n0\r\n" + b"".join(b"X-%d: " % i + b"v" * 30 + b"\r\n" for i in range(5)) + b"\r\n"),
    ("size with leading zeros", b"0" * 200 + b"1\r\nA\r\n0\r\n\r\n"),
])
@pytest.mark.parametrize("reads", ["one write", "byte pieces"])
async def test_chunk_metadata_is_bounded_per_request(name: str, body: bytes, reads: str) -> None:
    handler = RecordingHandler()
    data = CHUNKED_HEAD + body
    payload: bytes | list[bytes] = data if reads == "one write" else [data[i:i + 7] for i in range(0, len(data), 7)]
    async with serve(handler, SMALL) as server:
        ex = await exchange(server.port, payload, timeout=3.0)
        assert [r.status for r in parse_responses(ex.data)] == [400], name
        assert server.stats.rejections == {"chunk_extension_too_large": 1}
        assert handler.handled == []


async def test_tens_of_kib_of_chunk_extension_in_one_read_is_refused_with_default_limits() -> None:
    handler = RecordingHandler()
    async with serve(handler, fast_settings()) as server:
        data = CHUNKED_HEAD + b"1;" + b"a" * (40 * 1024) + b"\r\nZ\r\n0\r\n\r\n"
        ex = await exchange(server.port, data, timeout=3.0)
        assert [r.status for r in parse_responses(ex.data)] == [400]
        assert server.stats.rejections == {"chunk_extension_too_large": 1}
        assert handler.handled == []


async def test_chunk_metadata_under_the_limit_with_pipelined_requests_behind_it() -> None:
    # the slice that ends a chunked body may carry the next requests too: they must not be counted
    # as its metadata (a big pipelined body right behind a chunked request is served, not refused)
    handler = RecordingHandler()
    async with serve(handler, SMALL) as server:
        big = b"y" * 900
        data = (CHUNKED_HEAD + b"3;x=" + b"e" * 30 + b"\r\nabc\r\n0\r\nX-T: 1\r\n\r\n"
                + b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n" % len(big) + big
                + CHUNKED_HEAD.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n")
                + b"%x\r\n" % len(big) + big + b"\r\n0\r\n\r\n")
        ex = await exchange(server.port, data, timeout=3.0)
        resps = parse_responses(ex.data)
        assert [(r.status, r.body) for r in resps] == [(200, b"abc"), (200, big), (200, big)]
        assert server.stats.rejections == {}


async def test_version_of_a_request_that_begins_inside_a_chunked_body_slice() -> None:
    # the server reads a request line's version itself only for a slice that starts with the head;
    # a request whose head begins in the slice that ends a chunked body is the parser's to read, and
    # must not inherit the version of the request before it (1.1 here, then 1.0: the answer closes)
    handler = RecordingHandler()
    async with serve(handler) as server:
        data = CHUNKED_HEAD + b"3\r\nabc\r\n0\r\n\r\n" + b"GET /ten HTTP/1.0\r\nHost: a\r\n\r\n"
        ex = await exchange(server.port, data, timeout=3.0)
        resps = parse_responses(ex.data)
        assert [(r.status, r.body) for r in resps] == [(200, b"abc"), (200, b"ok /ten")]
        assert [(r.path, r.version, r.keep_alive) for r in handler.seen_headers] == \
            [("/echo", "1.1", True), ("/ten", "1.0", False)]
        assert ex.eof


async def test_large_chunked_body_in_many_chunks_is_accepted() -> None:
    handler = RecordingHandler()
    settings = fast_settings(max_body_json=4 * 1024 * 1024)
    async with serve(handler, settings) as server:
        piece = bytes(range(256)) * 256  # 64 KiB
        body = b"".join(b"%x\r\n" % len(piece) + piece + b"\r\n" for _ in range(48)) + b"0\r\n\r\n"
        ex = await exchange(server.port, CHUNKED_HEAD.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n")
                            + body, timeout=5.0)
        resps = parse_responses(ex.data)
        assert [r.status for r in resps] == [200]
        assert resps[0].body == piece * 48


async def test_header_block_limit_checked_while_a_value_is_still_arriving() -> None:
    handler = RecordingHandler()
    async with serve(handler, SMALL) as server:
        # the value never ends: only the raw-byte count can catch it
        ex = await exchange(server.port, [b"GET / HTTP/1.1\r\nHost: a\r\nX: ", b"v" * 400, b"v" * 400],
                            pace=0.05)
        assert [r.status for r in parse_responses(ex.data)] == [431]
        assert server.stats.rejections == {"header_too_large": 1}


async def test_body_deadline_408() -> None:
    handler = RecordingHandler()
    async with serve(handler, fast_settings(body_timeout=0.3)) as server:
        t0 = time.monotonic()
        ex = await exchange(server.port, b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\n01234",
                            timeout=2.0)
        took = time.monotonic() - t0
        assert [r.status for r in parse_responses(ex.data)] == [408]
        assert 0.25 <= took < 3.0  # defaults are 10-60 s; slack for loaded CI
        assert server.stats.rejections == {"body_timeout": 1}
        assert handler.handled == []


async def test_fresh_silent_connection_closed_at_header_deadline_without_response() -> None:
    async with serve(settings=fast_settings(header_timeout=0.3)) as server:
        ex = await exchange(server.port, b"", timeout=2.0)
        assert ex.data == b"" and ex.eof
        assert ex.eof_after < 1.0


# ---- keep-alive, pipelining, Expect --------------------------------------------------------

async def test_keepalive_idle_close() -> None:
    async with serve(settings=fast_settings(keepalive_timeout=0.3)) as server:
        t0 = time.monotonic()
        ex = await exchange(server.port, b"GET / HTTP/1.1\r\nHost: a\r\n\r\n", timeout=3.0)
        took = time.monotonic() - t0
        assert [r.status for r in parse_responses(ex.data)] == [200]
        assert ex.eof
        assert 0.25 <= took < 3.0  # defaults are 10-60 s; slack for loaded CI
        assert server.stats.rejections == {}


async def test_keepalive_timer_restarts_after_each_response() -> None:
    async with serve(settings=fast_settings(keepalive_timeout=0.8)) as server:
        req = b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"
        ex = await exchange(server.port, [req, req, req, req], pace=0.3, timeout=0.1)
        assert [r.status for r in parse_responses(ex.data)] == [200] * 4


async def test_pipelined_requests_answered_in_order() -> None:
    handler = RecordingHandler()
    async with serve(handler) as server:
        data = (b"GET /sleep/0.2 HTTP/1.1\r\nHost: a\r\n\r\n"
                b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc"
                b"GET /sleep/0.01 HTTP/1.1\r\nHost: a\r\n\r\n"
                b"GET /last HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        ex = await exchange(server.port, data)
        resps = parse_responses(ex.data)
        assert [r.body for r in resps] == [b"/sleep/0.2", b"abc", b"/sleep/0.01", b"ok /last"]
        assert server.stats.requests_total == 4


async def test_pipelined_split_across_reads_and_handled_in_order() -> None:
    handler = RecordingHandler()
    async with serve(handler) as server:
        parts = [b"GET /sleep/0.1 HTTP/1.1\r\nHost: a\r\n\r\nGET /2 HT", b"TP/1.1\r\nHost: a\r\n\r\n",
                 b"GET /3 HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"]
        ex = await exchange(server.port, parts, pace=0.02)
        assert [r.body for r in parse_responses(ex.data)] == [b"/sleep/0.1", b"ok /2", b"ok /3"]
        # on_headers ran in order too
        assert [r.path for r in handler.seen_headers] == ["/sleep/0.1", "/2", "/3"]


async def test_pipelined_flood_reading_paused_and_bounded() -> None:
    handler = RecordingHandler()
    async with serve(handler) as server:
        _reader, writer = await asyncio.open_connection(HOST, server.port)
        writer.write(b"GET /gate HTTP/1.1\r\nHost: a\r\n\r\n")
        await until(lambda: len(handler.handled) == 1)
        flood = b"GET /x HTTP/1.1\r\nHost: a\r\n\r\n" * 20000  # ~600 KB of pipelined requests
        writer.write(flood)
        conn = next(iter(server._connections))
        assert await until(lambda: conn.flow.read_paused)
        pending = conn._pending
        assert pending is not None and len(pending) < 64 * 1024 + 256 * 1024
        assert len(handler.handled) == 1
        writer.close()


async def test_expect_100_continue() -> None:
    handler = RecordingHandler()
    async with serve(handler) as server:
        reader, writer = await asyncio.open_connection(HOST, server.port)
        writer.write(b"POST /echo HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n")
        line = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2)
        assert line == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(b"hello")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2)
        assert head.startswith(b"HTTP/1.1 200 OK\r\n")
        assert await reader.readexactly(5) == b"hello"
        writer.close()


async def test_expect_without_body_sends_no_continue() -> None:
    async with serve() as server:
        ex = await exchange(server.port, b"GET / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\n"
                                         b"Connection: close\r\n\r\n")
        assert b"100 Continue" not in ex.data
        assert [r.status for r in parse_responses(ex.data)] == [200]


# ---- responses ----------------------------------------------------------------------------

async def test_handler_exception_is_500_without_traceback() -> None:
    async with serve() as server:
        ex = await exchange(server.port, b"GET /boom HTTP/1.1\r\nHost: a\r\n\r\n")
        resps = parse_responses(ex.data)
        assert [r.status for r in resps] == [500]
        assert b"secret-internal-detail" not in ex.data and b"Traceback" not in ex.data
        assert orjson.loads(resps[0].body)["error"]["code"] == "internal_error"
        assert ex.eof


class _Ending(RecordingHandler):
    """Handlers that end badly, each after a first await (the end is heard in a later step)."""

    async def handle(self, req: Request, resp: ResponseWriter) -> None:
        await asyncio.sleep(0)
        path = req.path
        if path == "/ok":
            resp.send(200, [(b"content-type", b"text/plain")], b"fine")
            return
        if path.endswith("-started"):
            resp.start(200, [(b"content-type", b"text/plain")])
            resp.write(b"partial")
        if path.startswith("/return"):
            return  # the response left unfinished: a handler's bug
        if path.startswith("/raise"):
            raise RuntimeError("secret-internal-detail")
        if path.startswith("/cancelled"):
            raise asyncio.CancelledError


async def test_a_handler_that_returns_without_a_response_is_answered_500_and_logged(
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("ERROR", logger="flexinfer.http"):
        async with serve(_Ending()) as server:
            ex = await exchange(server.port, b"GET /return HTTP/1.1\r\nHost: a\r\n\r\n"
                                             b"GET /ok HTTP/1.1\r\nHost: a\r\n\r\n")
    resps = parse_responses(ex.data)
    # answered 500 in the OpenAI shape, and the connection closes after it (the pipelined one is not served)
    assert [r.status for r in resps] == [500] and ex.eof
    assert orjson.loads(resps[0].body)["error"]["code"] == "internal_error"
    assert [r.getMessage().split(" from ")[0] for r in caplog.records] == [
        "handler returned without finishing the response to <Request GET b'/return'"]


@pytest.mark.parametrize(("path", "logged"), [
    ("/return-started", "handler returned without finishing"),
    ("/raise-started", "handler failed on"),
    ("/cancelled-started", None),
])
async def test_a_started_response_that_the_handler_does_not_finish_is_cut_off(
        path: str, logged: str | None, caplog: pytest.LogCaptureFixture) -> None:
    """Once the head and a piece have left, the only honest end is the connection's: aborted, so the
    client sees no terminating chunk (never a 200 that looks complete), and nothing leaks."""
    with caplog.at_level("ERROR", logger="flexinfer.http"):
        async with serve(_Ending()) as server:
            ex = await exchange(server.port, f"GET {path} HTTP/1.1\r\nHost: a\r\n\r\n".encode())
    assert ex.data.startswith(b"HTTP/1.1 200") and b"partial" in ex.data and ex.eof
    assert not ex.data.endswith(b"0\r\n\r\n")
    assert b"secret-internal-detail" not in ex.data
    messages = [r.getMessage() for r in caplog.records]
    if logged is None:
        assert messages == []
    else:
        assert len(messages) == 1 and messages[0].startswith(logged)
        if path.startswith("/raise"):  # with its traceback
            assert caplog.records[0].exc_info is not None and caplog.records[0].exc_info[0] is RuntimeError


class _Custom(RecordingHandler):
    async def handle(self, req: Request, resp: ResponseWriter) -> None:
        if req.path == "/ratelimit":
            resp.send_error(RateLimited("slow down", retry_after=1.2),
                            [(b"Retry-After", b"9"), (b"x-request-id", b"r1")])
        elif req.path == "/inject":
            try:
                resp.start(200, [(b"x-a", b"a\r\nx-evil: 1")])
            except ValueError:
                resp.send(200, [], b"refused")
        elif req.path == "/framing":
            resp.send(200, [(b"Content-Length", b"999"), (b"connection", b"keep-alive"),
                            (b"transfer-encoding", b"chunked")], b"abc")
        elif req.path == "/short":
            resp.start(200, [], content_length=10)
            resp.write(b"abc")
            resp.end()
        elif req.path == "/stream10":
            resp.start(200, [])
            resp.write(b"one")
            resp.write(b"two")
            resp.end()
        elif req.path == "/noend":
            resp.start(200, [])
            resp.write(b"partial")
        elif req.path == "/head":
            resp.send(200, [], b"body-of-head")
        else:
            await super().handle(req, resp)


async def test_send_error_headers_and_keepalive() -> None:
    async with serve(_Custom()) as server:
        ex = await exchange(server.port, b"GET /ratelimit HTTP/1.1\r\nHost: a\r\n\r\n" + GET_CLOSE)
        resps = parse_responses(ex.data)
        assert [r.status for r in resps] == [429, 200]
        r = resps[0]
        assert [v for k, v in r.headers if k == b"retry-after"] == [b"2"]
        assert r.header(b"x-request-id") == b"r1"
        assert r.header(b"x-should-retry") is None  # RateLimited.should_retry is None
        assert r.header(b"content-type") == b"application/json"
        assert orjson.loads(r.body)["error"]["type"] == "rate_limit_error"
        assert r.header(b"date") == responses.date_header()[6:-2]


async def test_response_header_injection_refused() -> None:
    async with serve(_Custom()) as server:
        ex = await exchange(server.port, b"GET /inject HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        assert b"x-evil" not in ex.data
        assert [r.body for r in parse_responses(ex.data)] == [b"refused"]


async def test_core_owns_framing_headers() -> None:
    async with serve(_Custom()) as server:
        ex = await exchange(server.port, b"GET /framing HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        assert ex.data.lower().count(b"content-length") == 1
        assert b"transfer-encoding" not in ex.data.lower()
        assert [r.body for r in parse_responses(ex.data)] == [b"abc"]


async def test_short_body_closes_connection() -> None:
    async with serve(_Custom()) as server:
        ex = await exchange(server.port, b"GET /short HTTP/1.1\r\nHost: a\r\n\r\n")
        r = parse_responses(ex.data)[0]
        assert r.status == 200 and not r.complete and ex.eof


async def test_handler_that_never_ends_is_aborted_without_last_chunk() -> None:
    async with serve(_Custom()) as server:
        ex = await exchange(server.port, b"GET /noend HTTP/1.1\r\nHost: a\r\n\r\n")
        assert ex.eof and not ex.data.endswith(b"0\r\n\r\n")
        assert not parse_responses(ex.data)[0].complete


async def test_head_request_has_no_body() -> None:
    async with serve(_Custom()) as server:
        ex = await exchange(server.port, b"HEAD /head HTTP/1.1\r\nHost: a\r\n\r\n" + GET_CLOSE)
        assert ex.data.count(b"HTTP/1.1 200") == 2
        assert b"body-of-head" not in ex.data
        assert b"content-length: 12\r\n" in ex.data


async def test_http10_keepalive_and_close_delimited_stream() -> None:
    async with serve(_Custom()) as server:
        ex = await exchange(server.port, b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"
                                         b"GET /stream10 HTTP/1.0\r\n\r\n")
        first, _, rest = ex.data.partition(b"ok /")
        assert b"connection: keep-alive\r\n" in first
        assert b"transfer-encoding" not in rest and b"connection: close" in rest
        assert rest.endswith(b"onetwo") and ex.eof


async def test_date_header_cached_and_refreshed_by_tick() -> None:
    line = responses.date_header()
    assert line.startswith(b"date: ") and line.endswith(b" GMT\r\n")
    assert responses.refresh_date(0.0) is True
    assert responses.date_header() == b"date: Thu, 01 Jan 1970 00:00:00 GMT\r\n"
    assert responses.refresh_date(0.5) is False
    responses.refresh_date()
    assert responses.date_header() != b"date: Thu, 01 Jan 1970 00:00:00 GMT\r\n"


def test_http_date_is_what_formatdate_writes_in_each_installed_locale() -> None:
    import locale
    import random
    from email.utils import formatdate

    seconds = [0, 951782400, 4107542399, 1700000000] + [random.randrange(0, 2 ** 32) for _ in range(2000)]
    old = locale.setlocale(locale.LC_TIME)
    try:
        for name in ("de_DE.UTF-8", "fr_FR.UTF-8", "C.UTF-8"):
            try:
                locale.setlocale(locale.LC_TIME, name)
            except locale.Error:
                continue
            assert [responses.http_date(s) for s in seconds] == [formatdate(s, usegmt=True) for s in seconds]
    finally:
        locale.setlocale(locale.LC_TIME, old)


def test_sse_framing() -> None:
    assert responses.sse_event(b'{"a":1}') == b'data: {"a":1}\n\n'
    assert responses.sse_event(b"a\nb") == b"data: a\ndata: b\n\n"
    assert responses.sse_comment("ping") == b": ping\n\n"
    assert responses.status_line(200) == b"HTTP/1.1 200 OK\r\n"
    assert responses.status_line(599) == b"HTTP/1.1 599 \r\n"


# ---- connections ----------------------------------------------------------------------------

async def test_max_connections_503() -> None:
    async with serve(settings=fast_settings(max_connections=2)) as server:
        held = [await asyncio.open_connection(HOST, server.port) for _ in range(2)]
        await until(lambda: server.stats.connections_active == 2)
        ex = await exchange(server.port, b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
        assert [r.status for r in parse_responses(ex.data)] == [503]
        assert server.stats.rejections == {"too_many_connections": 1}
        for _, w in held:
            w.close()


async def test_client_disconnect_fires_on_disconnect_and_drain_raises() -> None:
    got: list[str] = []

    class H(RecordingHandler):
        async def handle(self, req: Request, resp: ResponseWriter) -> None:
            resp.on_disconnect(lambda: got.append("cb"))
            resp.start(200, [])
            try:
                for _ in range(1000):
                    resp.write(b"x" * 1024)
                    await resp.drain()
                    await asyncio.sleep(0.01)
            except ClientGone:
                got.append("gone")
                return
            resp.end()

    async with serve(H()) as server:
        reader, writer = await asyncio.open_connection(HOST, server.port)
        writer.write(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
        await reader.readuntil(b"\r\n\r\n")
        writer.transport.abort()
        assert await until(lambda: got == ["cb", "gone"], timeout=2.0), got
        assert await until(lambda: server.stats.connections_active == 0)


async def test_half_close_counts_as_disconnect() -> None:
    handler = RecordingHandler()
    async with serve(handler) as server:
        reader, writer = await asyncio.open_connection(HOST, server.port)
        writer.write(b"GET /forever HTTP/1.1\r\nHost: a\r\n\r\n")
        await reader.readuntil(b"first\n\n")
        writer.write_eof()
        assert await until(lambda: handler.disconnects == 1)
        writer.close()


async def test_write_backpressure_bounds_transport_buffer() -> None:
    state: dict[str, int] = {"max": 0, "written": 0}

    class H(RecordingHandler):
        async def handle(self, req: Request, resp: ResponseWriter) -> None:
            resp.start(200, [], content_length=8 * 1024 * 1024)
            tr = resp._transport
            for _ in range(128):
                resp.write(b"x" * 65536)
                state["written"] += 65536
                state["max"] = max(state["max"], tr.get_write_buffer_size())
                await resp.drain()
            resp.end()

    async with serve(H()) as server:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
        sock.connect((HOST, server.port))
        sock.setblocking(False)
        reader, writer = await asyncio.open_connection(sock=sock)
        writer.write(b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        await asyncio.sleep(0.3)  # not reading: the server must stop at the high-water mark
        assert state["written"] < 8 * 1024 * 1024
        conn = next(iter(server._connections))
        assert conn.flow.write_paused
        total = 0
        while chunk := await reader.read(1 << 20):
            total += len(chunk)
        writer.close()
        assert total > 8 * 1024 * 1024
        assert state["max"] <= 64 * 1024 + 65536


# ---- drain -----------------------------------------------------------------------------------

async def test_drain_lets_stream_finish_and_refuses_new_connections() -> None:
    handler = RecordingHandler()
    async with serve(handler) as server:
        port = server.port
        idle_r, idle_w = await asyncio.open_connection(HOST, port)
        idle_w.write(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
        await idle_r.readuntil(b"ok /")
        reader, writer = await asyncio.open_connection(HOST, port)
        writer.write(b"GET /stream?n=10&d=0.05 HTTP/1.1\r\nHost: a\r\n\r\n")
        await reader.readuntil(b"data: 0\n\n")
        drain = asyncio.ensure_future(server.drain_and_close(5.0))
        await asyncio.sleep(0.05)
        assert server.draining
        assert await asyncio.wait_for(idle_r.read(), 1.0) == b""  # idle keep-alive closed at once
        with pytest.raises(OSError):
            await asyncio.open_connection(HOST, port)
        rest = await asyncio.wait_for(reader.read(), 3.0)
        assert b"data: 9\n\n" in rest and rest.endswith(b"0\r\n\r\n")
        await asyncio.wait_for(drain, 3.0)
        idle_w.close()
        writer.close()
        assert server.connections == 0
        assert handler.disconnects == 0


async def test_drain_timeout_aborts_streams_and_new_requests_get_503() -> None:
    handler = RecordingHandler()
    async with serve(handler) as server:
        reader, writer = await asyncio.open_connection(HOST, server.port)
        writer.write(b"GET /forever HTTP/1.1\r\nHost: a\r\n\r\n")
        await reader.readuntil(b"first\n\n")
        half_r, half_w = await asyncio.open_connection(HOST, server.port)
        half_w.write(b"GET / HTTP/1.1\r\n")
        await asyncio.sleep(0.05)
        t0 = time.monotonic()
        drain = asyncio.ensure_future(server.drain_and_close(0.4))
        await asyncio.sleep(0.05)
        half_w.write(b"Host: a\r\n\r\n")
        late = await asyncio.wait_for(half_r.read(), 2.0)
        assert [r.status for r in parse_responses(late)] == [503]
        assert orjson.loads(parse_responses(late)[0].body)["error"]["code"] == "shutting_down"
        await asyncio.wait_for(drain, 3.0)
        assert 0.35 <= time.monotonic() - t0 < 3.0
        tail = await asyncio.wait_for(reader.read(), 1.0)
        writer.close()
        half_w.close()
        assert not tail.endswith(b"0\r\n\r\n")
        assert handler.disconnects == 1


# ---- request view ----------------------------------------------------------------------------

async def test_request_view_and_on_headers_bug_is_500() -> None:
    seen: list[Request] = []

    class H(RecordingHandler):
        def on_headers(self, req: Request) -> None:  # type: ignore[override]
            seen.append(req)
            if req.path == "/bug":
                raise KeyError("secret-bug")
            req.ctx = "from-on-headers"

        async def handle(self, req: Request, resp: ResponseWriter) -> None:
            self.handled.append(req)
            resp.send(200, [], str(req.ctx).encode())

    handler = H()
    async with serve(handler) as server:
        ex = await exchange(server.port, b"POST /v1/chat?x=1&y=2 HTTP/1.1\r\nHost: a\r\n"
                                         b"Content-Type: Application/JSON; charset=utf-8\r\n"
                                         b"X-Trail:  padded \t\r\nContent-Length: 2\r\n\r\n{}")
        assert [r.body for r in parse_responses(ex.data)] == [b"from-on-headers"]
        req = handler.handled[0]
        assert (req.method, req.path, req.query, req.version) == ("POST", "/v1/chat", "x=1&y=2", "1.1")
        assert req.target == b"/v1/chat?x=1&y=2"
        assert req.content_type == b"application/json"
        assert req.get(b"x-trail") == b"padded"
        assert req.get(b"missing", b"d") == b"d"
        assert all(name == name.lower() for name, _ in req.headers)
        assert req.body == b"{}" and req.keep_alive
        assert req.peer.startswith("127.0.0.1:")

        ex = await exchange(server.port, b"GET /bug HTTP/1.1\r\nHost: a\r\n\r\n")
        resps = parse_responses(ex.data)
        assert [r.status for r in resps] == [500]
        assert b"secret-bug" not in ex.data and b"Traceback" not in ex.data
        assert len(handler.handled) == 1
        assert server.stats.rejections == {"internal_error": 1}


async def test_pipelining_client_that_never_reads_is_bounded_then_dropped() -> None:
    """R11: pipelined requests, responses never read: we stop answering and reading at the write
    high-water mark, and drop the connection at the stall deadline (keepalive_timeout)."""
    blob = b"b" * (256 * 1024)

    class H(RecordingHandler):
        async def handle(self, req: Request, resp: ResponseWriter) -> None:
            self.handled.append(req)
            resp.send(200, [], blob)

    handler = H()
    async with serve(handler, fast_settings(keepalive_timeout=0.6)) as server:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
        sock.connect((HOST, server.port))
        sock.setblocking(False)
        _reader, writer = await asyncio.open_connection(sock=sock)
        writer.write(b"GET /blob HTTP/1.1\r\nHost: a\r\n\r\n" * 60)  # 15 MiB of responses asked
        assert await until(lambda: server.connections == 1)
        conn = next(iter(server._connections))
        assert await until(lambda: conn._write_wait, timeout=3.0)
        served = len(handler.handled)
        await asyncio.sleep(0.2)
        assert len(handler.handled) == served < 60  # nothing more answered while stalled
        assert conn._transport.get_write_buffer_size() <= 64 * 1024 + len(blob) + 1024
        assert await until(lambda: server.connections == 0, timeout=3.0)  # dropped at the stall deadline
        writer.close()


async def test_pipelining_slow_reader_gets_every_response_in_order() -> None:
    class H(RecordingHandler):
        async def handle(self, req: Request, resp: ResponseWriter) -> None:
            resp.send(200, [], req.path.encode() * 20000)

    async with serve(H()) as server:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
        sock.connect((HOST, server.port))
        sock.setblocking(False)
        reader, writer = await asyncio.open_connection(sock=sock)
        n = 40
        writer.write(b"".join(b"GET /%02d HTTP/1.1\r\nHost: a\r\n\r\n" % i for i in range(n - 1))
                     + b"GET /%02d HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n" % (n - 1))
        await asyncio.sleep(0.3)  # let the server stall on its write buffer
        data = await asyncio.wait_for(reader.read(), 5.0)
        assert [r.body[:3] for r in parse_responses(data)] == [b"/%02d" % i for i in range(n)]
        writer.close()
