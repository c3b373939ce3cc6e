"""A plainly written request read without the parser (HttpProtocol._take_plain): the handler sees
the same request, the client the same answer, as when httptools reads the same bytes; whatever is
not plain, not whole or against a rule goes to the parser and is refused as before.

Each case is sent twice to a real server on a real socket: in one write (the head and body arrive
in one read: the plain path), and cut after its first 5 bytes, 50 ms apart (the head is incomplete
in the first read, so the parser reads all of it). A counting wrapper around httptools'
``HttpRequestParser`` says which path read what.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import re
from collections.abc import Iterator
from typing import Any

import httptools
import orjson
import pytest

from flexinfer.http.head import plain_connection
from flexinfer.http.protocol import Request, ResponseWriter
from tests.http._support import RecordingHandler, counting_parser, exchange, parse_responses, serve

H = b"Host: a\r\n"


_CountingParser = counting_parser(httptools.HttpRequestParser)


@pytest.fixture
def counting(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setattr(httptools, "HttpRequestParser", _CountingParser)
    _CountingParser.fed = 0
    yield _CountingParser


def _seen(req: Request) -> tuple[object, ...]:
    return (req.method, req.target, req.path, req.query, req.version, req.headers, req.keep_alive, req.body,
            req.content_type)


_DATE = re.compile(rb"\r\ndate: [^\r]*", re.IGNORECASE)


async def _run(data: bytes, split: bool, handler: RecordingHandler | None = None,
               ) -> tuple[bytes, list[tuple[object, ...]], list[str], dict[str, int], int, bool]:
    """Send ``data`` whole or cut (see the module docstring): the answer (Date lines out), what the
    handler handled and which paths its on_headers saw, the rejection counters, the bytes the
    parser read, and whether the server closed the connection."""
    handler = handler or RecordingHandler()
    before = _CountingParser.fed
    async with serve(handler) as server:
        payload: bytes | list[bytes] = [data[:5], data[5:]] if split else data
        ex = await exchange(server.port, payload, pace=0.05 if split else 0.0, timeout=0.6)
        rejections = dict(server.stats.rejections)
    return (_DATE.sub(b"", ex.data), [_seen(r) for r in handler.handled], [r.path for r in handler.seen_headers],
            rejections, _CountingParser.fed - before, ex.eof)


PLAIN = [
    pytest.param(b"GET /x?a=1&b=%20 HTTP/1.1\r\n" + H + b"\r\n", id="get-query"),
    pytest.param(b"POST /echo HTTP/1.1\r\n" + H + b"Content-Type:  Application/JSON; charset=utf-8 \r\n"
                 b"Content-Length: 11\r\nX-Trail: v \t\r\nAuthorization: Bearer t\r\n\r\n{\"a\": \"b\"}\n",
                 id="post-body"),
    pytest.param(b"POST /echo HTTP/1.1\r\n" + H + b"Content-Length: 0\r\n\r\n", id="post-empty-body"),
    pytest.param(b"HEAD /h HTTP/1.1\r\n" + H + b"Connection: keep-alive\r\n\r\n", id="head-keep-alive"),
    pytest.param(b"GET /c HTTP/1.1\r\n" + H + b"Connection: Close\r\n\r\nGET /never HTTP/1.1\r\n" + H + b"\r\n",
                 id="close-then-more"),
    pytest.param(b"GET /sleep/0.05 HTTP/1.1\r\n" + H + b"\r\nPOST /echo HTTP/1.1\r\n" + H
                 + b"Content-Length: 3\r\n\r\nabcDELETE /d HTTP/1.1\r\n" + H + b"\r\n", id="pipelined"),
    pytest.param(b"GET /1 HTTP/1.1\r\n" + H + b"\r\nPOST /echo HTTP/1.1\r\n" + H
                 + b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\nGET /3 HTTP/1.1\r\n" + H + b"\r\n",
                 id="plain-chunked-plain"),
    pytest.param(b"GET /1 HTTP/1.1\r\n" + H + b"\r\nGET /2 HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"
                 b"OPTIONS * HTTP/1.1\r\n" + H + b"\r\n", id="plain-then-not-plain"),
    pytest.param(b"\r\nGET /after-empty-line HTTP/1.1\r\n" + H + b"\r\n", id="leading-empty-line"),
]


@pytest.mark.parametrize("data", PLAIN)
async def test_plain_requests_are_read_as_the_parser_reads_them(counting: Any,
                                                                data: bytes) -> None:
    whole = await _run(data, split=False)
    cut = await _run(data, split=True)
    assert whole[1], "nothing was handled"
    assert whole[:4] == cut[:4]
    assert whole[5] == cut[5]
    assert cut[4] > 0  # the parser read the first request there (what follows it may be taken plainly)


async def test_the_plain_path_feeds_the_parser_nothing(counting: Any) -> None:
    # plain requests only (no HEAD: parse_responses would read the next response as its body)
    data = b"".join(p.values[0] for p in PLAIN[:3]) + b"GET /k HTTP/1.1\r\n" + H + b"Connection: keep-alive\r\n\r\n"
    answer, handled, _, rejections, fed, eof = await _run(data, split=False)
    assert len(handled) == 4 and rejections == {} and not eof
    assert [r.status for r in parse_responses(answer)] == [200] * 4
    assert fed == 0
    # what is not plain is read by the parser, from where it begins
    tail = b"OPTIONS * HTTP/1.1\r\n" + H + b"\r\n"
    answer, handled, _, _, fed, _ = await _run(data + tail, split=False)
    assert len(handled) == 5 and fed == len(tail)
    assert [r.status for r in parse_responses(answer)] == [200] * 5


@pytest.mark.parametrize("cuts", [[0], [1], [0, 3, 7], [9]], ids=["head-alone", "one-byte", "pieces", "last-byte"])
async def test_a_body_that_comes_after_its_plain_head_is_read_without_the_parser(counting: Any,
                                                                                 cuts: list[int]) -> None:
    """The head whole in a read, the body in later ones (the openai client's httpx writes the head
    and the body apart): the body is read as it comes, and a request behind it in the last read is
    served too; the parser reads nothing."""
    head = b"POST /echo HTTP/1.1\r\n" + H + b"Content-Length: 10\r\n\r\n"
    body = b"0123456789"
    after = b"GET /next HTTP/1.1\r\n" + H + b"\r\n"
    pieces = [head + body[:cuts[0]]]
    bounds = [*cuts, len(body)]
    pieces += [body[i:j] for i, j in itertools.pairwise(bounds) if j > i]
    pieces[-1] += after
    handler = RecordingHandler()
    async with serve(handler) as server:
        ex = await exchange(server.port, pieces, pace=0.05, timeout=0.4)
    assert [r.body for r in parse_responses(ex.data)] == [body, b"ok /next"]
    assert [r.body for r in handler.handled] == [body, b""]
    assert counting.fed == 0


@pytest.mark.parametrize("cut", [0, 30], ids=["plain", "parser"])
async def test_a_body_that_stops_coming_times_out_alike(counting: Any, cut: int) -> None:
    """A plain head whose body stops short: 408 body_timeout as on the parser path (``cut``: the
    head split inside, so the parser reads it), the handler never called."""
    data = b"POST /echo HTTP/1.1\r\n" + H + b"Content-Length: 10\r\n\r\n0123"
    pieces = [data[:cut], data[cut:]] if cut else [data]
    handler = RecordingHandler()
    async with serve(handler) as server:
        ex = await exchange(server.port, pieces, pace=0.05, timeout=3.0)
        rejections = dict(server.stats.rejections)
    assert [r.status for r in parse_responses(ex.data)] == [408]
    assert ex.eof and handler.handled == [] and rejections == {"body_timeout": 1}
    assert (counting.fed == 0) == (cut == 0)


async def test_a_client_gone_inside_a_plain_body_is_forgotten(counting: Any) -> None:
    handler = RecordingHandler()
    async with serve(handler) as server:
        _, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"POST /echo HTTP/1.1\r\n" + H + b"Content-Length: 10\r\n\r\n01234")
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.close()
        await asyncio.sleep(0.1)
        assert handler.handled == [] and server.connections == 0
        ok = await exchange(server.port, b"GET /after HTTP/1.1\r\n" + H + b"\r\n", timeout=0.3)
    assert [r.body for r in parse_responses(ok.data)] == [b"ok /after"]
    assert counting.fed == 0


NOT_TAKEN = [
    # refused by the parser or by a rule: the answer is the parser path's in both
    pytest.param(b"POST /echo HTTP/1.1\r\n" + H + b"Content-Length: 1\r\nContent-Length: 1\r\n\r\nZ", id="dup-cl"),
    pytest.param(b"POST /echo HTTP/1.1\r\n" + H + b"Content-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\nZ",
                 id="cl-te"),
    pytest.param(b"POST /echo HTTP/1.1\r\n" + H + b"Content-Length: 1 1\r\n\r\nZ", id="cl-space"),
    pytest.param(b"POST /echo HTTP/1.1\r\n" + H + b"Content-Length:\r\n\r\n", id="cl-empty"),
    pytest.param(b"GET / HTTP/1.1\r\n\r\n", id="no-host"),
    pytest.param(b"GET / HTTP/1.1\r\n" + H + H + b"\r\n", id="two-hosts"),
    pytest.param(b"GET / HTTP/1.1\r\n" + H + b"Upgrade: websocket\r\nConnection: upgrade\r\n\r\n", id="upgrade"),
    pytest.param(b"GET / HTTP/1.1\r\n" + H + b"Connection: close, x\r\n\r\n", id="connection-tokens"),
    pytest.param(b"GET / HTTP/1.1\r\n" + H + b"Connection: closex\r\n\r\n", id="connection-other"),
    pytest.param(b"GET / HTTP/1.1\r\n" + H + b"Connection: keep-alive\r\nConnection: close\r\n\r\n",
                 id="connection-twice"),
    pytest.param(b"GET / HTTP/1.1\r\n" + H + b"Proxy-Connection: close\r\n\r\n", id="proxy-connection"),
    pytest.param(b"GET / HTTP/1.1\r\n" + H + b"X_Y: 1\r\n\r\n", id="underscore-name"),
    pytest.param(b"GET / HTTP/1.1\r\n" + H + b"X: \xc3\xa9\r\n\r\n", id="non-ascii-value"),
    pytest.param(b"GET / HTTP/1.1\r\n" + H + b"X: a\r\n b\r\n\r\n", id="obs-fold"),
    pytest.param(b"CONNECT /x HTTP/1.1\r\n" + H + b"\r\n", id="connect"),
    pytest.param(b"POST /echo HTTP/1.1\r\n" + H + b"Content-Length: 99999999999\r\n\r\n", id="body-too-large"),
    pytest.param(b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\n" + H + b"\r\n", id="uri-too-long"),
    pytest.param(b"GET / HTTP/1.1\r\n" + H + b"".join(b"X-%d: v\r\n" % i for i in range(120)) + b"\r\n",
                 id="too-many-headers"),
    pytest.param(b"GET / HTTP/1.1\r\n" + H + b"X: " + b"v" * 70000 + b"\r\n\r\n", id="header-too-large"),
    pytest.param(b"POST /echo HTTP/1.1\r\n" + H + b"Expect: 100-continue\r\nContent-Length: 2\r\n\r\nab",
                 id="expect"),
    pytest.param(b"GET /auth HTTP/1.1\r\n" + H + b"\r\nGET /never HTTP/1.1\r\n" + H + b"\r\n", id="on-headers-401"),
]


@pytest.mark.parametrize("data", NOT_TAKEN)
async def test_what_is_not_taken_is_answered_as_the_parser_path_answers(counting: Any,
                                                                        data: bytes) -> None:
    whole = await _run(data, split=False)
    cut = await _run(data, split=True)
    answer = parse_responses(whole[0])
    assert answer, whole
    assert whole[:4] == cut[:4]
    assert whole[5] == cut[5]
    if answer[-1].status != 401:
        assert whole[4] > 0  # the parser read it (and refused it where a rule is broken)
    if answer[-1].status == 401:
        assert whole[4] == 0 and whole[1] == [] and whole[2] == ["/auth"]  # refused on the plain path


async def test_a_failing_on_headers_on_the_plain_path_is_500_and_logged(counting: Any,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    class Failing(RecordingHandler):
        def on_headers(self, req: Request) -> None:  # type: ignore[override]
            self.seen_headers.append(req)
            if req.path == "/bug":
                raise KeyError("secret-bug")

        async def handle(self, req: Request, resp: ResponseWriter) -> None:
            self.handled.append(req)
            resp.send(200, [], b"ok")

    data = b"GET /fine HTTP/1.1\r\n" + H + b"\r\nGET /bug HTTP/1.1\r\n" + H + b"\r\nGET /never HTTP/1.1\r\n" + H + b"\r\n"
    caplog.set_level(logging.ERROR, "flexinfer.http")
    whole = await _run(data, split=False, handler=Failing())
    logged = [r for r in caplog.records if r.getMessage() == "request callback failed"]
    caplog.clear()
    cut = await _run(data, split=True, handler=Failing())
    assert whole[:4] == cut[:4] and whole[5] == cut[5]
    assert whole[4] == 0
    resps = parse_responses(whole[0])
    assert [r.status for r in resps] == [200, 500]
    assert orjson.loads(resps[1].body)["error"]["code"] == "internal_error"
    assert b"secret-bug" not in whole[0]
    assert whole[2] == ["/fine", "/bug"] and whole[3] == {"internal_error": 1} and whole[5]
    assert len(logged) == 1 and logged[0].exc_info is not None and isinstance(logged[0].exc_info[1], KeyError)


async def test_plain_requests_behind_a_busy_one_are_queued_and_bounded(counting: Any) -> None:
    """Queued plain requests count against the pipeline bound as parsed ones do: past it the parser
    path refuses the connection (pipeline_overflow), in both forms."""
    one = b"GET /q HTTP/1.1\r\n" + H + b"\r\n"
    data = b"GET /sleep/0.1 HTTP/1.1\r\n" + H + b"\r\n" + one * 70
    whole = await _run(data, split=False)
    cut = await _run(data, split=True)
    assert whole[3] == cut[3] == {"pipeline_overflow": 1}
    assert len(whole[1]) == len(cut[1]) == 65
    assert 0 < whole[4] < len(data)  # the parser read only the request past the bound


async def test_requests_answered_alike_when_queued_behind_a_slow_one() -> None:
    """The same bytes, with a slow request ahead: the later plain ones wait in the queue and are
    answered in order."""
    handler = RecordingHandler()
    async with serve(handler) as server:
        data = (b"GET /sleep/0.1 HTTP/1.1\r\n" + H + b"\r\n"
                + b"POST /echo HTTP/1.1\r\n" + H + b"Content-Length: 2\r\n\r\nhi"
                + b"GET /last HTTP/1.1\r\n" + H + b"Connection: close\r\n\r\n")
        ex = await exchange(server.port, data)
    assert [r.body for r in parse_responses(ex.data)] == [b"/sleep/0.1", b"hi", b"ok /last"]
    assert ex.eof and [r.path for r in handler.handled] == ["/sleep/0.1", "/echo", "/last"]
    await asyncio.sleep(0)


@pytest.mark.parametrize(("value", "want"), [
    (None, 1), (b"keep-alive", 1), (b"Keep-Alive", 1), (b" close\t", 0), (b"CLOSE", 0),
    (b"close, x", -1), (b"close,keep-alive", -1), (b"closex", -1), (b"upgrade", -1), (b"", -1),
])
def test_plain_connection_agrees_with_llhttp_where_it_decides(value: bytes | None, want: int) -> None:
    """The one reading of a Connection value both parser-free paths accept: where it decides
    (0 or 1), llhttp's should_keep_alive() says the same of the same request."""
    assert plain_connection(value) == want
    if want >= 0:
        seen: list[bool] = []

        class _Done:
            def on_message_complete(self) -> None:
                seen.append(parser.should_keep_alive())

        parser = httptools.HttpRequestParser(_Done())
        conn = b"" if value is None else b"Connection: " + value + b"\r\n"
        parser.feed_data(b"GET / HTTP/1.1\r\n" + H + conn + b"\r\n")
        assert seen == [want == 1]
