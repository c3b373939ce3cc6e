"""bodyframe: a chunked response body read without httptools, and where a response head ends.

Both twins against httptools (llhttp), the parser they stand in for: the same payload and the same
end for every valid body however it is split into reads; an error wherever httptools has one
(one deliberate difference: chunk extensions' content, which frames nothing, is not checked); and
the twins against each other on arbitrary bytes."""

from __future__ import annotations

from types import ModuleType

import httptools
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.speedups.conftest import BodySink, chunked_reads, load, split_reads

HEAD = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"


@pytest.fixture
def bodyframe(impl: str) -> ModuleType:
    return load("bodyframe", impl)


def _twins() -> list[ModuleType]:
    twins = [load("bodyframe", "py")]
    try:
        twins.append(load("bodyframe", "c"))
    except pytest.skip.Exception:
        pass
    return twins


def httptools_reads(body: bytes) -> tuple[str, bytes, bool]:
    """("ok" | "error", the payload before the end or the error, whether the body ended)."""
    sink = BodySink()
    parser = httptools.HttpResponseParser(sink)
    try:
        parser.feed_data(HEAD + body)
    except httptools.HttpParserError:
        return "error", b"".join(sink.body), sink.done
    return "ok", b"".join(sink.body), sink.done


CASES = [
    # (body, ok, payload, done)
    (b"5\r\nhello\r\n0\r\n\r\n", True, b"hello", True),
    (b"5;a=b\r\nhello\r\n0\r\n\r\n", True, b"hello", True),
    (b"A\r\n0123456789\r\na\r\n0123456789\r\n0\r\n\r\n", True, b"01234567890123456789", True),
    (b"00000000000000000005\r\nhello\r\n0\r\n\r\n", True, b"hello", True),  # leading zeros
    (b"5\r\nhello\r\n0\r\nX-T: 1\r\nX-U:\r\n\r\n", True, b"hello", True),  # trailers, dropped
    (b"5\r\nhello\r\n", True, b"hello", False),  # not ended yet
    (b"5\r\nhel", True, b"hel", False),
    (b"5 \r\nhello\r\n0\r\n\r\n", False, b"", False),  # space after the size
    (b"5\t\r\nhello\r\n0\r\n\r\n", False, b"", False),
    (b"5 ;a\r\nhello\r\n0\r\n\r\n", False, b"", False),
    (b"0x5\r\nhello\r\n0\r\n\r\n", False, b"", False),
    (b"+5\r\nhello\r\n0\r\n\r\n", False, b"", False),
    (b"-5\r\nhello\r\n0\r\n\r\n", False, b"", False),
    (b"\r\n5\r\nhello\r\n0\r\n\r\n", False, b"", False),  # empty size line
    (b"5\nhello\r\n0\r\n\r\n", False, b"", False),  # bare LF after the size
    (b"5\r\nhelloXX0\r\n\r\n", False, b"hello", False),  # no CRLF after the data
    (b"5\r\nhello\n0\r\n\r\n", False, b"hello", False),
    (b"5\r\nhello\r\r\n0\r\n\r\n", False, b"hello", False),
    (b"ffffffffffffffffff\r\n", False, b"", False),  # overflow
    (b"5;a=\"x\r\"\r\nhello\r\n0\r\n\r\n", False, b"", False),  # CR inside an extension
    (b"5;\x00\r\nhello\r\n0\r\n\r\n", False, b"", False),
    (b"5\r\nhello\r\n0\r\nbad trailer\r\n\r\n", False, b"hello", False),
    (b"5\r\nhello\r\n0\r\n: empty name\r\n\r\n", False, b"hello", False),
    (b"5\r\nhello\r\n0\r\n\n", False, b"hello", False),  # bare LF ending the trailers
    (b"5\r\nhello\r\n0\r\nX-T: 1\n\r\n", False, b"hello", False),
    (b"5\r\nhello\r\n0\r\n\r\r", False, b"hello", False),
]


@pytest.mark.parametrize(("body", "ok", "payload", "done"), CASES)
def test_cases_and_httptools_agrees(bodyframe: ModuleType, body: bytes, ok: bool, payload: bytes, done: bool) -> None:
    verdict, got, ended, _ = chunked_reads(bodyframe, [body])
    assert (verdict == "ok", ended) == (ok, done)
    if ok:
        assert got == payload
    ht_verdict, ht_payload, ht_done = httptools_reads(body)
    assert (ht_verdict == "ok", ht_done) == (ok, done)
    if ok:
        assert ht_payload == payload
    else:
        assert payload.startswith(got)  # what came before the fault, at most


def test_bytes_after_the_end_are_counted_not_read(bodyframe: ModuleType) -> None:
    dec = bodyframe.ChunkedBody(4096)
    assert dec.feed(b"2\r\nhi\r\n0\r\n\r\nHTTP/1.1 200 OK\r\n") == b"hi"
    assert dec.done and dec.extra == len(b"HTTP/1.1 200 OK\r\n")


