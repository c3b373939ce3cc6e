"""What a relayed response body says about tokens: its ``usage``, its first token and the gaps
between tokens, and the one usage chunk the proxy asked for on a client's behalf.

Owns: :class:`UsageTap`, the one observer of a relayed body per request (``UpstreamResponse.tap``,
a :class:`~flexinfer.http.upstream.BodyTap` whose ``observe`` the relay calls with the pieces of
each upstream read before they are written): it keeps the
body's last :data:`TAIL_BYTES` (parsed once, at the end, by :meth:`UsageTap.usage`); for SSE it
counts content-carrying events, times the first of them (time to first token) and the gaps between
the reads that carry them (inter-token latency), and, when the proxy added
``stream_options.include_usage`` to the request (:func:`ask_usage`), removes the usage-only event
that this made the engine send, leaving every other byte of the stream as it came.
The end-of-body parse is ``flexinfer._speedups.parse_usage``.
Must not: parse JSON per event, allocate per event on the common path (a read of whole events, no
usage object), do I/O, or let anything in a body (absent, malformed, huge usage) fail or delay the
response; a tap that raises is dropped by the relay, which goes on.

Rules (docs/llm-metrics.md). A content event and a usage object are what
:mod:`flexinfer._speedups.ssescan_py` says (non-empty ``content``, ``reasoning_content`` or
``text``; the role-only first chunk is not one). Events of one read arrive at the same instant: a read carrying ``k`` content events ``g``
seconds after the previous content read gives ``k`` inter-token samples of ``g / k``; the first
content read gives the time to first token and ``k - 1`` samples of 0 (so a stream of ``n``
content events gives ``n - 1`` samples). The stripped event is a ``data:`` event whose ``usage`` is
an object and whose ``choices`` is an empty list (the shape ``include_usage`` adds); a partial event
at the end of a read is held back until its end only while it could still be that event (no
non-empty ``choices`` seen yet), at most :data:`HOLD_BYTES`.
"""

from __future__ import annotations

import re
from time import perf_counter
from typing import Any

import orjson

try:
    import cython
except ImportError:  # no Cython here: its decorators do nothing in pure Python
    from flexinfer import _nocython as cython  # type: ignore[no-redef]

from flexinfer._speedups import SseClock, parse_usage, usage_cuts
from flexinfer._speedups.ssescan_py import KEEP, USAGE_OBJECT, WHOLE
from flexinfer.http.upstream import BodyTap
from flexinfer.proxy.metrics import ITL_BUCKETS

__all__ = ["HOLD_BYTES", "TAIL_BYTES", "USAGE_PATHS", "UsageTap", "ask_usage"]

TAIL_BYTES = 16 * 1024  # the end of a response body kept for its usage object
HOLD_BYTES = 64 * 1024  # a partial event held back longer than this is let through (stripping stops)
_SOME_CHOICES = re.compile(rb'"choices"\s*:\s*\[\s*\{')
_ASK = b'{"stream_options":{"include_usage":true},'
# the scan flags as module constants of this module (C integers in the build, usage.pxd: a read's
# flag tests are then C operations)
_KEEP = KEEP
_WHOLE = WHOLE
_USAGE_OBJECT = USAGE_OBJECT
#: the paths whose streams carry usage when asked (``stream_options`` is theirs)
USAGE_PATHS = frozenset(("/v1/chat/completions", "/v1/completions"))


def ask_usage(body: bytes, data: dict[str, Any], model: str | None = None) -> bytes | None:
    """The body of a streaming request that did not ask for usage, asking for it
    (``stream_options.include_usage``); None when it asked already or cannot be changed safely
    (``stream_options`` that is not an object, or vLLM's ``continuous_usage_stats``, which would
    put usage into every event). The key is spliced into ``body`` (already rewritten for the
    backend) after the opening brace when absent (no re-encoding), else the parsed object is
    re-encoded, with ``model`` (the backend's model name) in place of the client's."""
    opts = data.get("stream_options")
    if opts is None and "stream_options" not in data:
        if not data:
            return None
        spliced = body.replace(b"{", _ASK, 1)  # one pass, one copy (slices and two joins made three)
        return spliced if len(spliced) != len(body) else None  # no "{": nothing to splice into
    if not isinstance(opts, dict) or opts.get("include_usage") or opts.get("continuous_usage_stats"):
        return None
    out = dict(data)
    out["stream_options"] = {**opts, "include_usage": True}
    if model is not None and "model" in out:
        out["model"] = model
    return orjson.dumps(out)


