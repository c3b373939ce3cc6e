"""headscan: the framing check of a head we wrote and where a request head ends (with its version), compiled twin against the reference."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import httptools
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from flexinfer.http.client import _framing, _ProtocolViolation
from flexinfer.http.head import Rejected, read_headers, request_line
from tests.speedups.conftest import load


@pytest.fixture
def headscan(impl: str) -> ModuleType:
    return load("headscan", impl)


HEAD = b"HTTP/1.1 200 OK\r\ndate: x\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n"


@pytest.mark.parametrize(("head", "lines", "ok"), [
    (HEAD, 5, True),
    (HEAD, 4, False),
    (HEAD, 6, False),
    (b"", 0, True),
    (b"", 1, False),
    (b"\r\n", 1, True),
    (HEAD.replace(b"date: x", b"date: x\ny"), 5, False),  # an LF in a value
    (HEAD.replace(b"date: x", b"date: x\ry"), 5, False),  # a CR in a value
    (HEAD.replace(b"date: x", b"date: x\r\ny"), 5, False),  # a CRLF in a value: a header smuggled in
    (HEAD.replace(b"date: x", b"date: x\x00"), 5, False),  # a NUL
    (HEAD.replace(b"\r\n\r\n", b"\n\r\r\n"), 5, True),  # the counts are what is checked, not the order
    (b"a\nb\nc\n\r\r\r", 3, True),
    (b"\r\n" * 1000, 1000, True),
    (b"\r\n" * 1000, 999, False),
])
def test_cases(headscan: ModuleType, head: bytes, lines: int, ok: bool) -> None:
    assert headscan.head_lines_ok(head, lines) is ok


_PIECES = st.sampled_from([b"\r\n", b"\r", b"\n", b"\x00", b"a", b"content-type: x", b": ", b"\xff", b"\r\n\r\n"])


@given(st.lists(_PIECES, max_size=60), st.integers(0, 40))
@settings(max_examples=1000, deadline=None)
def test_twins_agree(pieces: list[bytes], lines: int) -> None:
    head = b"".join(pieces)
    expected = head.count(b"\n") == lines and head.count(b"\r") == lines and b"\x00" not in head
    assert load("headscan", "py").head_lines_ok(head, lines) is expected
    try:
        c = load("headscan", "c")
    except pytest.skip.Exception:
        return
    assert c.head_lines_ok(head, lines) is expected
    assert c.head_lines_ok(head, head.count(b"\n")) is (head.count(b"\n") == head.count(b"\r")
                                                        and b"\x00" not in head)


def test_rejects_non_bytes(headscan: ModuleType) -> None:
    with pytest.raises(TypeError):
        headscan.head_lines_ok("\r\n", 1)


# ---- head_block: the head built from the caller's lines and a header list, or None -----------------

RULES = {b"content-length": True, b"transfer-encoding": True, b"connection": False}
LEAD = (b"POST", b" ", b"/v1/chat/completions", b" HTTP/1.1\r\n")
TAIL = (b"host: up:8000\r\n", b"content-length: 2\r\n\r\n")


def _expected(lead: tuple[bytes, ...], headers: Any, rules: dict[bytes, bool], tail: tuple[bytes, ...],
              lines: int) -> bytes | None:
    """head_block's contract written out once more, naively (the oracle both twins answer to)."""
    if type(headers) not in (list, tuple) or len(headers) > 64:
        return None
    out = b""
    for item in headers:
        if type(item) is not tuple or len(item) != 2:
            return None
        name, value = item
        if type(name) is not bytes or type(value) is not bytes or not name:
            return None
        if any(c not in b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyz" for c in name):
            return None
        if name in rules:
            if rules[name] is True:
                continue
            return None
        if any(c in b"\r\n\x00" for c in value):
            return None
        out += name + b": " + value + b"\r\n"
    if any(type(piece) is not bytes for piece in (*lead, *tail)):
        return None
    edges = b"".join(lead) + b"".join(tail)
    if edges.count(b"\r") != lines or edges.count(b"\n") != lines or b"\x00" in edges:
        return None
    return b"".join(lead) + out + b"".join(tail)


@pytest.mark.parametrize(("headers", "built"), [
    ([], True),
    ((), True),
    ([(b"content-type", b"application/json"), (b"x-request-id", b"abc")], True),
    ([(b"content-length", b"9"), (b"transfer-encoding", b"chunked")], True),  # left out
    ([(b"content-length", b"a\r\nx-evil: 1")], True),  # left out: its value is not looked at
    ([(b"x", b"")], True),  # an empty value
    ([(b"Content-Type", b"x")], False),  # upper case: the caller's builder
    ([(b"", b"x")], False),  # an empty name
    ([(b"bad name", b"x")], False),
    ([(b"bad:name", b"x")], False),
    ([(b"caf\xe9", b"x")], False),
    ([(b"x", b"a\r\nx-evil: 1")], False),  # response splitting
    ([(b"x", b"a\nb")], False),
    ([(b"x", b"a\rb")], False),
    ([(b"x", b"a\x00b")], False),
    ([(b"x", b"01234567" * 3 + b"\r")], False),  # past the whole words: the bytes left over
    ([(b"x", b"01234567" + b"\n" + b"01234567")], False),  # in the second word
    ([(b"x", b"\x8a\x8d\x80\x0b\x0c\x0e\x09\x0f" * 2)], True),  # near misses (a word-wise false alarm at most)
    ([(b"x\r\ny", b"1")], False),
    ([(b"connection", b"x-hop")], False),  # the rules say: the caller's builder
    ([[b"x", b"1"]], False),  # a list, not a tuple
    ([(b"x", b"1", b"2")], False),
    ([(b"x", "1")], False),
    ([(b"x", bytearray(b"1"))], False),
    ([(b"x", b"1")] * 64, True),
    ([(b"x", b"1")] * 65, False),
])
def test_head_block_cases(headscan: ModuleType, headers: list[tuple[bytes, bytes]], built: bool) -> None:
    head = headscan.head_block(LEAD, headers, RULES, TAIL, 4)
    assert head == _expected(LEAD, headers, RULES, TAIL, 4)
    assert (head is not None) is built
    if head is not None:
        assert head.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
        assert head.endswith(b"host: up:8000\r\ncontent-length: 2\r\n\r\n")
        assert head_lines_count(head) == 4 + sum(1 for n, _ in headers if n not in RULES)


def head_lines_count(head: bytes) -> int:
    assert head.count(b"\r") == head.count(b"\n")
    return head.count(b"\n")


@pytest.mark.parametrize(("lead", "tail", "lines", "built"), [
    (LEAD, TAIL, 4, True),
    (LEAD, TAIL, 3, False),  # the caller's own lines are counted too
    (LEAD, TAIL, 5, False),
    (LEAD, (b"host: up\r\nx-evil: 1\r\n", b"\r\n"), 3, False),  # a CRLF smuggled in a caller's line
    (LEAD, (b"host: up\x00\r\n", b"\r\n"), 3, False),
    ((b"GET /", b" HTTP/1.1\r\n"), (b"\r\n",), 2, True),
    ((b"GET /", " HTTP/1.1\r\n"), (b"\r\n",), 2, False),  # not bytes
    ((), (), 0, True),
])
def test_head_block_checks_the_callers_lines(headscan: ModuleType, lead: tuple[bytes, ...],
                                              tail: tuple[bytes, ...], lines: int, built: bool) -> None:
    headers = [(b"x-a", b"1")]
    head = headscan.head_block(lead, headers, RULES, tail, lines)
    assert (head is not None) is built
    assert head == _expected(lead, headers, RULES, tail, lines)


def test_head_block_takes_lists_and_tuples_only(headscan: ModuleType) -> None:
    assert headscan.head_block(LEAD, [(b"x", b"1")], RULES, TAIL, 4) is not None
    assert headscan.head_block(LEAD, iter([(b"x", b"1")]), RULES, TAIL, 4) is None
    assert headscan.head_block(LEAD, {(b"x", b"1")}, RULES, TAIL, 4) is None


_NAMES = st.sampled_from([b"x-a", b"content-type", b"content-length", b"connection", b"transfer-encoding",
                          b"X-Up", b"", b"a b", b"a\r\nb", b"~!#$%&'*+-.^_`|", b"\xff", b"a:b"])
_VALUES = st.sampled_from([b"", b"v", b"application/json", b"a\r\nx-evil: 1", b"a\nb", b"\r", b"\x00",
                           b"\xff\xfe", b" spaced ", b"a" * 300, b"01234567\x00", b"0123456789abcdef\r\n",
                           b"x" * 40 + b"\n" + b"y" * 7, b"\x8a\x8d\x80" * 5])


@given(st.lists(st.tuples(_NAMES, _VALUES), max_size=70))
@settings(max_examples=1000, deadline=None)
def test_head_block_twins_agree_with_the_contract(headers: list[tuple[bytes, bytes]]) -> None:
    """Both twins answer what the contract says; a head they build parses back, header for header."""
    import httptools

    expected = _expected(LEAD, headers, RULES, TAIL, 4)
    assert load("headscan", "py").head_block(LEAD, headers, RULES, TAIL, 4) == expected
    try:
        c = load("headscan", "c")
    except pytest.skip.Exception:
        c = None
    if c is not None:
        assert c.head_block(LEAD, headers, RULES, TAIL, 4) == expected
    if expected is None:
        return
    seen: list[tuple[bytes, bytes]] = []

    class _P:
        def on_header(self, name: bytes, value: bytes) -> None:
            seen.append((name, value))

    httptools.HttpRequestParser(_P()).feed_data(expected + b"{}")
    kept = [(n, v.strip(b" \t")) for n, v in headers if n not in RULES]  # (the parser trims the OWS)
    assert [(n, v.strip(b" \t")) for n, v in seen] == [*kept, (b"host", b"up:8000"), (b"content-length", b"2")]


# ---- request_head: where a request head ends, and the version its line plainly names ----------

@pytest.mark.parametrize(("data", "pos", "want"), [
    (b"GET / HTTP/1.1\r\nhost: x\r\n\r\n", 0, (27, "1.1")),
    (b"POST /v1/chat HTTP/1.0\r\n\r\n{}", 0, (26, "1.0")),
    (b"xxGET /a HTTP/1.1\r\n\r\nGET /b HTTP/1.0\r\n\r\n", 2, (21, "1.1")),
    (b"xxGET /a HTTP/1.1\r\n\r\nGET /b HTTP/1.0\r\n\r\n", 21, (40, "1.0")),
    (b"GET / HTTP/1.1\r\nhost: x\r\n", 0, (-1, None)),  # the head has not all arrived
    (b"", 0, (-1, None)),
    (b"GET / HTTP/1.1\r\n\r\n", 30, (-1, None)),  # past the end
    (b"GET / HTTP/1.1\r\n\r\n", -4, (18, "1.1")),  # (a negative start is the start)
    (b"\r\nGET / HTTP/1.1\r\n\r\n", 0, (20, None)),  # an empty line first: the parser decides
    (b"GET / HTTP/1.1\nhost: x\r\n\r\n", 0, (26, None)),  # a bare LF ends the line
    (b"GET /HTTP/1.1\r\n\r\n", 0, (17, None)),  # no target before the version: HTTP/0.9's form
    (b"GET HTTP/1.1\r\n\r\n", 0, (16, None)),  # one space only
    (b"GET / HTTP/1.1 \r\n\r\n", 0, (19, None)),  # a space after the version
    (b"GET / HTTP/2.0\r\n\r\n", 0, (18, None)),
    (b"GET / HTTP/1.2\r\n\r\n", 0, (18, None)),
    (b"GET / http/1.1\r\n\r\n", 0, (18, None)),
    (b"GET / HTTP/1.1\r\nx: y HTTP/1.0\r\n\r\n", 0, (33, "1.1")),  # only the first line counts
    (b"GET /x\nx: a HTTP/1.1\r\n\r\n", 0, (24, None)),  # ... the first LF's line, not the first CRLF's
])
def test_request_head_cases(headscan: ModuleType, data: bytes, pos: int, want: tuple[int, str | None]) -> None:
    assert headscan.request_head(data, pos) == want


def test_request_head_takes_bytes_only(headscan: ModuleType) -> None:
    with pytest.raises(TypeError):
        headscan.request_head(bytearray(b"GET / HTTP/1.1\r\n\r\n"), 0)


# request lines near the valid form (each part valid, missing or wrong), then header-ish pieces
_REQ_LINE = st.tuples(
    st.sampled_from([b"GET", b"POST", b"", b"G\x00T"]),
    st.sampled_from([b" ", b"  ", b"", b"\t"]),
    st.sampled_from([b"/", b"/v1/x?a=b", b"*", b"http://h/p", b"", b"/HTTP/1.1", b"/a b"]),
    st.sampled_from([b" ", b"  ", b"", b"\t"]),
    st.sampled_from([b"HTTP/1.1", b"HTTP/1.0", b"HTTP/1.", b"HTTP/0.9", b"HTTP/2", b"HTTP/1.1 ", b"http/1.1", b""]),
    st.sampled_from([b"\r\n", b"\n", b"\r", b"\r\r\n", b""]),
).map(b"".join)
_REQ_PIECES = st.sampled_from([b"GET", b" ", b"/", b"HTTP/1.1", b"HTTP/1.0", b"\r\n", b"\n", b"\r", b"host: x",
                               b"\r\n\r\n", b"\x00", b"a"])


def _parser_version(head: bytes) -> str | None:
    """The version httptools reads off ``head`` at headers-complete, None when it refuses the head
    before that (the server never uses request_head's answer then)."""
    got: list[str] = []

    class Sink:
        def on_headers_complete(self) -> None:
            got.append(parser.get_http_version())

    parser = httptools.HttpRequestParser(Sink())
    try:
        parser.feed_data(head)
    except httptools.HttpParserError:
        pass
    return got[0] if got else None


@given(st.sampled_from([b"", b"\r\n", b"\n"]), _REQ_LINE, st.lists(_REQ_PIECES, max_size=8), st.integers(0, 3))
@example(b"", b"GET /HTTP/1.1\r\n", [], 0)  # HTTP/0.9's form: the parser reads 0.9
@example(b"", b"GET /\r\n", [b"a HTTP/1.1", b"\r\n"], 1)
@settings(max_examples=3000, deadline=None)
def test_request_head_twins_agree_and_never_contradict_the_parser(first: bytes, line: bytes, pieces: list[bytes],
                                                                  lead: int) -> None:
    data = b"x" * lead + first + line + b"".join(pieces) + b"\r\n\r\n"
    want = load("headscan", "py").request_head(data, lead)
    try:
        assert load("headscan", "c").request_head(data, lead) == want
    except pytest.skip.Exception:
        pass
    end, version = want
    assert end == data.find(b"\r\n\r\n", lead) + 4
    if version is not None:  # where the parser takes the head, it reads the same version
        parsed = _parser_version(data[lead:end])
        assert parsed is None or parsed == version, (data, parsed, version)


@pytest.mark.parametrize("version", ["1.1", "1.0"])
@pytest.mark.parametrize("target", [b"/", b"/v1/chat/completions?x=1", b"*", b"http://h:1/p"])
def test_request_head_version_is_the_parsers(headscan: ModuleType, version: str, target: bytes) -> None:
    head = b"OPTIONS " + target + b" HTTP/" + version.encode() + b"\r\nhost: h\r\n\r\n"
    assert headscan.request_head(head, 0) == (len(head), version)
    assert _parser_version(head) == version


def _twins_read(fn: str, *args: Any) -> Any:
    """headscan's ``fn`` on ``args`` from the reference twin, the compiled twin's answer checked
    against it where the build is there."""
    want = getattr(load("headscan", "py"), fn)(*args)
    try:
        assert getattr(load("headscan", "c"), fn)(*args) == want
    except pytest.skip.Exception:
        pass
    return want


# ---- request_fields: a plainly written request head read without the parser ----------------------
_PLAIN = (b"POST /v1/chat/completions?stream=1 HTTP/1.1\r\nHost: proxy:8080\r\nContent-Type:  application/json\r\n"
          b"Content-Length: 2\t \r\nX-Empty:\r\nAuthorization: Bearer a.b-c_d~e\r\n\r\n")


@pytest.mark.parametrize(("head", "want"), [
    (_PLAIN, (b"POST", b"/v1/chat/completions?stream=1",
              [(b"Host", b"proxy:8080"), (b"Content-Type", b"application/json"), (b"Content-Length", b"2\t "),
               (b"X-Empty", b""), (b"Authorization", b"Bearer a.b-c_d~e")])),
    (b"GET / HTTP/1.1\r\n\r\n", (b"GET", b"/", [])),
    (b"DELETE /a/%2F;p=1:@!$&'()*+,= HTTP/1.1\r\nA: \t \r\n\r\n", (b"DELETE", b"/a/%2F;p=1:@!$&'()*+,=", [(b"A", b"")])),
    (b"OPTIONS /x HTTP/1.1\r\nproxy-connectio: close\r\n\r\n", (b"OPTIONS", b"/x", [(b"proxy-connectio", b"close")])),
    # not plain: the parser decides
    (b"GET / HTTP/1.0\r\n\r\n", None),
    (b"CONNECT / HTTP/1.1\r\n\r\n", None),
    (b"TRACE / HTTP/1.1\r\n\r\n", None),
    (b"get / HTTP/1.1\r\n\r\n", None),
    (b"GETS / HTTP/1.1\r\n\r\n", None),
    (b"GET * HTTP/1.1\r\n\r\n", None),
    (b"GET http://h/ HTTP/1.1\r\n\r\n", None),
    (b"GET /a#f HTTP/1.1\r\n\r\n", None),
    (b"GET /a\"b HTTP/1.1\r\n\r\n", None),
    (b"GET /\xc3\xa9 HTTP/1.1\r\n\r\n", None),
    (b"GET  / HTTP/1.1\r\n\r\n", None),
    (b"GET / HTTP/1.1 \r\n\r\n", None),
    (b"GET / HTTP/1.1\n\r\n", None),
    (b"GET / HTTP/1.1\r\nA: b\n\r\n", None),
    (b"GET / HTTP/1.1\r\nA: b\rc\r\n\r\n", None),
    (b"GET / HTTP/1.1\r\nA : b\r\n\r\n", None),
    (b"GET / HTTP/1.1\r\n A: b\r\n\r\n", None),
    (b"GET / HTTP/1.1\r\nA: b\r\n c\r\n\r\n", None),  # obs-fold
    (b"GET / HTTP/1.1\r\n: b\r\n\r\n", None),
    (b"GET / HTTP/1.1\r\nA_B: b\r\n\r\n", None),
    (b"GET / HTTP/1.1\r\nA.B: b\r\n\r\n", None),
    (b"GET / HTTP/1.1\r\nA: b\xff\r\n\r\n", None),  # obs-text
    (b"GET / HTTP/1.1\r\nA: b\x7f\r\n\r\n", None),
    (b"GET / HTTP/1.1\r\nA: b\x00\r\n\r\n", None),
    (b"GET / HTTP/1.1\r\nA\r\n\r\n", None),
    (b"GET / HTTP/1.1\r\nProxy-Connection: keep-alive\r\n\r\n", None),
    (b"GET / HTTP/1.1\r\nPROXY-connection: close\r\n\r\n", None),
])
def test_request_fields_cases(headscan: ModuleType, head: bytes, want: object) -> None:
    assert headscan.request_fields(head, 0, len(head)) == want
    lead = b"x" * 5 + head + b"tail"
    assert headscan.request_fields(lead, 5, 5 + len(head)) == want


def test_request_fields_bounds(headscan: ModuleType) -> None:
    head = b"GET / HTTP/1.1\r\nA: b\r\n\r\n"
    assert headscan.request_fields(head, 0, len(head) - 1) is None  # end not after a CRLF
    assert headscan.request_fields(head, 0, len(head) + 1) is None  # end past the data
    assert headscan.request_fields(head, -1, len(head)) is None
    assert headscan.request_fields(head, 0, 18) is None  # the head cut inside its field line
    assert headscan.request_fields(b"GET / HTTP/1.1\r\n", 0, 16) is None  # no blank line in it
    with pytest.raises(TypeError):
        headscan.request_fields(bytearray(head), 0, len(head))


def test_request_fields_hands_back_the_same_method_objects(headscan: ModuleType) -> None:
    for m in (b"GET", b"POST", b"PUT", b"DELETE", b"HEAD", b"OPTIONS", b"PATCH"):
        head = m + b" / HTTP/1.1\r\n\r\n"
        got = headscan.request_fields(head, 0, len(head))
        assert got is not None and got[0] == m and got[0] is headscan.PLAIN_METHODS[m]


class _Fields:
    """httptools callbacks: the method, target, fields and version as the server's parser reads them."""

    def __init__(self) -> None:
        self.url = b""
        self.fields: list[tuple[bytes, bytes]] = []
        self.head: tuple[bytes, str, bool] | None = None
        self.parser = httptools.HttpRequestParser(self)

    def on_url(self, piece: bytes) -> None:
        self.url += piece

    def on_header(self, name: bytes, value: bytes) -> None:
        self.fields.append((name, value))

    def on_headers_complete(self) -> None:
        p = self.parser
        self.head = (p.get_method(), p.get_http_version(), p.should_keep_alive())


_VALID_METHODS = [b"GET", b"POST", b"PUT", b"DELETE", b"HEAD", b"OPTIONS", b"PATCH"]
# mostly what the fast path reads, with every kind of byte it must leave to the parser mixed in
_F_METHOD = st.sampled_from(_VALID_METHODS * 4 + [b"CONNECT", b"TRACE", b"GETX", b"get", b"PRI"])
_F_TARGET = st.lists(st.sampled_from([b"/", b"a", b"Z", b"0", b"-", b".", b"_", b"~", b"!", b"$", b"&", b"'", b"(",
                                      b")", b"*", b"+", b",", b";", b"=", b":", b"@", b"?", b"%"] * 3
                                     + [b"#", b'"', b"<", b"\\", b"^", b"`", b"{", b"|", b" ", b"\x7f", b"\x80",
                                        b"\t"]),
                     max_size=12).map(lambda p: b"/" + b"".join(p))
_F_NAME = st.sampled_from([b"content-length", b"Content-Type", b"Connection", b"X-A", b"accept", b"User-Agent"] * 3
                          + [b"Host", b"Proxy-Connection", b"Transfer-Encoding", b"Expect", b"Upgrade", b"x_a", b"x.a",
                             b"", b"a b", b"\xff", b"9"])
_F_VALUE = st.lists(st.sampled_from([b"a", b" ", b"\t", b"close", b"keep-alive", b"12", b",", b"Close", b"0", b"~",
                                     b'"'] * 3 + [b"\x7f", b"\x00", b"\x80", b"\xff", b"\r", b"\n", b"\x01"]),
                    max_size=5).map(b"".join)
_F_LINE_END = st.sampled_from([b"\r\n"] * 20 + [b"\n", b"\r", b"\r\n "])
_F_COLON = st.sampled_from([b":", b": ", b": ", b":\t ", b" :"])


@given(_F_METHOD, _F_TARGET, st.sampled_from([b" HTTP/1.1"] * 6 + [b" HTTP/1.0", b" HTTP/1.1 ", b"  HTTP/1.1"]),
       st.lists(st.tuples(_F_NAME, _F_COLON, _F_VALUE, _F_LINE_END), max_size=5),
       st.integers(0, 6), st.integers(0, 3))
@example(b"GET", b"/", b" HTTP/1.1", [(b"Connection", b": ", b"close", b"\r\n")], 0, 0)
@settings(max_examples=4000, deadline=None)
def test_request_fields_twins_agree_and_read_what_the_parser_reads(method: bytes, target: bytes, version: bytes,
                                                                  lines: list[tuple[bytes, bytes, bytes, bytes]],
                                                                  host_at: int, lead: int) -> None:
    """Whatever the fast path would take (request_fields reads it, the head rules pass it), httptools
    takes too and reads the same way (_same_as_the_parser); and the twins agree on every head,
    plain or not. A Host line goes in at ``host_at`` (none past the end)."""
    fields = [n + c + v + e for n, c, v, e in lines]
    if host_at <= len(fields):
        fields.insert(host_at, b"Host: h:1\r\n")
    head = method + b" " + target + version + b"\r\n" + b"".join(fields) + b"\r\n"
    end = head.find(b"\r\n\r\n") + 4
    data = b"x" * lead + head
    want = _twins_read("request_fields", data, lead, lead + end)
    _same_as_the_parser(want, head[:end])


def _same_as_the_parser(want: tuple[bytes, bytes, list[tuple[bytes, bytes]]] | None, head: bytes) -> None:
    """Where the server would take ``want`` without its parser (read, and passed by the head
    rules as its fast path applies them: HttpProtocol._take_plain), httptools takes the same head
    and reads the same method, target, fields, version and keep-alive."""
    if want is None:
        return
    try:
        request_line("1.1", want[0], want[1])
        _, _, length, expect, conn = read_headers(want[2], "1.1", 1 << 20)
    except Rejected:
        return
    if length < 0 or expect or (conn is not None and conn.lower() not in (b"close", b"keep-alive")):
        return
    sink = _Fields()
    sink.parser.feed_data(head)  # raises if the parser refuses what the fast path would take
    assert sink.head is not None
    assert (want[0], "1.1", conn is None or conn.lower() != b"close") == sink.head
    assert (want[1], want[2]) == (sink.url, sink.fields)


@given(st.binary(max_size=60), st.integers(0, 80), st.binary(min_size=1, max_size=3))
@settings(max_examples=3000, deadline=None)
def test_request_fields_mutated_heads(prefix: bytes, at: int, patch: bytes) -> None:
    """A plain head with bytes overwritten anywhere: the twins agree, and what is read the parser reads."""
    head = bytearray(_PLAIN)
    at %= len(head)
    head[at:at + len(patch)] = patch
    data = bytes(head)
    end = data.find(b"\r\n\r\n")
    if end == -1:
        return
    end += 4
    want = _twins_read("request_fields", data, 0, end)
    _same_as_the_parser(want, data[:end])


# ---- response_head: a plainly written response head read without the parser ----------------------
_RESP = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding:  chunked \r\nX-Empty:\r\n\r\n"


@pytest.mark.parametrize(("data", "want"), [
    (_RESP + b"5\r\nhello", (len(_RESP), 200, [(b"content-type", b"text/event-stream"),
                                               (b"transfer-encoding", b"chunked "), (b"x-empty", b"")])),
    (b"HTTP/1.1 503 \r\n\r\n", (17, 503, [])),
    (b"HTTP/1.1 404 Not\tFound here\r\nA-B: c\r\n\r\nrest", (39, 404, [(b"a-b", b"c")])),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n", None),  # no blank line yet
    (b"HTTP/1.0 200 OK\r\n\r\n", None),
    (b"HTTP/1.1 101 Switching Protocols\r\n\r\n", None),
    (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n\r\n", None),
    (b"HTTP/1.1 600 X\r\n\r\n", None),
    (b"HTTP/1.1 20 X\r\n\r\n", None),
    (b"HTTP/1.1 200\r\n\r\n", None),
    (b"HTTP/1.1 200 OK\n\r\n", None),
    (b"HTTP/1.1 200 \xc3\xa9\r\n\r\n", None),
    (b"HTTP/1.1 200 OK\r\nA: \xff\r\n\r\n", None),
    (b"HTTP/1.1 200 OK\r\nA : b\r\n\r\n", None),
    (b"HTTP/1.1 200 OK\r\nA: b\r\n c\r\n\r\n", None),
    (b"HTTP/1.1 200 OK\r\nProxy-Connection: close\r\n\r\n", None),
    (b" HTTP/1.1 200 OK\r\n\r\n", None),
])
def test_response_head_cases(headscan: ModuleType, data: bytes, want: object) -> None:
    assert headscan.response_head(data) == want


def test_response_head_takes_bytes_only(headscan: ModuleType) -> None:
    with pytest.raises(TypeError):
        headscan.response_head(bytearray(b"HTTP/1.1 200 OK\r\n\r\n"))


class _RespFields:
    """httptools' response callbacks: the status, fields (names lower-cased, as the client keeps
    them) and keep-alive as the upstream connection's parser reads them."""

    def __init__(self) -> None:
        self.fields: list[tuple[bytes, bytes]] = []
        self.head: tuple[int, bool] | None = None
        self.parser = httptools.HttpResponseParser(self)

    def on_header(self, name: bytes, value: bytes) -> None:
        self.fields.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self.head = (self.parser.get_status_code(), self.parser.should_keep_alive())


def _response_same_as_the_parser(want: tuple[int, int, list[tuple[bytes, bytes]]] | None, data: bytes) -> None:
    """Where the upstream connection would take ``want`` without its parser (read, and passed by
    the rules _Conn._take_head applies), httptools takes the same head: the same status, fields
    and keep-alive, and no error."""
    if want is None:
        return
    end, status, fields = want
    conns = [v.strip(b" \t").lower() for n, v in fields if n == b"connection"]
    if (len(conns) > 1 or (conns and conns[0] not in (b"close", b"keep-alive"))
            or any(n == b"upgrade" for n, _ in fields) or status in (204, 304)):
        return
    try:
        cl, chunked = _framing(fields)
    except _ProtocolViolation:
        return
    if not chunked and (not cl or cl >= 10**18):
        return
    sink = _RespFields()
    sink.parser.feed_data(data[:end])  # raises if the parser refuses what the plain path would take
    assert sink.head == (status, not conns or conns[0] != b"close")
    assert sink.fields == fields


_R_STATUS = st.sampled_from([b"HTTP/1.1 200 OK", b"HTTP/1.1 404 ", b"HTTP/1.1 503 Busy now"] * 4
                            + [b"HTTP/1.1 204 No", b"HTTP/1.1 101 S", b"HTTP/1.1 100 C", b"HTTP/1.0 200 OK",
                               b"HTTP/1.1 200", b"HTTP/1.1 2000 OK", b"HTTP/1.1 200 O\x7f"])
_R_NAME = st.sampled_from([b"Content-Length", b"transfer-encoding", b"Content-Type", b"Connection", b"X-A",
                           b"Keep-Alive", b"Server"] * 3
                          + [b"Upgrade", b"Proxy-Connection", b"x_a", b"", b"a b", b"\xff"])
_R_VALUE = st.lists(st.sampled_from([b"a", b" ", b"\t", b"close", b"keep-alive", b"12", b"chunked", b",", b"Close",
                                     b"0", b"gzip"] * 3 + [b"\x7f", b"\x00", b"\x80", b"\xff", b"\r", b"\n"]),
                    max_size=4).map(b"".join)


_R_FRAMING = st.sampled_from([b"Content-Length: 12\r\n", b"content-length:7 \r\n", b"Transfer-Encoding: chunked\r\n",
                              b"transfer-encoding:\tChunked\r\n", b"Content-Length: 0\r\n", b""])


@given(_R_STATUS, st.lists(st.tuples(_R_NAME, _F_COLON, _R_VALUE, _F_LINE_END), max_size=5), _R_FRAMING,
       st.integers(0, 5), st.binary(max_size=8))
@example(b"HTTP/1.1 200 OK", [(b"Content-Length", b": ", b"12", b"\r\n")], b"", 0, b"")
@example(b"HTTP/1.1 200 OK", [(b"Connection", b": ", b"close", b"\r\n")], b"Transfer-Encoding: chunked\r\n", 0,
         b"0\r\n\r\n")
@settings(max_examples=4000, deadline=None)
def test_response_head_twins_agree_and_read_what_the_parser_reads(status: bytes,
                                                                 lines: list[tuple[bytes, bytes, bytes, bytes]],
                                                                 framing: bytes, at: int, body: bytes) -> None:
    """Whatever the upstream connection would take without its parser, httptools takes and reads
    alike (_response_same_as_the_parser); the twins agree on every head. A framing line goes in
    at ``at``."""
    fields = [n + c + v + e for n, c, v, e in lines]
    fields.insert(min(at, len(fields)), framing)
    data = status + b"\r\n" + b"".join(fields) + b"\r\n" + body
    want = _twins_read("response_head", data)
    _response_same_as_the_parser(want, data)


@given(st.integers(0, 200), st.binary(min_size=1, max_size=3))
@settings(max_examples=2000, deadline=None)
def test_response_head_mutated(at: int, patch: bytes) -> None:
    head = bytearray(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 17\r\n"
                     b"Connection: keep-alive\r\nServer: x\r\n\r\n{}")
    at %= len(head)
    head[at:at + len(patch)] = patch
    data = bytes(head)
    want = _twins_read("response_head", data)
    _response_same_as_the_parser(want, data)
