"""The ``scored`` routing strategy's scheduler: filters, then weighted scorers, top-N, then a pick
(Kthena router's chain; llm-d's endpoint picker works the same way).

Owns: :class:`Scheduler` (the chain), :class:`Decision` (the pick and why, with a bounded header
text for the opt-in explain header), :func:`parse_config` (a per-model setting, string or mapping,
into a scheduler) and :data:`DEFAULT` (Kthena's defaults). The plugins and their inputs live in
:mod:`flexinfer.proxy.scorers` and are re-exported here.
Must not: do I/O, read clocks or keep per-request state (the router owns counts, prefix hints and
the ring; it builds the candidates and injects the hints and the ring lookup).

Chain: each filter narrows the candidates (never to nothing: a filter that would drop all hands its
input on); each scorer gives 0..100 per candidate; total = sum of weight x score. ``pick=best``
takes the highest total; candidates tied for it take turns (a counter of the scheduler walks
them in the caller's order, so equal endpoints share the load as round-robin would, where
"the first of equals" would send everything to one of them while they look alike); ``pick=
weighted-random`` ranks by total (stable), keeps the top N and draws one with probability
proportional to its total (all zero: uniform).

Config string: ``scorer[:weight],...;filters=name,...;top=N;pick=best|weighted-random`` (the first
part may also be written ``scorers=...``; weights default to 1; ``filters=`` with nothing means
none). A mapping takes the same keys: ``scorers`` (a string, a list of ``name[:weight]`` or a
``{name: weight}`` mapping), ``filters`` (a string or a list), ``top``, ``pick``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from itertools import repeat
from operator import add as add_
from operator import mul
from typing import Any

from flexinfer._speedups import best_of
from flexinfer.proxy.scorers import (
    FILTERS,
    SCORERS,
    Candidate,
    Columns,
    Filter,
    KVCache,
    LeastLatency,
    LeastRequest,
    LeastRequestFilter,
    LoraAffinity,
    PrefixCache,
    PrefixHints,
    Request,
    RingPick,
    Scorer,
    SessionAffinity,
)

__all__ = [
    "DEFAULT", "DEFAULT_SPEC", "FILTERS", "HEADER_MAX", "PICKS", "SCORERS", "Candidate", "Columns", "Decision",
    "Filter",
    "KVCache", "LeastLatency", "LeastRequest", "LeastRequestFilter", "LoraAffinity", "PrefixCache",
    "PrefixHints", "Request", "RingPick", "Scheduler", "Scorer", "SessionAffinity", "parse_config", "spec_error",
]

PICKS = ("best", "weighted-random")
DEFAULT_SPEC = "least-request:1,least-latency:1,prefix-cache:1;filters=least-request;top=3;pick=best"
HEADER_MAX = 1024  # bytes of the explain header at most


class Decision:
    """The chosen endpoint and, computed only when asked, every candidate's per-plugin scores."""

    __slots__ = ("_cols", "_filtered", "_names", "_per", "_pick", "_top", "_totals", "index", "key", "n_input")

    def __init__(self, cols: Columns, index: int, names: tuple[str, ...], per: list[list[float]],
                 totals: list[float], pick: str, top: list[int] | None, filtered: list[str] | None,
                 n_input: int) -> None:
        self._cols = cols
        self.index = index
        self.key = cols.keys[index]
        self._names = names
        self._per = per
        self._totals = totals
        self._pick = pick
        self._top = top
        self._filtered = filtered
        self.n_input = n_input

    @property
    def scores(self) -> dict[str, dict[str, float]]:
        """Candidate key -> plugin name -> score (0..100), for the candidates left by the filters."""
        names, per = self._names, self._per
        return {k: {n: per[j][i] for j, n in enumerate(names)} for i, k in enumerate(self._cols.keys)}

    @property
    def total(self) -> dict[str, float]:
        return dict(zip(self._cols.keys, self._totals, strict=True))

    def ranking(self) -> list[int]:
        """Candidate indices, best total first (stable)."""
        if self._top is None:
            t = self._totals
            self._top = sorted(range(len(t)), key=lambda i: -t[i])
        return self._top

    @property
    def reason(self) -> str:
        n = len(self._cols)
        if self._pick == "best":
            why = f"best total {self._totals[self.index]:.1f} of {n}"
        else:
            why = f"weighted-random among top {len(self.ranking())} of {n}"
        if self._filtered:
            why += "; " + ", ".join(self._filtered)
        return why

    def header(self, max_len: int = HEADER_MAX) -> str:
        """``pick=K; reason=...; K t=T name=S ...; ...`` (chosen first, then by total), ASCII, at
        most ``max_len`` characters: candidates that do not fit become ``+N more`` (a reason too
        long for the bound is cut with ``...``)."""
        head = f"pick={self.key}; reason={self.reason}"
        order = [self.index] + [i for i in self.ranking() if i != self.index]
        more = f"; +{len(order)} more"
        if len(head) + len(more) > max_len:  # cut the reason, keep the count of what is not shown
            if max_len < len(more) + 3:
                return (head + more)[:max_len]
            return head[: max_len - len(more) - 3] + "..." + more
        names, per, parts, used = self._names, self._per, [head], len(head)
        for done, i in enumerate(order):
            part = f"{self._cols.keys[i]} t={self._totals[i]:.1f} " + " ".join(
                f"{n}={per[j][i]:.0f}" for j, n in enumerate(names))
            rest = len(order) - done - 1
            tail = len(f"; +{rest} more") if rest else 0
            if used + 2 + len(part) + tail > max_len:
                more = f"+{len(order) - done} more"
                if used + 2 + len(more) <= max_len:
                    parts.append(more)
                break
            parts.append(part)
            used += 2 + len(part)
        return "; ".join(parts)