def test_extension_content_is_not_checked(bodyframe: ModuleType) -> None:
    """The one deliberate difference from llhttp: an extension's bytes (not CR, LF, NUL) frame nothing."""
    body = b"5;a b@c\r\nhello\r\n0\r\n\r\n"
    assert httptools_reads(body)[0] == "error"
    assert chunked_reads(bodyframe, [body]) == ("ok", b"hello", True, 0)


def test_line_limits(bodyframe: ModuleType) -> None:
    assert chunked_reads(bodyframe, [b"5;" + b"e" * 100 + b"\r\nhello\r\n0\r\n\r\n"], max_line=64)[0] == "error"
    assert chunked_reads(bodyframe, [b"0" * 65 + b"5\r\nhello\r\n0\r\n\r\n"], max_line=64)[0] == "error"
    assert chunked_reads(bodyframe, [b"0\r\nX-T: " + b"t" * 100 + b"\r\n\r\n"], max_line=64)[0] == "error"
    assert chunked_reads(bodyframe, [b"0\r\n" + b"X-T: t\r\n" * 20 + b"\r\n"], max_line=64)[0] == "error"
    assert chunked_reads(bodyframe, [b"5;" + b"e" * 50 + b"\r\nhello\r\n0\r\nX: 1\r\n\r\n"], max_line=64)[:3] == (
        "ok", b"hello", True)


def test_payload_is_bytes_and_a_whole_read_of_data_is_not_copied(bodyframe: ModuleType) -> None:
    dec = bodyframe.ChunkedBody(4096)
    assert dec.feed(b"100\r\n") == b""
    data = b"d" * 200
    out = dec.feed(data)
    assert out == data and type(out) is bytes
    assert dec.left == 56
    assert dec.feed(b"d" * 56 + b"\r\n3\r\nabc\r\n2\r\nde\r\n") == b"d" * 56 + b"abcde"
    assert not dec.done


