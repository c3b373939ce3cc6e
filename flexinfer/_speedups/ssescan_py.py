"""One pass over a piece of an SSE body for what the proxy's usage tap needs: the reference twin
of ssescan_c.

Owns: :func:`sse_scan`, :func:`event_end` (where an event ends), :func:`usage_cuts` (where the
usage-only events of a read are), :class:`SseClock` (the per-read accounting of one stream, below)
and :func:`parse_usage` (the counts of the last ``usage`` object of a body's tail). A *content event* is a key ``"content"``, ``"reasoning_content"`` or
``"text"`` (exact bytes, so an escaped ``\\"content\\"`` inside a string never counts), then optional
whitespace, ``:``, optional whitespace, ``"`` and one more byte that is not ``"`` (a non-empty
string). A *usage object* is a key ``"usage"``, optional whitespace, ``:``, optional whitespace,
``{`` (``"usage":null``, which vLLM puts in every chunk once usage is asked for, is not one).
*Whole*: the piece ends at an event's end (``\\n\\n`` or ``\\r\\n\\r\\n``).
Must not: parse JSON, allocate per event, or import anything of ours.
"""

from __future__ import annotations

import re
import time
from bisect import bisect_left

__all__ = ["KEEP", "MAX_TOKENS", "USAGE_OBJECT", "WHOLE", "SseClock", "event_end", "parse_usage", "sse_scan", "usage_cuts"]

MAX_TOKENS = 10**9  # a usage count above this is clamped

#: flag bits of the result (the content-event count is ``result >> 2``)
USAGE_OBJECT = 2
WHOLE = 1

_KEY = re.compile(rb'"(content|reasoning_content|text|usage)"[ \t\r\n]*:[ \t\r\n]*')


def sse_scan(buf: bytes) -> int:
    """``(content events << 2) | USAGE_OBJECT? | WHOLE?`` for ``buf`` (see the module docstring)."""
    n = 0
    flags = WHOLE if buf.endswith(b"\n\n") or buf.endswith(b"\r\n\r\n") else 0
    size = len(buf)
    for m in _KEY.finditer(buf):
        j = m.end()
        if j >= size:
            continue
        if m.group(1) == b"usage":
            if buf[j] == 123:  # '{'
                flags |= USAGE_OBJECT
        elif buf[j] == 34 and j + 1 < size and buf[j + 1] != 34:  # '"' then not '"'
            n += 1
    return (n << 2) | flags


_NO_CHOICES = re.compile(rb'"choices"\s*:\s*\[\s*\]')


def usage_cuts(buf: bytes, mid: bool) -> tuple[int, bool, list[int]]:
    """Where the usage-only events of a read are: ``(pos, mid, cuts)``. ``pos``: the end of the
    last whole event (0: none); ``cuts``: ``start, stop`` pairs of the whole events (with their blank
    line) that are a ``data:`` event with a usage object and ``"choices": []`` (the event
    ``include_usage`` adds); with ``mid`` the first event is the rest of one whose start went out
    already (never a cut), and ``mid`` comes back False once an event ended."""
    pos = 0
    cuts: list[int] = []
    while True:
        stop = event_end(buf, pos)
        if stop < 0:
            break
        if mid:
            mid = False
        else:
            ev = buf[pos:stop]
            if b'"usage"' in ev and (ev.startswith(b"data:") or b"\ndata:" in ev) \
                    and sse_scan(ev) & USAGE_OBJECT and _NO_CHOICES.search(ev) is not None:
                cuts += (pos, stop)
        pos = stop
    return pos, mid, cuts


#: flag bits of :meth:`SseClock.feed` beyond :func:`sse_scan`'s: keep this read for the usage parse
#: (a usage object, a read that ends mid-event, or the read after one)
def event_end(buf: bytes, pos: int) -> int:
    """The end of the first blank line that ends an SSE event (``\\r?\\n\\r?\\n``) at or after
    ``pos``, or -1: the leftmost match, as a regex scan from ``pos`` would find it."""
    size = len(buf)
    nl = buf.find(b"\n", max(pos, 0))
    while nl >= 0:
        nxt = nl + 1
        if nxt < size:
            c = buf[nxt]
            if c == 10:  # \n\n
                return nxt + 1
            if c == 13 and nxt + 1 < size and buf[nxt + 1] == 10:  # \n\r\n
                return nxt + 2
        nl = buf.find(b"\n", nxt)
    return -1


KEEP = 4 << 30


