"""Scheduler inputs and plugins: what a candidate endpoint and a request look like, and the
filters and scorers that :mod:`flexinfer.proxy.scheduler` chains (after the Kthena router).

Owns: :class:`Candidate`, :class:`Request`, the plugin protocols (:class:`Filter`, :class:`Scorer`)
and the plugins ``least-request`` (scorer and filter), ``least-latency``, ``kv-cache``,
``prefix-cache``, ``session-affinity`` (scorers) and ``lora-affinity`` (filter).
Must not: do I/O, keep per-request state, read clocks, or import anything beyond the standard
library (the router injects prefix hints and the ring lookup).

Contracts:

- A scorer returns one float in 0..100 per candidate, in the candidates' order; higher is better.
- A filter returns a non-empty subset (order kept) when given a non-empty list: when nothing would
  pass it returns its input (a fallback, never an empty list).
- *Unknown* engine data (``None``: the scrape is stale or absent) never looks idle. The rule is the
  same for every scorer: an unknown value scores 0, the floor of the scale, so it is never better
  than the worst known value (a min-max scale's worst known is 0 too); a filter keeps unknown
  endpoints (it cannot prove they fail) and leaves ranking them to the scorers. ``least-request``
  with unknown ``running`` assumes the engine runs none of the router's in-flight requests (all of
  them queued: the pessimistic end of Kthena's estimate).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

MAX_WAITING = 10  # Kthena's maxWaitingRequests: the least-request filter drops endpoints at/above it
EXCESS_FACTOR = 100.0  # Kthena: in-flight + 100 x max(in-flight - running, 0)


@dataclass(frozen=True, slots=True)
class Candidate:
    """One endpoint as the scheduler sees it: the router's count plus the scraped engine state."""

    key: str  # host:port
    in_flight: int  # the router's open requests to it (machine- or replica-wide)
    waiting: float | None = None  # engine queue (vllm:num_requests_waiting ...); None = unknown
    running: float | None = None  # engine running requests; None = unknown
    kv_usage: float | None = None  # 0..1; None = unknown
    ttft_s: float | None = None  # recent mean time to first token; None = unknown
    tpot_s: float | None = None  # recent mean time per output token; None = unknown
    adapters: frozenset[str] | None = None  # LoRA adapters loaded; None = unknown


@dataclass(frozen=True, slots=True)
class Request:
    """What plugins may read about the request being placed."""

    model: str
    adapter: str | None = None
    session: str | None = None
    prefix_hashes: list[int] = field(default_factory=list)  # chained prompt-block hashes


class Filter(Protocol):
    name: str

    def filter(self, req: Request, cands: Sequence[Candidate]) -> Sequence[Candidate]: ...


class Scorer(Protocol):
    name: str

    def score(self, req: Request, cands: Sequence[Candidate]) -> list[float]: ...


class PrefixHints(Protocol):
    """Which endpoint served which prompt blocks (``routing.PrefixStore`` or a shared table)."""

    def match_len(self, ep: str, hashes: list[int]) -> int: ...


RingPick = Callable[[str, Sequence[Candidate]], "str | None"]


def _low_is_best(vals: list[float | None], out: list[float]) -> None:
    """Min-max normalise ``vals`` (lower = 100, higher = 0) and add half of it into ``out``;
    unknown adds 0 (the worst known score of a min-max scale)."""
    lo = hi = None
    for v in vals:
        if v is not None:
            if lo is None or v < lo:
                lo = v
            if hi is None or v > hi:
                hi = v
    if lo is None or hi is None:
        return
    if hi <= lo:
        for i, v in enumerate(vals):
            if v is not None:
                out[i] += 50.0
        return
    k = 50.0 / (hi - lo)
    for i, v in enumerate(vals):
        if v is not None:
            out[i] += (hi - v) * k