@pytest.mark.parametrize(("data", "end"), [
    (HEAD + b"5\r\n", len(HEAD)),
    (HEAD, len(HEAD)),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: CHUNKED\r\n\r\nx", 47),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi", -1),  # no "chunked": left to the parser
    (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nchunked", -1),  # "chunked" only after the head
    (b"HTTP/1.1 200 OK\ntransfer-encoding: chunked\r\n\r\n", -1),  # a bare LF first
    (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n", -1),  # the head goes on in the next read
    (b"\r\n\r\n", -1),
    (b"", -1),
    (b"\n", -1),
    (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n", -1),
    (b"HTTP/1.1 200 OK\r\nX-Chunked-Thing: 1\r\n\r\n", 39),  # the name anywhere: the parser decides
])
def test_head_end(bodyframe: ModuleType, data: bytes, end: int) -> None:
    assert bodyframe.head_end(data) == end


@given(st.binary(max_size=300))
@settings(max_examples=1000, deadline=None)
def test_head_end_twins_agree(data: bytes) -> None:
    assert len({mod.head_end(data) for mod in _twins()}) == 1
    assert {mod.head_end(HEAD + data) for mod in _twins()} == {len(HEAD)}


_token = st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_", min_size=1, max_size=8)
_ext = st.one_of(st.just(""), st.builds(lambda n, v: f";{n}={v}", _token, _token), st.builds(lambda n: f";{n}", _token))
_chunk = st.tuples(st.binary(min_size=1, max_size=300), _ext, st.integers(0, 3), st.booleans())
_trailer = st.builds(lambda n, v: f"{n}: {v}\r\n".encode(), _token, _token)


def _wire(chunks: list[tuple[bytes, str, int, bool]], trailers: list[bytes]) -> bytes:
    out = b""
    for data, ext, zeros, upper in chunks:
        size = "0" * zeros + (f"{len(data):X}" if upper else f"{len(data):x}")
        out += size.encode() + ext.encode() + b"\r\n" + data + b"\r\n"
    return out + b"0\r\n" + b"".join(trailers) + b"\r\n"


@given(st.lists(_chunk, max_size=12), st.lists(_trailer, max_size=3), st.lists(st.integers(0, 10_000), max_size=12))
@settings(max_examples=1000, deadline=None)
def test_valid_bodies_read_like_httptools_howeversplit_reads(chunks: list[tuple[bytes, str, int, bool]],
                                                        trailers: list[bytes], cuts: list[int]) -> None:
    wire = _wire(chunks, trailers)
    payload = b"".join(c[0] for c in chunks)
    assert httptools_reads(wire) == ("ok", payload, True)
    for mod in _twins():
        assert chunked_reads(mod, split_reads(wire, cuts)) == ("ok", payload, True, 0)


@given(st.lists(st.binary(min_size=1, max_size=40), min_size=1, max_size=5), st.integers(0, 10_000),
       st.sampled_from(["replace", "insert", "delete"]), st.integers(0, 255).filter(lambda b: b != 59),
       st.lists(st.integers(0, 10_000), max_size=4))
@settings(max_examples=2000, deadline=None)
def test_a_mutated_body_is_never_read_otherwise_than_httptools_reads_it(
        pieces: list[bytes], at: int, how: str, byte: int, cuts: list[int]) -> None:
    """One byte changed, added or removed anywhere in a valid body (no extensions, no trailers, and
    no ``;`` put in: an extension's content is where we check less than llhttp): never a body that httptools would not end, nor
    other bytes than httptools delivers; where httptools fails, we fail too, or end the body at
    the same place with the same payload and count the rest as extra (httptools then fails on
    those bytes as the start of a next response: the connection is not reused either way)."""
    wire = _wire([(p, "", 0, False) for p in pieces], [])
    i = at % len(wire)
    mutated = {"replace": wire[:i] + bytes([byte]) + wire[i + 1:], "insert": wire[:i] + bytes([byte]) + wire[i:],
               "delete": wire[:i] + wire[i + 1:]}[how]
    ht_verdict, ht_payload, ht_done = httptools_reads(mutated)
    for mod in _twins():
        verdict, payload, done, extra = chunked_reads(mod, split_reads(mutated, cuts))
        if done:  # we ended the body: httptools ended it too, with the same payload
            assert ht_done and payload == ht_payload
            if ht_verdict == "error":
                assert extra > 0
        elif verdict == "ok":  # we wait for more: so does httptools, with what we have so far
            assert ht_verdict == "ok" and not ht_done and payload == ht_payload
        else:  # we failed: httptools failed, on what it had read so far at most
            assert ht_verdict == "error" and not ht_done
            assert ht_payload.startswith(payload) or payload.startswith(ht_payload)


@given(st.lists(st.binary(max_size=64), max_size=6), st.integers(1, 300))
@settings(max_examples=2000, deadline=None)
def test_twins_agree_on_any_bytes(reads: list[bytes], max_line: int) -> None:
    twins = _twins()
    if len(twins) < 2:
        pytest.skip("bodyframe_c is not built")
    py, c = (mod.ChunkedBody(max_line) for mod in twins)
    for r in reads:
        outs = []
        for mod, dec in zip(twins, (py, c), strict=True):
            try:
                outs.append(("ok", dec.feed(r)))
            except mod.FramingError as exc:
                outs.append(("error", str(exc)))
        assert outs[0] == outs[1]
        assert (py.done, py.extra, py.left) == (c.done, c.extra, c.left)
        if outs[0][0] == "error" or py.done:
            break


# ---- LengthBody: a Content-Length body, read by read ---------------------------------------------

@given(st.integers(1, 300), st.binary(min_size=0, max_size=400), st.lists(st.integers(0, 500), max_size=6))
@settings(max_examples=1500, deadline=None)
def test_length_body_reads_what_httptools_reads_however_split(length: int, wire: bytes, cuts: list[int]) -> None:
    """A Content-Length body fed in any reads: the payloads joined are httptools' body, the end
    comes with the read that carries the last byte, and the bytes after it are counted, not read."""
    sink = BodySink()
    parser = httptools.HttpResponseParser(sink)
    parser.feed_data(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % length)
    parser.feed_data(wire[:length])  # (what follows the body is the next message's, not the body's)
    for twin in _twins():
        body = twin.LengthBody(length)
        out: list[bytes] = []
        fed = 0  # bytes of wire fed, up to the end of the read that ended the body
        for read in split_reads(wire, cuts):
            if body.done:
                break
            out.append(body.feed(read))
            fed += len(read)
            assert body.left == max(0, length - sum(map(len, out)))
        assert b"".join(out) == b"".join(sink.body) == wire[:length]
        assert body.done == sink.done == (len(wire) >= length)
        assert body.extra == (fed - length if body.done else 0)


def test_length_body_hands_over_a_read_without_copying_it(bodyframe: ModuleType) -> None:
    body = bodyframe.LengthBody(10)
    read = b"0123456"
    assert body.feed(read) is read and not body.done and body.left == 3
    assert body.feed(b"") == b"" and body.left == 3
    last = b"789"
    assert body.feed(last) is last and body.done and body.extra == 0
    with pytest.raises(ValueError):
        bodyframe.LengthBody(0)
    with pytest.raises(TypeError):
        bodyframe.LengthBody(3).feed(bytearray(b"abc"))


def test_both_readers_are_body_frames(bodyframe: ModuleType) -> None:
    """The surface the upstream connection holds either reader by (its compiled build cimports
    the C BodyFrame and calls feed, reads done and extra in C): both readers derive from it, the
    base itself reads nothing, and feed refuses None alike in both twins."""
    chunked, length = bodyframe.ChunkedBody(64), bodyframe.LengthBody(3)
    for reader in (chunked, length):
        assert isinstance(reader, bodyframe.BodyFrame)
        assert reader.done is False and reader.extra == 0
        with pytest.raises(TypeError):
            reader.feed(None)
    with pytest.raises(NotImplementedError):
        bodyframe.BodyFrame().feed(b"x")
    assert chunked.feed(b"3\r\nabc\r\n0\r\n\r\nXY") == b"abc" and chunked.done and chunked.extra == 2
    assert length.feed(b"abcd") == b"abc" and length.done and length.extra == 1