class SseClock:
    """The per-read accounting of one SSE body: content events, the time of the first one and
    the inter-token gaps, bucketed by ``bounds`` (the rule of ``flexinfer.proxy.usage``: a read of
    ``k`` content events ``g`` seconds after the previous content read counts ``k`` gaps of ``g/k``;
    the first content read counts ``k - 1`` gaps of 0). Times are ``time.perf_counter()``.

    ``feed(buf)`` returns :func:`sse_scan`'s result, plus :data:`KEEP` when the read may carry (part
    of) a usage object. ``events``, ``ttft`` (seconds from ``t0``, -1.0 before the first content
    event), ``itl`` (one count per bucket of ``bounds``, plus one for +Inf), ``itl_sum``;
    ``add_to(counts)`` adds ``itl`` into a histogram's bucket list."""

    __slots__ = ("_open", "bounds", "events", "itl", "itl_sum", "t0", "t_last", "ttft")

    def __init__(self, bounds: tuple[float, ...], t0: float) -> None:
        self.bounds = bounds
        self.t0 = t0
        self.events = 0
        self.ttft = -1.0
        self.t_last = 0.0
        self.itl = [0] * (len(bounds) + 1)
        self.itl_sum = 0.0
        self._open = False

    def feed(self, buf: bytes) -> int:
        if buf is None:  # (the compiled twin's cpdef refuses it alike)
            raise TypeError("feed() takes bytes, not NoneType")
        scan = sse_scan(buf)
        n = scan >> 2
        if n:
            t = time.perf_counter()
            self.events += n
            if self.ttft < 0:
                self.ttft = t - self.t0
                self.itl[0] += n - 1
            else:
                g = (t - self.t_last) / n
                self.itl[bisect_left(self.bounds, g)] += n
                self.itl_sum += g * n
            self.t_last = t
        keep = bool(scan & USAGE_OBJECT) or not scan & WHOLE or self._open
        self._open = not scan & WHOLE
        return scan | KEEP if keep else scan

    def add_to(self, counts: list[int]) -> None:
        """Add the body's gap counts into ``counts`` (a histogram's buckets: ``bounds`` and +Inf) in
        place, once at the body's end; ValueError when ``counts`` has fewer buckets."""
        if len(counts) < len(self.itl):
            raise ValueError(f"{len(counts)} buckets for {len(self.itl)} counts")
        for i, c in enumerate(self.itl):
            if c:
                counts[i] += c


_WS = (32, 9, 13, 10)  # space, tab, CR, LF


def _skip_ws(buf: bytes | bytearray, j: int, n: int) -> int:
    while j < n and buf[j] in _WS:
        j += 1
    return j


def _object_at(buf: bytes | bytearray, i: int) -> int:
    """Where the object of a ``"usage"`` key at ``i`` opens (after its ``{``), or -1 (null, a string)."""
    n = len(buf)
    j = _skip_ws(buf, i + 7, n)
    if j >= n or buf[j] != 58:  # ':'
        return -1
    j = _skip_ws(buf, j + 1, n)
    return j + 1 if j < n and buf[j] == 123 else -1  # '{'


def _count(inner: bytes | bytearray, key: bytes) -> int:
    """The integer after ``key`` and a colon in ``inner`` (at most 15 digits), or -1."""
    i = inner.find(key)
    if i < 0:
        return -1
    n = len(inner)
    j = _skip_ws(inner, i + len(key), n)
    if j >= n or inner[j] != 58:  # ':'
        return -1
    j = _skip_ws(inner, j + 1, n)
    k = j
    while k < n and k - j < 15 and 48 <= inner[k] <= 57:
        k += 1
    return int(inner[j:k]) if k > j else -1


def parse_usage(tail: bytes | bytearray) -> tuple[int, int] | None:
    """(prompt_tokens, completion_tokens) of the last usage object in ``tail``, or None (a
    missing prompt count is -1, a missing completion count 0). Found with ``rfind``/``find`` and
    index checks (the compiled twin: memchr/memcmp, no Python call)."""
    i = tail.rfind(b'"usage"')
    start = -1
    while i >= 0:
        start = _object_at(tail, i)  # "usage": {  (not null, not a string)
        if start >= 0:
            break
        i = tail.rfind(b'"usage"', 0, i)
    if start < 0:
        return None
    j = start
    depth = 1
    while depth:  # the object's closing brace (nested objects: token details)
        close = tail.find(b"}", j)
        if close < 0:
            return None  # cut off
        inner_open = tail.find(b"{", j, close)
        if inner_open >= 0:
            depth += 1
            if depth > 4:
                return None
            j = inner_open + 1
        else:
            depth -= 1
            j = close + 1
    inner = tail[start:j - 1]
    p, c = _count(inner, b'"prompt_tokens"'), _count(inner, b'"completion_tokens"')
    if p < 0 and c < 0:
        return None
    return (min(p, MAX_TOKENS) if p >= 0 else -1, min(c, MAX_TOKENS) if c >= 0 else 0)
