"""Scheduler inputs and plugins: what the candidate endpoints and a request look like, and the
filters and scorers that :mod:`flexinfer.proxy.scheduler` chains (after the Kthena router).

Owns: :class:`Candidate` (one endpoint, for callers that think in objects), :class:`Columns` (the
candidates as one list per figure: what the plugins read, so each plugin is one loop over lists,
compiled in :mod:`flexinfer._speedups` where it reads engine figures), :class:`Request`, the plugin
protocols (:class:`Filter`, :class:`Scorer`) and the plugins ``least-request`` (scorer and filter),
``least-latency``, ``kv-cache``, ``prefix-cache``, ``session-affinity`` (scorers) and
``lora-affinity`` (filter).
Must not: do I/O, keep per-request state, read clocks, or import anything of ours beyond
``_speedups`` (the router injects prefix hints and the ring lookup).

Contracts:

- A scorer returns one float in 0..100 per candidate, in the columns' order; higher is better.
- A filter returns the indices it keeps (order kept), or None to keep all; the scheduler ignores
  an empty answer (a filter never empties the set: see each filter's fallback).
- *Unknown* engine data (``None``: the scrape is stale or absent) never looks idle. The rule is the
  same for every scorer: an unknown value scores 0, the floor of the scale, so it is never better
  than the worst known value (a min-max scale's worst known is 0 too); a filter keeps unknown
  endpoints (it cannot prove they fail) and leaves ranking them to the scorers. ``least-request``
  with unknown ``running`` assumes the engine runs none of the router's in-flight requests (all of
  them queued: the pessimistic end of Kthena's estimate).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import itemgetter, mul
from typing import Any, NamedTuple, Protocol

from flexinfer._speedups import keep_below, kv_free, least_latency, least_request

MAX_WAITING = 10  # Kthena's maxWaitingRequests: the least-request filter drops endpoints at/above it
EXCESS_FACTOR = 100.0  # Kthena: in-flight + 100 x max(in-flight - running, 0) (the kernels use the same)


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


class Request(NamedTuple):
    """What plugins may read about the request being placed (a named tuple: made per request, and
    a tuple is built in C where a frozen dataclass sets each field through a Python call)."""

    model: str
    adapter: str | None = None
    session: str | None = None
    prefix_hashes: Sequence[int] = ()  # chained prompt-block hashes


class Columns:
    """The candidates, one list per figure (``None`` entries: unknown), all of one length. The
    lists may be shared with the caller's caches: plugins read them and never change them."""

    __slots__ = ("adapters", "in_flight", "keys", "kv", "running", "tpot", "ttft", "waiting")

    def __init__(self, keys: list[str], in_flight: list[int], waiting: list[float | None] | None = None,
                 running: list[float | None] | None = None, kv: list[float | None] | None = None,
                 ttft: list[float | None] | None = None, tpot: list[float | None] | None = None,
                 adapters: list[frozenset[str] | None] | None = None) -> None:
        # no length checks here (this is built per request): the kernels check what they read
        unknown: list[Any] = [None] * len(keys)
        self.keys = keys
        self.in_flight = in_flight
        self.waiting: list[float | None] = waiting if waiting is not None else unknown
        self.running: list[float | None] = running if running is not None else unknown
        self.kv: list[float | None] = kv if kv is not None else unknown
        self.ttft: list[float | None] = ttft if ttft is not None else unknown
        self.tpot: list[float | None] = tpot if tpot is not None else unknown
        self.adapters: list[frozenset[str] | None] = adapters if adapters is not None else unknown

    @classmethod
    def of(cls, cands: Sequence[Candidate]) -> Columns:
        return cls([c.key for c in cands], [c.in_flight for c in cands], [c.waiting for c in cands],
                   [c.running for c in cands], [c.kv_usage for c in cands], [c.ttft_s for c in cands],
                   [c.tpot_s for c in cands], [c.adapters for c in cands])

    def __len__(self) -> int:
        return len(self.keys)

    def take(self, idx: Sequence[int]) -> Columns:
        """The candidates at ``idx``, in that order."""
        if len(idx) == 1:
            i = idx[0]
            return Columns([self.keys[i]], [self.in_flight[i]], [self.waiting[i]], [self.running[i]],
                           [self.kv[i]], [self.ttft[i]], [self.tpot[i]], [self.adapters[i]])
        get = itemgetter(*idx)  # one C call per column (a tuple of the picked entries)
        return Columns(list(get(self.keys)), list(get(self.in_flight)), list(get(self.waiting)),
                       list(get(self.running)), list(get(self.kv)), list(get(self.ttft)), list(get(self.tpot)),
                       list(get(self.adapters)))



class Filter(Protocol):
    name: str

    def filter(self, req: Request, cols: Columns) -> list[int] | None: ...


class Scorer(Protocol):
    name: str

    def score(self, req: Request, cols: Columns) -> list[float]: ...


