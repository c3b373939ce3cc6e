"""sse_scan: both twins give the same (and the documented) results."""

from __future__ import annotations

from types import ModuleType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.speedups.conftest import load

ROLE = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
TOK = b'data: {"choices":[{"index":0,"delta":{"content":"tok"}}]}\n\n'
USAGE = b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3}}\n\n'
NULL_USAGE = b'data: {"choices":[{"index":0,"delta":{"content":"a"}}],"usage":null}\n\n'


@pytest.fixture(params=("py", "c"))
def ssescan(request: pytest.FixtureRequest) -> ModuleType:
    return load("ssescan", str(request.param))


@pytest.mark.parametrize(("buf", "events", "usage", "whole"), [
    (b"", 0, False, False),
    (ROLE, 0, False, True),
    (TOK, 1, False, True),
    (TOK * 3, 3, False, True),
    (ROLE + TOK + TOK, 2, False, True),
    (USAGE, 0, True, True),
    (NULL_USAGE, 1, False, True),
    (TOK + USAGE + b"data: [DONE]\n\n", 1, True, True),
    (TOK[:-1], 1, False, False),
    (TOK.replace(b"\n\n", b"\r\n\r\n"), 1, False, True),
    (b'data: {"delta": {"content" : "x"}}\n\n', 1, False, True),  # spaced
    (b'data: {"choices":[{"text":"hi"}]}\n\n', 1, False, True),  # completions
    (b'data: {"delta":{"reasoning_content":"hm"}}\n\n', 1, False, True),
    (b'data: {"delta":{"content":"say \\"content\\":\\"x\\""}}\n\n', 1, False, True),  # escaped key in a value
    (b'data: {"delta":{"content":"', 0, False, False),  # cut before the first content byte
    (b'{"usage": {"prompt_tokens":1}}', 0, True, False),
    (b'"usage"x:{', 0, False, False),
    (b'"content"', 0, False, False),
])
def test_documented_cases(ssescan: ModuleType, buf: bytes, events: int, usage: bool, whole: bool) -> None:
    r = ssescan.sse_scan(buf)
    assert (r >> 2, bool(r & ssescan.USAGE_OBJECT), bool(r & ssescan.WHOLE)) == (events, usage, whole)


_ATOMS = [b'"content"', b'"reasoning_content"', b'"text"', b'"usage"', b":", b" ", b"\r\n", b"\n\n", b'"',
          b"{", b"}", b"x", b"null", b"\\", b"data: ", b'""', b"[", b"]", b","]


def _twins() -> tuple[ModuleType, ModuleType]:
    """(py, c), or skip when the compiled twin is not built / switched off."""
    return load("ssescan", "py"), load("ssescan", "c")


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(_ATOMS), max_size=40))
def test_twins_agree(parts: list[bytes]) -> None:
    py, c = _twins()
    buf = b"".join(parts)
    assert c.sse_scan(buf) == py.sse_scan(buf), buf


_USAGE_ATOMS = [b'"usage"', b'"prompt_tokens"', b'"completion_tokens"', b":", b" ", b"{", b"}", b"7", b"42",
                b"null", b",", b'"x"', b"\n", b"9" * 16]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(_USAGE_ATOMS), max_size=30), st.booleans())
def test_parse_usage_twins_agree(parts: list[bytes], as_bytearray: bool) -> None:
    py, c = _twins()
    raw = b"".join(parts)
    buf: bytes | bytearray = bytearray(raw) if as_bytearray else raw
    assert c.parse_usage(buf) == py.parse_usage(buf), raw


def test_parse_usage_documented(ssescan: ModuleType) -> None:
    assert ssescan.parse_usage(b'{"usage":{"prompt_tokens":7,"completion_tokens":9}}') == (7, 9)
    assert ssescan.parse_usage(bytearray(b'{"usage": {"prompt_tokens" : 3, "d": {"x": 1}, "completion_tokens": 2}}')) == (3, 2)
    assert ssescan.parse_usage(b'{"usage":null}') is None
    assert ssescan.parse_usage(b'{"usage":{"completion_tokens":1}}') == (-1, 1)
    assert ssescan.parse_usage(b'{"usage":{"prompt_tokens":12345678901234567890}}') == (10**9, 0)