class Scheduler:
    """Filters -> weighted scorers -> top-N -> pick. Built once per model; ``choose`` is pure."""

    def __init__(self, filters: Sequence[Filter], scorers: Sequence[tuple[Scorer, float]], top_n: int = 3,
                 pick: str = "best", rng: random.Random | None = None, spec: str = "") -> None:
        if pick not in PICKS:
            raise ValueError(f"scheduler pick {pick!r}: expected one of {', '.join(PICKS)}")
        if top_n < 1:
            raise ValueError(f"scheduler top {top_n}: expected an integer >= 1")
        if not scorers:
            raise ValueError("scheduler: at least one scorer is needed")
        self.filters = tuple(filters)
        self.scorers = tuple((s, float(w)) for s, w in scorers)
        self.names = tuple(s.name for s, _ in self.scorers)
        self.top_n = top_n
        self.pick = pick
        self.rng = rng if rng is not None else random.Random()
        self.spec = spec or self._describe()
        self._fns = tuple((s.score, float(w)) for s, w in self.scorers)
        self._turn = -1  # the tie-break turn of pick=best (the first tie goes to the earliest)
        self.last_turn = 0  # the turn the latest choose_index offered (a Decision rebuilt with it picks the same)
        self.last_full = False  # the latest choose_index's pick already held every block of the prompt
        #: what the caller must compute for a request (each costs: hashing the prompt, a session key)
        self.needs_prefix = any(isinstance(s, PrefixCache) for s, _ in self.scorers)
        self.needs_session = any(isinstance(s, SessionAffinity) for s, _ in self.scorers)
        self.fused = self._fuse()
        #: the prefix-cache plugin (its latest matches let the router skip recording a full match)
        self._prefix: PrefixCache | None = next((s for s, _ in self.scorers if isinstance(s, PrefixCache)), None)
        self._prefix_at = next((j for j, (s, _) in enumerate(self.scorers) if isinstance(s, PrefixCache)), -1)
        self._extra: list[list[float] | None] = [None] * len(self.scorers)

    def holds(self, key: str, blocks: int) -> bool:
        """Whether the latest prefix match found ``key`` holding all ``blocks`` of the prompt."""
        p = self._prefix
        if p is None:
            return False
        keys, lens = p.last
        for k, n in zip(keys, lens):  # noqa: B905 (both come from one match)
            if k == key:
                return n >= blocks
        return False

    def _fuse(self) -> tuple[tuple[int, ...], tuple[float, ...], float] | None:
        """The plan of :func:`flexinfer._speedups.best_of` when the whole chain is built-in plugins
        it computes (least-request scorer and filter, least-latency, kv-cache, prefix-cache as
        precomputed scores) with ``pick=best``: (codes, weights, max waiting or -1). None: run
        :meth:`choose`. Both give the same pick (tested)."""
        if self.pick != "best" or len(self.filters) > 1:
            return None
        max_waiting = -1.0
        for f in self.filters:
            if type(f) is not LeastRequestFilter:
                return None
            max_waiting = f.max_waiting
        codes: list[int] = []
        for sc, _ in self.scorers:
            code = _FUSED.get(type(sc))
            if code is None:
                return None
            codes.append(code)
        return tuple(codes), tuple(w for _, w in self.scorers), max_waiting

    def choose_index(self, hashes: Sequence[int], keys: list[str], in_flight: list[int],
                     engine: tuple[list[Any], ...]) -> int:
        """The fused chain (:attr:`fused` must be set) for a prompt of ``hashes``: the index in
        ``keys`` of the pick, without a :class:`Decision` (rebuild one with :meth:`choose` and
        ``turn=`` :attr:`last_turn`); :attr:`last_full`: the pick already holds every block."""
        assert self.fused is not None
        codes, weights, max_waiting = self.fused
        extra = self._extra
        prefix = self._prefix
        lens: list[int] = []
        if prefix is not None:
            extra = list(extra)
            extra[self._prefix_at] = prefix.scores_for(hashes, keys)
            lens = prefix.last[1]
        turn = self._turn + 1
        index, tied = best_of(codes, weights, max_waiting, in_flight, engine[0], engine[1], engine[2],
                              engine[3], engine[4], extra, turn)
        self.last_turn = turn
        if tied:
            self._turn = turn
        self.last_full = bool(hashes) and len(lens) > index and lens[index] >= len(hashes)
        return index

    def _describe(self) -> str:
        sc = ",".join(f"{s.name}:{w:g}" for s, w in self.scorers)
        return f"{sc};filters={','.join(f.name for f in self.filters)};top={self.top_n};pick={self.pick}"

    def with_deps(self, prefix_hints: PrefixHints | None = None, ring_pick: RingPick | None = None,
                  rng: random.Random | None = None) -> Scheduler:
        """The same chain with the router's prefix hints and ring lookup bound (a new scheduler)."""
        return parse_config(self.spec, prefix_hints=prefix_hints, ring_pick=ring_pick, rng=rng)

    def choose(self, req: Request, cands: Columns | Sequence[Candidate], turn: int | None = None) -> Decision:
        """Place ``req`` on one of ``cands`` (columns, or candidate objects turned into columns).
        ``turn``: the tie-break turn to use (an earlier pick rebuilt: the counter does not move)."""
        cols = cands if isinstance(cands, Columns) else Columns.of(cands)
        n_input = len(cols.keys)
        if not n_input:
            raise ValueError("scheduler: no candidates")
        filtered: list[str] | None = None
        for f in self.filters:
            keep = f.filter(req, cols)
            if keep:  # None: all kept; []: a filter must not empty the set, so its answer is ignored
                if filtered is None:
                    filtered = []
                filtered.append(f"{f.name} {len(cols.keys)}->{len(keep)}")
                cols = cols.take(keep)
        n = len(cols.keys)
        per: list[list[float]] = []
        add = per.append
        totals: list[float] | None = None
        for score, w in self._fns:  # C-level map()s: no comprehension frames
            s = score(req, cols)
            if len(s) != n:
                raise ValueError(f"scheduler: a scorer returned {len(s)} scores for {n} candidates")
            add(s)
            ws = s if w == 1.0 else list(map(mul, s, repeat(w, n)))
            totals = ws if totals is None else list(map(add_, totals, ws))
        assert totals is not None  # at least one scorer (checked in __init__)
        top: list[int] | None = None
        if self.pick == "best" or n == 1:
            best = max(totals)
            index = totals.index(best)
            if n > 1 and totals.count(best) > 1:  # tied: take turns among them (C-level count: cheap)
                ties = [i for i, t in enumerate(totals) if t == best]
                if turn is None:
                    self._turn += 1
                    turn = self._turn
                index = ties[turn % len(ties)]
        else:
            top = sorted(range(n), key=totals.__getitem__, reverse=True)[: self.top_n]
            index = self._draw(top, totals)
        return Decision(cols, index, self.names, per, totals, self.pick, top, filtered, n_input)

    def _draw(self, top: list[int], totals: list[float]) -> int:
        mass = 0.0
        for i in top:
            mass += totals[i]
        if mass <= 0.0:
            return top[int(self.rng.random() * len(top)) % len(top)]
        r = self.rng.random() * mass
        for i in top:
            r -= totals[i]
            if r < 0.0:
                return i
        return top[-1]  # float rounding at the very end


