"""headscan: the framing check of a head we wrote, compiled twin against the reference."""

from __future__ import annotations

from types import ModuleType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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