_EVENT_ATOMS = [*_ATOMS, b"\r", b"\n", b"\r\n\r\n", b"\n\r\n", b"\r\n\n", b"\f", b'"choices"', b"[ ]",
                b'data: {"choices":[],"usage":{"prompt_tokens":1}}\n\n', b"data:"]


@settings(max_examples=600, deadline=None)
@given(st.lists(st.sampled_from(_EVENT_ATOMS), max_size=40), st.integers(-2, 60), st.booleans())
def test_event_end_and_usage_cuts_twins_agree(parts: list[bytes], pos: int, mid: bool) -> None:
    py, c = _twins()
    buf = b"".join(parts)
    assert py.event_end(buf, pos) == c.event_end(buf, pos)
    assert py.usage_cuts(buf, mid) == c.usage_cuts(buf, mid)


def test_event_end_is_the_leftmost_blank_line(ssescan: ModuleType) -> None:
    """The first ``\\r?\\n\\r?\\n`` at or after ``pos``, as a regex scan finds it (its end)."""
    import re
    blank = re.compile(rb"\r?\n\r?\n")
    for buf in (b"a\n\nb", b"a\r\n\r\nb", b"a\n\r\n\nb", b"\n\n\n", b"a\r\n\nb", b"a\n\rb\n\n", b"abc", b"a\n", b"a\r\n\r"):
        for pos in range(len(buf) + 1):
            m = blank.search(buf, pos)
            assert ssescan.event_end(buf, pos) == (m.end() if m else -1), (buf, pos)


def test_usage_cuts_documented(ssescan: ModuleType) -> None:
    stream = TOK + USAGE + b"data: [DONE]\n\n"
    a = len(TOK)
    assert ssescan.usage_cuts(stream, False) == (len(stream), False, [a, a + len(USAGE)])
    # the first event is the rest of one let through: never cut, and mid ends with it
    assert ssescan.usage_cuts(USAGE + TOK, True) == (len(USAGE + TOK), False, [])
    # no whole event: nothing, mid kept; a usage object with choices is not the usage-only event
    assert ssescan.usage_cuts(USAGE[:-1], True) == (0, True, [])
    assert ssescan.usage_cuts(NULL_USAGE + b'data: {"choices":[{"x":1}],"usage":{"a":1}}\n\n', False)[2] == []
    crlf = USAGE.replace(b"\n", b"\r\n")
    assert ssescan.usage_cuts(crlf, False) == (len(crlf), False, [0, len(crlf)])


# The compiled scan reads the colons of sixteen bytes at a time, by one SSE2 compare on x86-64 or
# byte by byte elsewhere ("portable"): both against the bytes, at every start, for buffers up to 40
# bytes (a short tail goes through a zeroed copy) holding the bytes a compare could confuse with ':'
# (0x3a): its neighbours, its high-bit twin 0xba, NUL, 0x7f, 0xff.
_NEAR = bytes([0x00, 0x39, 0x3B, 0x3A ^ 0x01, 0x7F, 0xBA, 0xFF, 0x80, 0x22, 0x20])


def _colon_bits(buf: bytes, i: int) -> int:
    return sum(1 << k for k, ch in enumerate(buf[max(i, 0):max(i, 0) + 16]) if ch == 0x3A)


def _colon_finder() -> ModuleType:
    c = load("ssescan", "c")
    if not hasattr(c, "_colons"):
        pytest.skip("the compiled twin has no colon finder")
    return c


@pytest.mark.parametrize("portable", [False, True], ids=["sse2", "portable"])
def test_colon_bits_every_offset(portable: bool) -> None:
    c = _colon_finder()
    for n in range(0, 41):
        filler = bytes(_NEAR[(i * 7 + n) % len(_NEAR)] for i in range(n))
        bufs = [filler]
        for p in range(n):
            one = filler[:p] + b":" + filler[p + 1:]
            bufs.append(one)
            for q in range(p + 1, n, 5):
                bufs.append(one[:q] + b":" + one[q + 1:])
        for buf in bufs:
            for i in range(-1, n + 2):
                assert c._colons(buf, i, portable) == _colon_bits(buf, i), (buf, i, portable)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200), st.lists(st.integers(0, 199), max_size=6), st.integers(0, 200))
