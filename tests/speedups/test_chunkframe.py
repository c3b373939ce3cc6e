"""chunkframe: one piece of a chunked body, framed; compiled twin against the reference and
against httptools, which must read the piece back."""

from __future__ import annotations

from types import ModuleType

import httptools
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.speedups.conftest import BodySink, load


@pytest.fixture
def chunkframe(impl: str) -> ModuleType:
    return load("chunkframe", impl)


@pytest.mark.parametrize(("prefix", "data", "framed"), [
    (b"", b"x", b"1\r\nx\r\n"),
    (b"", b"y" * 15, b"f\r\n" + b"y" * 15 + b"\r\n"),
    (b"", b"y" * 16, b"10\r\n" + b"y" * 16 + b"\r\n"),  # a second hex digit
    (b"", b"z" * 255, b"ff\r\n" + b"z" * 255 + b"\r\n"),
    (b"", b"z" * 4096, b"1000\r\n" + b"z" * 4096 + b"\r\n"),
    (b"", b"q" * 70000, b"11170\r\n" + b"q" * 70000 + b"\r\n"),
    (b"HTTP/1.1 200 OK\r\n\r\n", b"data: {}\n\n", b"HTTP/1.1 200 OK\r\n\r\na\r\ndata: {}\n\n\r\n"),
    (b"", b"\r\n0\r\n\r\n", b"7\r\n\r\n0\r\n\r\n\r\n"),  # framing bytes in the piece stay the piece's
    (b"", bytearray(b"ab"), b"2\r\nab\r\n"),  # other bytes-likes too
    (b"", memoryview(b"abc"), b"3\r\nabc\r\n"),
])
def test_cases(chunkframe: ModuleType, prefix: bytes, data: bytes, framed: bytes) -> None:
    out = chunkframe.frame_chunk(prefix, data)
    assert type(out) is bytes
    assert out == framed


def test_rejects_non_bytes(chunkframe: ModuleType) -> None:
    with pytest.raises(TypeError):
        chunkframe.frame_chunk(b"", "text")
    with pytest.raises(TypeError):
        chunkframe.frame_chunk("", b"x")


@given(st.lists(st.binary(min_size=1, max_size=600), min_size=1, max_size=8), st.binary(max_size=40))
@settings(max_examples=1000, deadline=None)
def test_twins_agree_and_a_parser_reads_the_pieces_back(pieces: list[bytes], prefix: bytes) -> None:
    twins = [load("chunkframe", "py")]
    try:
        twins.append(load("chunkframe", "c"))
    except pytest.skip.Exception:
        pass
    for mod in twins:
        assert mod.frame_chunk(prefix, pieces[0]) == b"%b%x\r\n%b\r\n" % (prefix, len(pieces[0]), pieces[0])
        sink = BodySink()
        parser = httptools.HttpResponseParser(sink)
        wire = mod.frame_chunk(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n", pieces[0])
        wire += b"".join(mod.frame_chunk(b"", p) for p in pieces[1:]) + b"0\r\n\r\n"
        parser.feed_data(wire)
        assert sink.done and b"".join(sink.body) == b"".join(pieces)
