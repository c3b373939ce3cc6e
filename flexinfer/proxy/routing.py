"""Replica choice: routing strategies over an immutable per-model endpoint snapshot.

Strategies (per model, from its ``routing`` setting or the ``flexinfer.ai/routing`` annotation):

- ``default``: the only endpoint, or round-robin over several (``round-robin`` is the same).
- ``session-affinity``: key = ``X-Session-ID`` -> ``X-Conversation-ID`` -> body ``session_id`` ->
  ``"msg:"`` + 16 hex of sha256 over the first <= 5 message contents; endpoint from the hash ring
  with bounded loads (a hot session cannot melt one replica).
- ``prefix``: key = ``X-Flexinfer-Cache-Key`` -> body ``cache_key`` (<= 128 chars of
  ``[A-Za-z0-9._:/=-]``, lowercased) -> body ``prefix`` (first 512 chars) -> the system messages;
  endpoint from the ring; with none of these, the session key.
- ``prefix-cache``: chained 64-byte block hashes of the prompt matched against a :class:`PrefixStore`
  that remembers which endpoint served which blocks; among the top 5 longest matches the least
  loaded wins.
- ``scored``: the scheduler chain of :mod:`flexinfer.proxy.scheduler` (filters, weighted scorers, top-N,
  pick) over each endpoint's in-flight count and its engine's scraped metrics (``engine_state``, from
  :mod:`flexinfer.proxy.scrape`; unknown when stale, never idle); per model ``scheduler`` names the
  chain, Kthena's defaults otherwise (least-request, least-latency, prefix-cache; least-request filter).
- ``failover``: the first endpoint of the view's order that is not excluded (the global proxy
  orders its clusters: ``failoverOrder``, or by probe latency; docs/globalproxy.md).
- ``weighted``: smooth weighted round-robin (nginx's) by the view's ``weights``: exact counts over
  each cycle of the weights' sum, interleaved.
- ``least-loaded``: fewest in-flight requests: this process's (:class:`LocalLoad`), or with
  ``--workers N`` every worker's of the machine and, with Redis sharing, every replica's
  (:class:`flexinfer.proxy.machine.SharedLoad`).

A strategy that finds no key falls back to ``least-loaded``. The router keeps one ring per model and
applies endpoint diffs when a new (immutable) view arrives; it does no I/O.
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
from collections.abc import Callable, Sequence
from itertools import repeat
from time import monotonic
from typing import Any, Protocol, cast

from flexinfer._speedups import HashRing, SharedPrefixes, chained_block_hashes
from flexinfer.proxy.ejection import Ejector
from flexinfer.proxy.enginemetrics import EngineState
from flexinfer.proxy.machine import PREFIX_SETS
from flexinfer.proxy.scheduler import DEFAULT_SPEC, Columns, Decision, Request, Scheduler, parse_config
from flexinfer.runtime.base import Endpoint, ModelView

CACHE_KEY_RE = re.compile(r"[A-Za-z0-9._:/=\-]{1,128}\Z")
PREFIX_CHARS = 512
SESSION_MESSAGES = 5
PREFIX_BLOCKS = 128
PREFIX_BLOCK_SIZE = 64
PREFIX_TOP = 5
BOUNDED_LOAD_EPSILON = 0.25

log = logging.getLogger("flexinfer.proxy")

#: model (or adapter) name -> the seed of its prompts' block chains (the name's own hash)
_SEEDS: dict[str, int] = {}


class _Headers(Protocol):
    def get(self, name: bytes, default: bytes | None = None) -> bytes | None: ...


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: keep the text ones
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def _header_str(req: _Headers, name: bytes) -> str | None:
    v = req.get(name)
    if not v:
        return None
    try:
        s = v.decode("ascii").strip()
    except UnicodeDecodeError:
        return None
    return s[:256] or None


def session_key(data: dict[str, Any] | None, req: _Headers) -> tuple[str | None, str]:
    """(key, source) for session affinity."""
    for name, source in ((b"x-session-id", "session-header"), (b"x-conversation-id", "conversation-header")):
        v = _header_str(req, name)
        if v:
            return v, source
    if data is None:
        return None, "none"
    sid = data.get("session_id")
    if isinstance(sid, str) and sid:
        return sid[:256], "body-session"
    msgs = data.get("messages")
    if isinstance(msgs, list) and msgs:
        h = hashlib.sha256()
        for m in msgs[:SESSION_MESSAGES]:
            if isinstance(m, dict):
                h.update(_content_text(m.get("content")).encode("utf-8", "surrogatepass"))
                h.update(b"\x00")
        return "msg:" + h.hexdigest()[:16], "messages"
    return None, "none"


def prefix_key(data: dict[str, Any] | None, req: _Headers) -> tuple[str | None, str]:
    """(key, source) for the ``prefix`` strategy."""
    v = _header_str(req, b"x-flexinfer-cache-key")
    if v and CACHE_KEY_RE.match(v):
        return v.lower(), "cache-key-header"
    if data is not None:
        ck = data.get("cache_key")
        if isinstance(ck, str) and CACHE_KEY_RE.match(ck):
            return ck.lower(), "cache-key"
        p = data.get("prefix")
        if isinstance(p, str) and p:
            return p[:PREFIX_CHARS], "prefix"
        msgs = data.get("messages")
        if isinstance(msgs, list):
            system = "".join(_content_text(m.get("content")) for m in msgs
                             if isinstance(m, dict) and m.get("role") == "system")
            if system:
                return system[:PREFIX_CHARS], "system"
    return session_key(data, req)


def prompt_text(data: dict[str, Any] | None, limit: int = PREFIX_BLOCKS * PREFIX_BLOCK_SIZE) -> str:
    """The prompt as one string (chat contents in order, or ``prompt``), cut at ``limit`` chars."""
    if data is None:
        return ""
    msgs = data.get("messages")
    if type(msgs) is list:
        parts: list[str] = []
        add = parts.append
        size = 0
        for m in msgs:
            if type(m) is dict:
                t = m.get("content")
                if type(t) is not str:
                    t = _content_text(t)
                add(t)
                size += len(t)
                if size >= limit:
                    break
        text = "".join(parts)
        return text if len(text) <= limit else text[:limit]
    p = data.get("prompt")
    if isinstance(p, str):
        return p[:limit]
    if isinstance(p, list) and p and isinstance(p[0], str):
        return p[0][:limit]
    return ""


class PrefixStore:
    """Which endpoint served which prompt-block hashes, for one process: the same set-associative
    table the workers of a machine share (:class:`flexinfer._speedups.SharedPrefixes`, compiled),
    in private memory. One table for every endpoint, bounded (``sets`` x 8 hashes: 262,144 in
    2 MiB by default), sharded by hash (a block's hash picks its 64-byte set) and replaced within a
    set round-robin. It is per model through the hashes: the router seeds each prompt's block chain
    with the model (or LoRA adapter) name, so two models' prompts never match each other's blocks.
    An endpoint's id is a small integer kept here (reused once the endpoint is forgotten)."""

    def __init__(self, sets: int = PREFIX_SETS) -> None:
        self._table = SharedPrefixes(bytearray(SharedPrefixes.size(sets)), sets)
        self._ids: dict[str, int] = {}
        self._free: list[int] = []
        self._next = 1
        self._version = 0  # bumped when an endpoint gets or loses its id
        self._last_eps: list[str] | None = None  # the last match_lens keys list, and its ids
        self._last_ids: list[int | None] = []
        self._last_version = -1

    def _id(self, ep: str, claim: bool) -> int | None:
        i = self._ids.get(ep)
        if i is None and claim:
            if self._free:
                i = self._free.pop()
            elif self._next <= 0xFFFF:
                i, self._next = self._next, self._next + 1
            else:  # 65,535 live endpoints in one process: no hints for more (routing still works)
                return None
            self._ids[ep] = i
            self._version += 1
        return i

    def match_len(self, ep: str, hashes: Sequence[int]) -> int:
        """Longest i such that hashes[:i] were all served by ``ep``, walking from block 0 (the chain:
        block i's hash covers blocks 0..i; a block replaced in the table ends the match there)."""
        i = self._ids.get(ep)
        return 0 if i is None or not hashes else self._table.match_lens([i], hashes)[0]

    def match_lens(self, eps: list[str], hashes: Sequence[int]) -> list[int]:
        """``match_len`` of each of ``eps`` in one walk over the table."""
        if not hashes:
            return [0] * len(eps)
        if eps is self._last_eps and self._last_version == self._version:  # the router's keys list: stable
            ids = self._last_ids
        else:  # every candidate gets its id now (one that never served a block matches nothing)
            ids = [self._id(e, True) for e in eps]
            self._last_eps, self._last_ids, self._last_version = eps, ids, self._version
        if None not in ids:
            return self._table.match_lens(cast("list[int]", ids), hashes)
        known = [(j, i) for j, i in enumerate(ids) if i is not None]  # never recorded here: 0
        out = [0] * len(eps)
        if known:
            for (j, _), n in zip(known, self._table.match_lens([i for _, i in known], hashes), strict=True):
                out[j] = n
        return out

    def record(self, ep: str, hashes: Sequence[int]) -> None:
        if hashes:
            i = self._id(ep, True)
            if i is not None:
                self._table.record(i, hashes)

    def forget(self, ep: str) -> None:
        i = self._ids.pop(ep, None)
        if i is not None:
            self._table.forget(i)
            self._free.append(i)
            self._version += 1

    def endpoints(self) -> list[str]:
        return list(self._ids)


class LoadCounter(Protocol):
    """In-flight requests per endpoint key, as the router counts and reads them."""

    def acquire(self, key: str) -> None: ...

    def release(self, key: str) -> None: ...

    def get(self, key: str, default: int = 0) -> int: ...

    def loads(self, keys: Sequence[str]) -> list[int]: ...

    def snapshot(self) -> dict[str, int]:
        """This process's non-zero counts (tests and the runtime's load view)."""
        ...


class PrefixHints(Protocol):
    """Which endpoint served which prompt blocks (:class:`PrefixStore` or a shared table)."""

    def match_len(self, ep: str, hashes: Sequence[int]) -> int: ...

    def match_lens(self, eps: list[str], hashes: Sequence[int]) -> list[int]: ...

    def record(self, ep: str, hashes: Sequence[int]) -> None: ...

    def forget(self, ep: str) -> None: ...


class LocalLoad(dict[str, int]):
    """In-flight counts of one process: a dict (``get`` is the dict's own)."""

    # (dict.get(self, ...): the build calls the dict's own get in C, not a method found by name)
    def acquire(self, key: str) -> None:
        self[key] = dict.get(self, key, 0) + 1

    def release(self, key: str) -> None:
        n = dict.get(self, key, 0) - 1
        if n > 0:
            self[key] = n
        else:
            dict.pop(self, key, None)

    def loads(self, keys: Sequence[str]) -> list[int]:
        return list(map(self.get, keys, repeat(0, len(keys))))  # C-level: no comprehension frame

    def snapshot(self) -> dict[str, int]:
        return dict(self)


#: How long a model's engine columns (the scraped figures of its endpoints, as the scheduler reads
#: them) are reused before they are rebuilt from the scraper: far below the scrape interval (1 s)
#: and the age at which figures turn unknown (2 s), so no decision reads figures staler than that.
ENGINE_COLUMNS_TTL = 0.05


#: Points per endpoint on a model's ring. The ring's default (150) let one added endpoint of 8 take
#: 1.204/N of 100k keys (reliability plan F15: <= 1.2/N); 400 points bring the worst of N = 2..40
#: to 1.127/N, for 32 ms to build a 100-endpoint ring (once per endpoint change, not per request).
RING_VNODES = 400


class _ModelState:
    __slots__ = ("by_key", "endpoints", "eng", "eng_at", "eng_keys", "keys", "ring", "ring_nodes", "rr", "sched",
                 "sched_view", "wrr")

    def __init__(self) -> None:
        self.endpoints: tuple[Endpoint, ...] = ()
        self.by_key: dict[str, Endpoint] = {}
        self.keys: list[str] = []  # the endpoints' keys in view order (the ejector's input)
        self.ring = HashRing(vnodes=RING_VNODES)
        self.ring_nodes: tuple[str, ...] = ()  # the ring's node order: the order of its loads list
        self.rr = 0
        self.eng: tuple[list[Any], ...] = ()  # waiting, running, kv, ttft, tpot, adapters (by ``keys``)
        self.eng_at = -math.inf
        self.eng_keys: list[str] | None = None  # the ``keys`` list ``eng`` was built for
        self.sched: Scheduler | None = None  # the ``scored`` chain of the view it was looked up for
        self.sched_view: ModelView | None = None
        self.wrr: dict[str, int] = {}  # ``weighted``: each endpoint's current weight (smooth WRR)


class Router:
    """Picks an endpoint per request and tracks in-flight counts per endpoint."""

    # the per-request ones are C slots in the compiled build (routing.pxd); "__dict__" for the rest
    __slots__ = ("__dict__", "_last_model", "_models", "_picks", "_schedulers", "ejector", "engine_last",
                 "engine_state", "load", "prefixes", "scheduler_errors")

    def __init__(self, prefix_sets: int = PREFIX_SETS, *, load: LoadCounter | None = None,
                 prefixes: PrefixHints | None = None, ejector: Ejector | None = None) -> None:
        #: passive outlier ejection: endpoints that failed in a row are skipped (None: never)
        self.ejector = ejector
        #: the engine metrics of an endpoint for ``scored`` (None: unknown; set by the composition root)
        self.engine_state: Callable[[str], EngineState | None] | None = None
        #: the latest scrape of an endpoint however old or failed (``/debug/endpoints`` only)
        self.engine_last: Callable[[str], EngineState | None] | None = None
        #: each model's latest ``scored`` pick, as what it was made from (a fused pick makes no
        #: :class:`Decision`: :meth:`decision` rebuilds one when asked, the same pick with its scores)
        self._picks: dict[str, tuple[Scheduler, tuple[Any, ...], list[str], list[int], tuple[list[Any], ...], int]
                          | Decision] = {}
        self._last_model: str | None = None
        #: model -> why its ``scheduler`` setting was refused (the default chain serves it meanwhile)
        self.scheduler_errors: dict[str, str] = {}
        self._schedulers: dict[tuple[str, str | None], Scheduler] = {}
        self.load: LoadCounter = load if load is not None else cast(LoadCounter, LocalLoad())
        self.prefixes: PrefixHints = prefixes if prefixes is not None else PrefixStore(prefix_sets)
        self._models: dict[str, _ModelState] = {}

    @property
    def in_flight(self) -> dict[str, int]:
        """This process's open requests per endpoint (non-zero counts only)."""
        return self.load.snapshot()

    def _state(self, view: ModelView) -> _ModelState:
        st: _ModelState | None = self._models.get(view.name)
        if st is None:
            st = self._models[view.name] = _ModelState()
        eps = view.endpoints
        if st.endpoints is not eps and st.endpoints != eps:
            gone = set(st.by_key) - {e.key for e in eps}
            st.ring.set_nodes([e.key for e in eps])  # applies the diff
            st.ring_nodes = tuple(st.ring.nodes)
            st.by_key = {e.key: e for e in eps}
            st.keys = [e.key for e in eps]
            for key in gone:
                if not any(key in s.by_key for s in self._models.values()):
                    self.prefixes.forget(key)
        st.endpoints = eps
        return st

    def pick(self, view: ModelView, data: dict[str, Any] | None, req: _Headers,
             exclude: frozenset[str] = frozenset()) -> tuple[Endpoint, str, str]:
        """(endpoint, strategy, key source) for one request; LookupError when none is left."""
        st: _ModelState = self._state(view)
        eps = st.endpoints  # view.endpoints, as _state just set it
        if self.ejector is not None and len(eps) > 1:
            keys = st.keys
            usable = self.ejector.usable(keys)
            if len(usable) != len(keys):  # some are out: the ring walks past them like past a refusal
                exclude = exclude | (set(keys) - set(usable))
        if exclude:
            eps = tuple(e for e in eps if e.key not in exclude)
        if not eps:
            raise LookupError(view.name)
        strategy = view.routing
        if len(eps) == 1:
            ep = eps[0]
            if strategy == "prefix-cache":
                self.prefixes.record(ep.key, self._hashes(view, data))
            return ep, strategy if strategy != "round-robin" else "default", "single"
        if strategy in ("default", "round-robin"):
            st.rr += 1
            return eps[st.rr % len(eps)], "round-robin", "none"
        if strategy in ("session-affinity", "prefix"):
            key, source = (session_key if strategy == "session-affinity" else prefix_key)(data, req)
            if key is not None:
                picked = self._ring_pick(st, key, exclude)
                if picked is not None:
                    return picked, strategy, source
            return self._least_loaded(eps), strategy, "fallback-least-loaded"
        if strategy == "scored":
            return self._scored(view, st, eps, data, req)
        if strategy == "prefix-cache":
            hashes = self._hashes(view, data)
            ep, source = self._prefix_cache_pick(eps, hashes)
            self.prefixes.record(ep.key, hashes)
            return ep, strategy, source
        if strategy == "failover":
            return eps[0], strategy, "order"
        if strategy == "weighted":
            return self._weighted(st, view, eps), strategy, "weights"
        return self._least_loaded(eps), "least-loaded", "in-flight"

    @staticmethod
    def _weighted(st: _ModelState, view: ModelView, eps: tuple[Endpoint, ...]) -> Endpoint:
        """Smooth weighted round-robin: every endpoint gains its weight, the richest is picked and
        pays the total back (deterministic: counts follow the weights exactly per cycle)."""
        weights, cur = view.weights, st.wrr
        total, best, best_w = 0, eps[0], None
        for e in eps:
            w = weights.get(e.key, 1)
            total += w
            c = cur[e.key] = cur.get(e.key, 0) + w
            if best_w is None or c > best_w:
                best, best_w = e, c
        cur[best.key] -= total
        return best

    def scheduler(self, model: str, spec: str | None) -> Scheduler:
        """The chain ``spec`` names for ``model`` (None: the default), built once and bound to this
        router's prefix hints and the model's ring. A bad spec (the composition root refuses one in a
        config file at start; a Kubernetes annotation can change at any time) is remembered in
        :attr:`scheduler_errors`, logged once, and the default chain serves the model."""
        sched = self._schedulers.get((model, spec))
        if sched is None:
            try:
                sched = parse_config(spec or DEFAULT_SPEC, prefix_hints=self.prefixes, ring_pick=self._ring_for)
                self.scheduler_errors.pop(model, None)
            except ValueError as exc:
                self.scheduler_errors[model] = str(exc)
                log.warning("model %r: scheduler %r refused (%s); the default chain serves it", model, spec, exc)
                sched = parse_config(DEFAULT_SPEC, prefix_hints=self.prefixes, ring_pick=self._ring_for)
            self._schedulers[(model, spec)] = sched
        return sched

    def decision(self, model: str) -> Decision | None:
        """``model``'s latest ``scored`` decision with every candidate's scores (for ``/debug`` and
        the explain header), rebuilt from its inputs if the pick was fused."""
        got = self._picks.get(model)
        if got is None or isinstance(got, Decision):
            return got
        sched, req, keys, in_flight, engine, turn = got
        d = sched.choose(Request(*req), Columns(keys, in_flight, *engine), turn=turn)
        self._picks[model] = d
        return d

    @property
    def last_decision(self) -> Decision | None:
        """The latest ``scored`` decision of any model (read right after :meth:`pick`: pick is
        synchronous, so nothing can run in between)."""
        return self.decision(self._last_model) if self._last_model is not None else None

    def _ring_for(self, req: Request, cols: Columns) -> str | None:
        """The session-affinity scorer's lookup: the model's bounded-load ring (the one the
        ``session-affinity`` strategy walks), over the loads of all its endpoints; an answer the
        filters removed gives no preference."""
        st = self._models.get(req.model)
        if st is None or req.session is None or not st.ring_nodes:
            return None
        name = st.ring.get_bounded(req.session, self.load.loads(st.ring_nodes), BOUNDED_LOAD_EPSILON)
        return name if name in cols.keys else None

    def _engine_columns(self, st: _ModelState) -> tuple[list[Any], ...]:
        """The model's engine figures by endpoint, rebuilt from the scraper (the caller does so at
        most every :data:`ENGINE_COLUMNS_TTL` seconds, or when the endpoints changed)."""
        now = monotonic()
        keys = st.keys
        state = self.engine_state
        waiting: list[float | None] = []
        running: list[float | None] = []
        kv: list[float | None] = []
        ttft: list[float | None] = []
        tpot: list[float | None] = []
        adapters: list[frozenset[str] | None] = []
        for k in keys:
            es = state(k) if state is not None else None
            if es is None:
                waiting.append(None)
                running.append(None)
                kv.append(None)
                ttft.append(None)
                tpot.append(None)
                adapters.append(None)
            else:
                waiting.append(es.waiting)
                running.append(es.running)
                kv.append(es.kv_usage)
                ttft.append(es.ttft_s)
                tpot.append(es.tpot_s)
                adapters.append(es.adapters)
        st.eng = (waiting, running, kv, ttft, tpot, adapters)
        st.eng_at, st.eng_keys = now, keys
        return st.eng

    def _scored(self, view: ModelView, st: _ModelState, eps: tuple[Endpoint, ...], data: dict[str, Any] | None,
                req: _Headers) -> tuple[Endpoint, str, str]:
        sched = st.sched
        if sched is None or st.sched_view is not view:  # looked up once per view object (views are immutable)
            sched = st.sched = self.scheduler(view.name, view.scheduler)
            st.sched_view = view
        keys = st.keys
        in_flight = self.load.loads(keys)
        engine = st.eng
        if st.eng_keys is not keys or monotonic() - st.eng_at >= ENGINE_COLUMNS_TTL:
            engine = self._engine_columns(st)
        hashes = self._hashes(view, data) if sched.needs_prefix else ()
        adapter = None
        if not view.rewrite_model and data is not None and isinstance(data.get("model"), str):
            adapter = data["model"]  # a LoRA adapter routed to its parent's replicas
        self._last_model = view.name
        if sched.fused is not None and len(eps) == len(keys):  # the whole chain in one compiled call
            i = sched.choose_index(hashes, keys, in_flight, engine)
            key = keys[i]
            self._picks[view.name] = (sched, (view.name, adapter, None, hashes), keys, in_flight, engine,
                                      sched.last_turn)
            full = sched.last_full
        else:
            session = session_key(data, req)[0] if sched.needs_session else None
            cols = Columns(keys, in_flight, *engine)
            if len(eps) != len(keys):  # some are excluded (ejected, or refused on this request's first try)
                left = {e.key for e in eps}
                cols = cols.take([i for i, k in enumerate(keys) if k in left])
            decision = self._picks[view.name] = sched.choose(Request(view.name, adapter, session, hashes), cols)
            key = decision.key
            full = sched.holds(key, len(hashes))
        ep = st.by_key[key]
        if hashes and not full:  # an endpoint that has every block already: nothing to add
            self.prefixes.record(ep.key, hashes)
        return ep, "scored", sched.pick

    def _ring_pick(self, st: _ModelState, key: str, exclude: frozenset[str]) -> Endpoint | None:
        name = st.ring.get_bounded(key, self.load.loads(st.ring_nodes), BOUNDED_LOAD_EPSILON)
        if name is None:
            return None
        if name in exclude:  # a refused replica on retry: walk to the next one on the ring
            for e in st.endpoints:
                if e.key not in exclude:
                    return e
            return None
        return st.by_key.get(name)

    def _least_loaded(self, eps: tuple[Endpoint, ...]) -> Endpoint:
        get = self.load.get
        best, best_n = eps[0], get(eps[0].key, 0)
        for e in eps[1:]:
            n = get(e.key, 0)
            if n < best_n:
                best, best_n = e, n
        return best

    @staticmethod
    def _hashes(view: ModelView, data: dict[str, Any] | None) -> Sequence[int]:
        """The prompt's chained block hashes, seeded with the model the engine runs it as (the
        model, or the LoRA adapter a request names on its parent's replicas: their KV caches
        differ), so one table holds every model's hints and none matches another's."""
        text = prompt_text(data)
        if not text:
            return []
        name = view.name
        if not view.rewrite_model and data is not None:
            m = data.get("model")
            if isinstance(m, str):
                name = m
        seed = _SEEDS.get(name)
        if seed is None:
            if len(_SEEDS) >= 65_536:  # names come from the inventory, but adapters from requests
                _SEEDS.clear()
            seed = _SEEDS[name] = chained_block_hashes(name, 4096, 1)[0] if name else 0
        return chained_block_hashes(text, PREFIX_BLOCK_SIZE, PREFIX_BLOCKS, True, seed)  # packed, positional: cheap

    def _prefix_cache_pick(self, eps: tuple[Endpoint, ...], hashes: Sequence[int]) -> tuple[Endpoint, str]:
        if hashes:
            lens = self.prefixes.match_lens([e.key for e in eps], hashes)
            scored = list(zip(lens, eps, strict=True))
            scored = [s for s in scored if s[0] > 0]
            if scored:
                scored.sort(key=lambda s: -s[0])
                top = scored[:PREFIX_TOP]
                get = self.load.get
                best = min(top, key=lambda s: (get(s[1].key, 0), -s[0]))
                return best[1], f"prefix-match-{best[0]}"
        return self._least_loaded(eps), "prefix-miss"

    def acquire(self, ep: Endpoint) -> None:
        self.load.acquire(ep.key)

    def release(self, ep: Endpoint) -> None:
        self.load.release(ep.key)