class UsageTap(BodyTap):
    """Observes (``observe``, called by ``UpstreamResponse``) the body bytes of each upstream read,
    before they are written: returns None (write them as they are) or the pieces to write instead
    (stripping). Keeps the last :data:`TAIL_BYTES`; for SSE counts content events and times them."""

    __slots__ = ("_held", "_mid", "_parsed", "_usage", "charge", "clock", "stats", "status", "strip", "stripped",
                 "t0", "tail", "ttft")

    def __init__(self) -> None:
        self.tail = bytearray()
        #: SSE: the per-read accounting (flexinfer._speedups.SseClock); in the build a slot of the
        #: compiled SseClock, so its feed per read is a C method call (usage.pxd)
        self.clock: Any = None
        self.status: int | None = None  # the upstream status, once a response head arrived
        self.strip = False  # remove the usage-only event (the proxy asked for it, the client did not)
        self.stripped = 0  # events removed
        self.stats: Any = None  # metrics.ModelStats: where TTFT and ITL go (None: not recorded)
        self.t0 = 0.0  # perf_counter() of the request's arrival
        self.ttft = -1.0  # seconds from t0 to the first content event (SSE) or first body piece (else)
        self._held = b""  # a partial event held back (stripping)
        self._mid = False  # the last read ended inside an event that was let through
        self._parsed = False
        self._usage: tuple[int, int] | None = None
        #: what settles when the body is complete: the request's token charge, whose ``settle()`` acts
        #: once and unlinks it from here; None without one, or once settled
        self.charge: Any = None

    def start(self, status: int, sse: bool, strip: bool, t0: float, stats: Any) -> None:
        """The response head is in: what kind of body follows."""
        self.status = status
        self.strip = strip and sse
        self.t0 = t0
        self.stats = stats
        self.clock = SseClock(ITL_BUCKETS, t0) if sse else None

    @cython.annotation_typing(False)  # the cpdef of usage.pxd
    def observe(self, buf: bytes, end: bool) -> list[bytes] | None:
        """The body bytes of one upstream read, before they are written (see the class docstring).
        The common read of a stream (whole events, no usage object) costs one compiled call
        (:class:`flexinfer._speedups.SseClock`: the scan, the clock, the gap's bucket) and no
        copy: only reads that may carry a usage object are kept for :meth:`usage`. ``cpdef`` in the
        build, where ``usage.pxd`` types its scan flags as a C integer (the flag tests of every read
        are C operations)."""
        # the read as one buffer (the relay's): a burst is scanned once, not piece by piece, and a
        # marker cut between two pieces of a read is whole
        if not buf:
            return None
        clock = self.clock
        if clock is None:  # not SSE: keep the tail (the usage object ends the body)
            self._keep(buf)
            if self.ttft < 0:
                self.ttft = perf_counter() - self.t0
            return None
        scan = clock.feed(buf)
        if scan & _KEEP:  # a usage object (or part of one) may be in this read
            self._keep(buf)
        if self.ttft < 0 and clock.ttft >= 0:  # the first content event: time to first token
            self.ttft = clock.ttft
            if self.stats is not None:
                self.stats.observe_ttft(self.ttft)
        if self.strip:
            # the common read: whole events, no usage object ("usage":null, vLLM's, is not one)
            if self._held or not scan & _WHOLE or scan & _USAGE_OBJECT:
                return self._strip_slow(buf, end)
            self._mid = False
        return None

    def complete(self) -> None:
        """The body is complete and observed, its last bytes not yet written (the relay calls this,
        see BodyTap.complete): the token charge is settled now, once, so that a client that has the
        last byte finds its next request judged with this one's tokens, on any worker sharing the
        buckets."""
        charge = self.charge
        if charge is not None:
            charge.settle()

    @property
    def sse(self) -> bool:
        """The body is an SSE stream (its reads are counted and timed)."""
        return self.clock is not None

    @property
    def events(self) -> int:
        """Content-carrying SSE events seen (0 for other bodies)."""
        return 0 if self.clock is None else int(self.clock.events)

    def _keep(self, buf: bytes) -> None:
        """Add a read to the tail that :meth:`usage` parses (its last :data:`TAIL_BYTES` at least)."""
        tail = self.tail
        tail += buf
        if len(tail) > 2 * TAIL_BYTES:
            del tail[:-TAIL_BYTES]

    def finish(self) -> None:
        """The body is over: its inter-token gaps go into the model's histogram (once per body)."""
        clock, st = self.clock, self.stats
        if clock is not None and st is not None:
            self.stats = None  # once
            clock.add_to(st.itl)
            st.itl_sum += clock.itl_sum

    def _strip_slow(self, buf: bytes, end: bool) -> list[bytes]:
        """The reads the common path cannot pass as they are: a held partial event, a read that
        ends inside an event, or one with a usage object. One compiled call finds the usage-only
        events among the read's whole events (a burst of a whole stream is one read)."""
        if self._held:
            buf = self._held + buf
        self._held = b""
        keep: list[bytes] = []
        kept_from = 0
        pos, self._mid, cuts = usage_cuts(buf, self._mid)
        for k in range(0, len(cuts), 2):
            if kept_from < cuts[k]:
                keep.append(buf[kept_from:cuts[k]])
            kept_from = cuts[k + 1]
            self.stripped += 1
        rest = buf[pos:]
        if rest and not end and len(rest) <= HOLD_BYTES and not self._mid \
                and _SOME_CHOICES.search(rest) is None:
            self._held = rest  # it may still become the usage-only event: wait for its end
            buf = buf[:pos]
        elif rest:
            self._mid = True  # the start of an event goes out; the next read carries its end
            if len(rest) > HOLD_BYTES:
                self.strip = False
            elif not end:  # line ends at the cut may be half a boundary: the next read decides
                cut = pos + len(rest.rstrip(b"\r\n"))
                if cut < len(buf):
                    self._held = buf[cut:]
                    buf = buf[:cut]
        if kept_from < len(buf):
            keep.append(buf[kept_from:] if kept_from else buf)
        return keep

    def usage(self) -> tuple[int, int] | None:
        """(prompt_tokens, completion_tokens) of the body's last usage object, or None; parsed once."""
        if not self._parsed:
            self._parsed = True
            try:
                self._usage = parse_usage(self.tail) if self.tail else None
            except Exception:  # never let a usage object hurt
                self._usage = None
        return self._usage