class LeastRequest:
    """Kthena's least-request score: base = in-flight + 100 x max(in-flight - running, 0), the
    second term estimating requests queued in the engine before the next scrape; score =
    100 x (max_base - base) / max_base (all idle: 100 each). Unknown ``running``: all in-flight
    counted as excess."""

    name: str = "least-request"

    def score(self, req: Request, cands: Sequence[Candidate]) -> list[float]:
        bases: list[float] = []
        mx = 0.0
        for c in cands:
            f = c.in_flight
            r = c.running
            ex = f if r is None else f - r
            b = f + EXCESS_FACTOR * ex if ex > 0 else float(f)
            bases.append(b)
            if b > mx:
                mx = b
        if mx <= 0.0:
            return [100.0] * len(bases)
        k = 100.0 / mx
        return [(mx - b) * k for b in bases]


class LeastRequestFilter:
    """Drops endpoints whose engine queue holds >= ``max_waiting`` requests (unknown: kept)."""

    name: str = "least-request"

    def __init__(self, max_waiting: float = MAX_WAITING) -> None:
        self.max_waiting = max_waiting

    def filter(self, req: Request, cands: Sequence[Candidate]) -> Sequence[Candidate]:
        m = self.max_waiting
        out = [c for c in cands if c.waiting is None or c.waiting < m]
        return out if out else cands


class LeastLatency:
    """TTFT and TPOT each min-max normalised across the candidates (lowest = 100), blended
    0.5/0.5. Unknown: 0 for that half (the worst known score)."""

    name: str = "least-latency"

    def score(self, req: Request, cands: Sequence[Candidate]) -> list[float]:
        out = [0.0] * len(cands)
        _low_is_best([c.ttft_s for c in cands], out)
        _low_is_best([c.tpot_s for c in cands], out)
        return out


class KVCache:
    """100 x (1 - KV usage), usage clamped to 0..1. Unknown: 0 (as if full)."""

    name: str = "kv-cache"

    def score(self, req: Request, cands: Sequence[Candidate]) -> list[float]:
        out: list[float] = []
        for c in cands:
            u = c.kv_usage
            out.append(0.0 if u is None else 100.0 * (1.0 - (0.0 if u < 0.0 else 1.0 if u > 1.0 else u)))
        return out


class PrefixCache:
    """100 x (blocks of the prompt the endpoint served before) / (blocks of the prompt), from
    the router's prefix hints. No hints or no prompt blocks: 0 for all (no preference)."""

    name: str = "prefix-cache"

    def __init__(self, hints: PrefixHints | None = None) -> None:
        self.hints = hints

    def score(self, req: Request, cands: Sequence[Candidate]) -> list[float]:
        hashes = req.prefix_hashes
        hints = self.hints
        if hints is None or not hashes:
            return [0.0] * len(cands)
        match = hints.match_len
        k = 100.0 / len(hashes)
        return [match(c.key, hashes) * k for c in cands]


class SessionAffinity:
    """100 for the endpoint the router's bounded-load ring names for the session key, 0 for the
    others (no session key, no ring, or a ring answer outside the candidates: 0 for all)."""

    name: str = "session-affinity"

    def __init__(self, ring_pick: RingPick | None = None) -> None:
        self.ring_pick = ring_pick

    def score(self, req: Request, cands: Sequence[Candidate]) -> list[float]:
        key = None
        if req.session is not None and self.ring_pick is not None:
            key = self.ring_pick(req.session, cands)
        return [100.0 if c.key == key else 0.0 for c in cands]


class LoraAffinity:
    """Keeps endpoints known to have the request's adapter loaded; if none, those whose adapters
    are unknown (they may have it); if none, all. No adapter in the request: all."""

    name: str = "lora-affinity"

    def filter(self, req: Request, cands: Sequence[Candidate]) -> Sequence[Candidate]:
        a = req.adapter
        if a is None:
            return cands
        have = [c for c in cands if c.adapters is not None and a in c.adapters]
        if have:
            return have
        maybe = [c for c in cands if c.adapters is None]
        return maybe if maybe else cands


SCORERS: dict[str, type] = {p.name: p for p in (LeastRequest, LeastLatency, KVCache, PrefixCache, SessionAffinity)}
FILTERS: dict[str, type] = {p.name: p for p in (LeastRequestFilter, LoraAffinity)}
