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

import math
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


#: The router's bounded-load ring lookup for a request's session key, given the candidates left by
#: the filters: the endpoint key it names, or None (no ring for the model, or its answer was filtered).
RingPick = Callable[[Request, Sequence[Candidate]], "str | None"]


class LeastRequest:
    """Kthena's least-request score: base = in-flight + 100 x max(in-flight - running, 0), the
    second term estimating requests queued in the engine before the next scrape; score =
    100 x (max_base - base) / max_base (all idle: 100 each). Unknown ``running``: all in-flight
    counted as excess."""

    name: str = "least-request"

    def score(self, req: Request, cands: Sequence[Candidate]) -> list[float]:
        # plain loops: in CPython 3.11 each comprehension costs a frame, more than 16 iterations
        bases: list[float] = []
        add = bases.append
        mx = 0.0
        for c in cands:
            f = c.in_flight
            r = c.running
            b = f * (1.0 + EXCESS_FACTOR) if r is None else f + EXCESS_FACTOR * (f - r) if f > r else f
            add(b)
            if b > mx:
                mx = b
        if mx <= 0.0:
            return [100.0] * len(bases)
        k = 100.0 / mx
        out: list[float] = []
        add = out.append
        for b in bases:
            add((mx - b) * k)
        return out


class LeastRequestFilter:
    """Drops endpoints whose engine queue holds >= ``max_waiting`` requests (unknown: kept)."""

    name: str = "least-request"

    def __init__(self, max_waiting: float = MAX_WAITING) -> None:
        self.max_waiting = max_waiting

    def filter(self, req: Request, cands: Sequence[Candidate]) -> Sequence[Candidate]:
        m = self.max_waiting
        out: list[Candidate] = []
        add = out.append
        for c in cands:
            w = c.waiting
            if w is None or w < m:
                add(c)
        return out if out else cands


class LeastLatency:
    """TTFT and TPOT each min-max normalised across the candidates (lowest = 100), blended
    0.5/0.5. Unknown: 0 for that half (the worst known score)."""

    name: str = "least-latency"

    def score(self, req: Request, cands: Sequence[Candidate]) -> list[float]:
        inf = math.inf
        tlo = plo = inf
        thi = phi = -inf
        for c in cands:
            t = c.ttft_s
            if t is not None:
                if t < tlo:
                    tlo = t
                if t > thi:
                    thi = t
            p = c.tpot_s
            if p is not None:
                if p < plo:
                    plo = p
                if p > phi:
                    phi = p
        # each half: 50 at the lowest, 0 at the highest, 50 when all known are equal; unknown 0
        tk = 50.0 / (thi - tlo) if thi > tlo else 0.0
        pk = 50.0 / (phi - plo) if phi > plo else 0.0
        out: list[float] = []
        add = out.append
        for c in cands:
            t = c.ttft_s
            p = c.tpot_s
            add((0.0 if t is None else 50.0 - (t - tlo) * tk) + (0.0 if p is None else 50.0 - (p - plo) * pk))
        return out


class KVCache:
    """100 x (1 - KV usage), usage clamped to 0..1. Unknown: 0 (as if full)."""

    name: str = "kv-cache"

    def score(self, req: Request, cands: Sequence[Candidate]) -> list[float]:
        out: list[float] = []
        add = out.append
        for c in cands:
            u = c.kv_usage
            add(0.0 if u is None else 100.0 * (1.0 - (0.0 if u < 0.0 else 1.0 if u > 1.0 else u)))
        return out


class PrefixCache:
    """100 x (blocks of the prompt the endpoint served before) / (blocks of the prompt), from
    the router's prefix hints. No hints or no prompt blocks: 0 for all (no preference).

    Hints that also offer ``match_lens(keys, hashes) -> list[int]`` (one call for all candidates,
    e.g. a global per-model index walked once) are used through it; else ``match_len`` per
    candidate."""

    name: str = "prefix-cache"

    def __init__(self, hints: PrefixHints | None = None) -> None:
        self.hints = hints
        self._batch: Callable[[list[str], list[int]], list[int]] | None = getattr(hints, "match_lens", None)

    def score(self, req: Request, cands: Sequence[Candidate]) -> list[float]:
        hashes = req.prefix_hashes
        hints = self.hints
        if hints is None or not hashes:
            return [0.0] * len(cands)
        k = 100.0 / len(hashes)
        out: list[float] = []
        add = out.append
        if self._batch is not None:
            keys: list[str] = []
            put = keys.append
            for c in cands:
                put(c.key)
            for n in self._batch(keys, hashes):
                add(n * k)
            return out
        match = hints.match_len
        for c in cands:
            add(match(c.key, hashes) * k)
        return out


class SessionAffinity:
    """100 for the endpoint the router's bounded-load ring names for the session key, 0 for the
    others (no session key, no ring, or a ring answer outside the candidates: 0 for all). The ring
    is the one the ``session-affinity`` strategy uses (the router binds it), so a session keeps its
    replica when a model moves from that strategy to ``scored``, and a hot session still spreads
    (bounded loads) instead of melting one replica."""

    name: str = "session-affinity"

    def __init__(self, ring_pick: RingPick | None = None) -> None:
        self.ring_pick = ring_pick

    def score(self, req: Request, cands: Sequence[Candidate]) -> list[float]:
        key = None
        if req.session is not None and self.ring_pick is not None:
            key = self.ring_pick(req, cands)
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