def _weight(name: str, raw: Any) -> float:
    try:
        w = float(raw)
    except (TypeError, ValueError):
        raise ValueError(f"scheduler scorer {name!r}: weight {raw!r} is not a number") from None
    if not math.isfinite(w) or w <= 0.0:
        raise ValueError(f"scheduler scorer {name!r}: weight {raw!r} must be a positive finite number")
    return w


def _scorer_items(raw: Any) -> list[tuple[str, Any]]:
    if isinstance(raw, Mapping):
        return [(str(k), v) for k, v in raw.items()]
    if isinstance(raw, str):
        raw = [p for p in raw.split(",") if p.strip()]
    if not isinstance(raw, Sequence):
        raise ValueError(f"scheduler scorers: expected a string, a list or a mapping, got {raw!r}")
    items: list[tuple[str, Any]] = []
    for p in raw:
        if not isinstance(p, str):
            raise ValueError(f"scheduler scorers: entry {p!r} is not a 'name[:weight]' string")
        name, _, w = p.strip().partition(":")
        items.append((name.strip(), w.strip() if w.strip() else 1))
    return items


def _from_string(spec: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for i, part in enumerate(p.strip() for p in spec.split(";")):
        if not part:
            continue
        key, eq, val = part.partition("=")
        if not eq:
            if i != 0:
                raise ValueError(f"scheduler config: {part!r} is not key=value (keys: scorers, filters, top, pick)")
            key, val = "scorers", part
        key = key.strip()
        if key in out:
            raise ValueError(f"scheduler config: {key!r} given twice")
        out[key] = val.strip()
    return out


def parse_config(spec: str | Mapping[str, Any], *, prefix_hints: PrefixHints | None = None,
                 ring_pick: RingPick | None = None, rng: random.Random | None = None) -> Scheduler:
    """A per-model scheduler setting (see the module docstring) -> :class:`Scheduler`; ValueError
    naming the bad plugin, weight or key."""
    conf = _from_string(spec) if isinstance(spec, str) else dict(spec)
    unknown = set(conf) - {"scorers", "filters", "top", "pick"}
    if unknown:
        raise ValueError(f"scheduler config: unknown key(s) {', '.join(sorted(unknown))} "
                         "(keys: scorers, filters, top, pick)")
    scorers: list[tuple[Scorer, float]] = []
    seen: set[str] = set()
    for name, raw_w in _scorer_items(conf.get("scorers", "")):
        cls = SCORERS.get(name)
        if cls is None:
            raise ValueError(f"scheduler: unknown scorer {name!r} (known: {', '.join(sorted(SCORERS))})")
        if name in seen:
            raise ValueError(f"scheduler: scorer {name!r} named twice")
        seen.add(name)
        if cls is PrefixCache:
            plugin: Scorer = PrefixCache(prefix_hints)
        elif cls is SessionAffinity:
            plugin = SessionAffinity(ring_pick)
        else:
            plugin = cls()
        scorers.append((plugin, _weight(name, raw_w)))
    if not scorers:
        raise ValueError("scheduler config: no scorer named (e.g. 'least-request:1,prefix-cache:1')")
    raw_f = conf.get("filters", "")
    names = [p.strip() for p in raw_f.split(",") if p.strip()] if isinstance(raw_f, str) else list(raw_f)
    filters: list[Filter] = []
    for name in names:
        fcls = FILTERS.get(name) if isinstance(name, str) else None
        if fcls is None:
            raise ValueError(f"scheduler: unknown filter {name!r} (known: {', '.join(sorted(FILTERS))})")
        if any(f.name == name for f in filters):
            raise ValueError(f"scheduler: filter {name!r} named twice")
        filters.append(fcls())
    raw_top = conf.get("top", 3)
    try:
        top = int(raw_top)
        if isinstance(raw_top, float | bool) or top < 1:
            raise ValueError
    except (TypeError, ValueError):
        raise ValueError(f"scheduler top {raw_top!r}: expected an integer >= 1") from None
    pick = conf.get("pick", "best")
    if pick not in PICKS:
        raise ValueError(f"scheduler pick {pick!r}: expected one of {', '.join(PICKS)}")
    sched = Scheduler(filters, scorers, top_n=top, pick=pick, rng=rng)
    return sched


def spec_error(routing: str, spec: str | None) -> str | None:
    """Why a model's ``scheduler`` setting is bad (None: it is fine, or the model is not ``scored``)."""
    if routing != "scored":
        return None
    try:
        parse_config(spec or DEFAULT_SPEC)
    except ValueError as exc:
        return str(exc)
    return None


_FUSED: dict[type, int] = {LeastRequest: 1, LeastLatency: 2, KVCache: 3, PrefixCache: 0}

DEFAULT = parse_config(DEFAULT_SPEC)  # Kthena's defaults; bind hints with DEFAULT.with_deps(...)