class PrefixHints(Protocol):
    """Which endpoint served which prompt blocks (``routing.PrefixStore`` or a shared table)."""

    def match_len(self, ep: str, hashes: Sequence[int]) -> int: ...


#: The router's bounded-load ring lookup for a request's session key, given the candidates left by
#: the filters: the endpoint key it names, or None (no ring for the model, or its answer was filtered).
RingPick = Callable[[Request, Columns], "str | None"]


class LeastRequest:
    """Kthena's least-request score: base = in-flight + 100 x max(in-flight - running, 0), the
    second term estimating requests queued in the engine before the next scrape; score =
    100 x (max_base - base) / max_base (all idle: 100 each). Unknown ``running``: all in-flight
    counted as excess."""

    name: str = "least-request"

    def score(self, req: Request, cols: Columns) -> list[float]:
        return least_request(cols.in_flight, cols.running)


class LeastRequestFilter:
    """Drops endpoints whose engine queue holds >= ``max_waiting`` requests (unknown: kept; all
    over the limit: all kept)."""

    name: str = "least-request"

    def __init__(self, max_waiting: float = MAX_WAITING) -> None:
        self.max_waiting = float(max_waiting)

    def filter(self, req: Request, cols: Columns) -> list[int] | None:
        return keep_below(cols.waiting, self.max_waiting)


class LeastLatency:
    """TTFT and TPOT each min-max normalised across the candidates (lowest = 50, highest = 0, all
    equal = 50), summed. Unknown: 0 for that half (the worst known score)."""

    name: str = "least-latency"

    def score(self, req: Request, cols: Columns) -> list[float]:
        return least_latency(cols.ttft, cols.tpot)


class KVCache:
    """100 x (1 - KV usage), usage clamped to 0..1. Unknown: 0 (as if full)."""

    name: str = "kv-cache"

    def score(self, req: Request, cols: Columns) -> list[float]:
        return kv_free(cols.kv)


class PrefixCache:
    """100 x (blocks of the prompt the endpoint served before) / (blocks of the prompt), from
    the router's prefix hints. No hints or no prompt blocks: 0 for all (no preference).

    Hints that also offer ``match_lens(keys, hashes) -> list[int]`` (one call for all candidates,
    e.g. a global per-model index walked once) are used through it; else ``match_len`` per
    candidate."""

    name: str = "prefix-cache"

    def __init__(self, hints: PrefixHints | None = None) -> None:
        self.hints = hints
        self._batch: Callable[[list[str], Sequence[int]], list[int]] | None = getattr(hints, "match_lens", None)
        self.last: tuple[list[str], list[int]] = ([], [])

    def score(self, req: Request, cols: Columns) -> list[float]:
        return self.scores_for(req.prefix_hashes, cols.keys)

    def scores_for(self, hashes: Sequence[int], keys: list[str]) -> list[float]:
        """The scores of ``keys`` for a prompt of ``hashes``; the matched block counts stay in
        :attr:`last` (keys, lens) for the caller (the router skips recording a full match)."""
        hints = self.hints
        n = len(keys)
        if hints is None or not hashes:
            self.last = (keys, [])
            return [0.0] * n
        if self._batch is not None:
            lens = self._batch(keys, hashes)
        else:
            match = hints.match_len
            lens = [match(k, hashes) for k in keys]
        self.last = (keys, lens)
        return list(map(mul, lens, repeat(100.0 / len(hashes), n)))


class SessionAffinity:
    """100 for the endpoint the router's bounded-load ring names for the session key, 0 for the
    others (no session key, no ring, or a ring answer outside the candidates: 0 for all). The ring
    is the one the ``session-affinity`` strategy uses (the router binds it), so a session keeps its
    replica when a model moves from that strategy to ``scored``, and a hot session still spreads
    (bounded loads) instead of melting one replica."""

    name: str = "session-affinity"

    def __init__(self, ring_pick: RingPick | None = None) -> None:
        self.ring_pick = ring_pick

    def score(self, req: Request, cols: Columns) -> list[float]:
        key = None
        if req.session is not None and self.ring_pick is not None:
            key = self.ring_pick(req, cols)
        return [100.0 if k == key else 0.0 for k in cols.keys]


class LoraAffinity:
    """Keeps endpoints known to have the request's adapter loaded; if none, those whose adapters
    are unknown (they may have it); if none, all. No adapter in the request: all."""

    name: str = "lora-affinity"

    def filter(self, req: Request, cols: Columns) -> list[int] | None:
        a = req.adapter
        if a is None:
            return None
        ads = cols.adapters
        have = [i for i, s in enumerate(ads) if s is not None and a in s]
        if not have:
            have = [i for i, s in enumerate(ads) if s is None]
        return have if have and len(have) != len(ads) else None


SCORERS: dict[str, type] = {p.name: p for p in (LeastRequest, LeastLatency, KVCache, PrefixCache, SessionAffinity)}
FILTERS: dict[str, type] = {p.name: p for p in (LeastRequestFilter, LoraAffinity)}