def test_colon_bits_random(raw: bytes, colons: list[int], start: int) -> None:
    c = _colon_finder()
    buf = bytearray(raw)
    for p in colons:
        if p < len(buf):
            buf[p] = 0x3A
    data = bytes(buf)
    assert c._colons(data, start) == c._colons(data, start, True) == _colon_bits(data, start)


@settings(max_examples=500, deadline=None)
@given(st.lists(st.sampled_from([*_ATOMS, b"\t", b"object", b"role", b"e", b"t", b"x" * 13]), max_size=80))
def test_twins_agree_on_long_reads(parts: list[bytes]) -> None:
    """Reads longer than a 16-byte block, with keys and colons across every block boundary."""
    py, c = _twins()
    buf = b"".join(parts)
    assert c.sse_scan(buf) == py.sse_scan(buf), buf


def _chunk(content: bytes, spaced: bool = False) -> bytes:
    sep = b'" : ' if spaced else b'":'
    return (b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":"m",'
            b'"system_fingerprint":"fp","choices":[{"index":0,"delta":{"content' + sep + b'"' + content
            + b'"},"logprobs":null,"finish_reason":null}]}\n\n')


def test_twins_agree_on_every_cut_of_a_stream() -> None:
    """A realistic stream (long events, a spaced key, an escaped key in a value, reasoning, a usage
    object) cut at every length: each prefix, and each suffix, gives both twins the same scan."""
    py, c = _twins()
    body = (_chunk(b"") + b"".join(_chunk(b"tok%d " % i) for i in range(6)) + _chunk(b"x", spaced=True)
            + _chunk(b'say \\"content\\":\\"y\\"') + b'data: {"choices":[{"delta":{"reasoning_content":"hm"}}]}\n\n'
            + b'data: {"choices":[{"text":"t"}]}\r\n\r\n'
            + b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":9}}\n\ndata: [DONE]\n\n')
    assert c.sse_scan(body) == py.sse_scan(body) == (10 << 2) | 3
    for cut in range(len(body) + 1):
        assert c.sse_scan(body[:cut]) == py.sse_scan(body[:cut]), cut
        assert c.sse_scan(body[cut:]) == py.sse_scan(body[cut:]), cut


_BOUNDS = (0.001, 0.01, 0.1, 1.0)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.sampled_from([TOK, ROLE, USAGE, NULL_USAGE, b"data: [DONE]\n\n", TOK[:9], TOK[9:],
                                          b'"content":"x"']), max_size=5), max_size=8))
def test_sse_clock_twins_agree(reads: list[list[bytes]]) -> None:
    """What does not depend on the clock: each read's flags, the events, the gap count (n content
    events give n - 1 gaps however the reads group them), the first event's time once it came,
    and add_to adding exactly the counts."""
    py, c = _twins()
    clocks = [py.SseClock(_BOUNDS, 0.0), c.SseClock(_BOUNDS, 0.0)]
    for parts in reads:
        buf = b"".join(parts)
        assert clocks[0].feed(buf) == clocks[1].feed(buf), buf
    for clock in clocks:
        assert clock.events == clocks[0].events
        assert sum(clock.itl) == max(clock.events - 1, 0)
        assert len(clock.itl) == len(_BOUNDS) + 1
        assert (clock.ttft >= 0) == (clock.events > 0)
        counts = [7, 0, 1, 0, 2]
        clock.add_to(counts)
        assert counts == [a + b for a, b in zip([7, 0, 1, 0, 2], clock.itl, strict=True)]


def test_sse_clock_add_to_refuses_too_few_buckets(ssescan: ModuleType) -> None:
    clock = ssescan.SseClock(_BOUNDS, 0.0)
    clock.feed(TOK * 3)
    with pytest.raises(ValueError, match="buckets"):
        clock.add_to([0] * len(_BOUNDS))
    longer = [0] * (len(_BOUNDS) + 2)  # more buckets than counts: the first ones get them
    clock.add_to(longer)
    assert longer == [2, 0, 0, 0, 0, 0]


def test_sse_clock_feed_refuses_none(ssescan: ModuleType) -> None:
    """feed is a cpdef in the compiled twin (the usage tap calls it in C): None is refused alike,
    with nothing counted."""
    clock = ssescan.SseClock(_BOUNDS, 0.0)
    with pytest.raises(TypeError):
        clock.feed(None)
    assert clock.events == 0 and clock.ttft < 0
    assert clock.feed(TOK) >> 2 == 1 and clock.events == 1
