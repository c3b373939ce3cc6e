"""The scored scheduler: every plugin's scores on constructed candidates (unknown data included),
the filters' fallbacks, weights / top-N / pick, the weighted-random distribution, the config
parser and its errors, and the explain header (format and bound).

Real parts: prefix hints are the router's :class:`PrefixStore`, the session ring is the compiled
:class:`HashRing` with bounded loads, as the router will inject them.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flexinfer._speedups import HashRing, chained_block_hashes
from flexinfer.proxy.routing import PrefixStore
from flexinfer.proxy.scheduler import (
    DEFAULT,
    DEFAULT_SPEC,
    Candidate,
    Columns,
    KVCache,
    LeastLatency,
    LeastRequest,
    LeastRequestFilter,
    LoraAffinity,
    PrefixCache,
    Request,
    Scheduler,
    SessionAffinity,
    parse_config,
)

REQ = Request("m")


def cand(i: int, **kw: object) -> Candidate:
    return Candidate(f"10.0.0.{i}:8000", **kw)  # type: ignore[arg-type]


def approx(xs: Sequence[float]) -> list[object]:
    return [pytest.approx(x) for x in xs]


def score(plugin: object, req: Request, cs: Sequence[Candidate]) -> list[float]:
    """A scorer's answer for candidate objects (plugins read columns)."""
    return plugin.score(req, Columns.of(cs))  # type: ignore[attr-defined, no-any-return]


def kept(f: object, req: Request, cs: Sequence[Candidate]) -> list[Candidate]:
    """The candidates a filter keeps (it answers indices, or None for all)."""
    idx = f.filter(req, Columns.of(cs))  # type: ignore[attr-defined]
    return list(cs) if idx is None else [cs[i] for i in idx]


# ---- plugins ---------------------------------------------------------------------------------


def test_least_request_kthena_formula_and_unknown_running() -> None:
    cs = [cand(0, in_flight=0, running=0), cand(1, in_flight=2, running=2), cand(2, in_flight=4, running=1),
          cand(3, in_flight=2, running=None), cand(4, in_flight=1, running=5)]
    # bases: 0, 2, 4 + 100*3 = 304, unknown running: 2 + 100*2 = 202, running > in-flight: 1
    assert score(LeastRequest(), REQ, cs) == approx([100, 100 * 302 / 304, 0, 100 * 102 / 304, 100 * 303 / 304])
    # unknown never looks better than the same count with a known, caught-up engine
    s = score(LeastRequest(), REQ, [cand(0, in_flight=3, running=None), cand(1, in_flight=3, running=3)])
    assert s[0] < s[1]


def test_least_request_all_idle_is_full_score() -> None:
    cs = [cand(i, in_flight=0, running=None) for i in range(3)]
    assert score(LeastRequest(), REQ, cs) == [100.0, 100.0, 100.0]


def test_least_request_filter_drops_deep_queues_keeps_unknown_and_falls_back() -> None:
    f = LeastRequestFilter()
    cs = [cand(0, in_flight=0, waiting=12), cand(1, in_flight=0, waiting=3), cand(2, in_flight=0, waiting=None),
          cand(3, in_flight=0, waiting=10), cand(4, in_flight=0, waiting=9.5)]
    assert [c.key for c in kept(f, REQ, cs)] == [cs[1].key, cs[2].key, cs[4].key]
    full = [cand(0, in_flight=0, waiting=10), cand(1, in_flight=0, waiting=50)]
    assert list(kept(f, REQ, full)) == full


def test_least_latency_minmax_blend_and_unknown() -> None:
    cs = [cand(0, in_flight=0, ttft_s=0.1, tpot_s=0.01), cand(1, in_flight=0, ttft_s=0.3, tpot_s=0.01),
          cand(2, in_flight=0, ttft_s=0.2, tpot_s=0.03), cand(3, in_flight=0, ttft_s=None, tpot_s=None),
          cand(4, in_flight=0, ttft_s=0.1, tpot_s=None)]
    # ttft half: 50, 0, 25, 0, 50; tpot half: 50, 50, 0, 0, 0
    assert score(LeastLatency(), REQ, cs) == approx([100, 50, 25, 0, 50])


def test_least_latency_equal_and_all_unknown() -> None:
    same = [cand(i, in_flight=0, ttft_s=0.2, tpot_s=0.02) for i in range(2)] + [cand(9, in_flight=0)]
    assert score(LeastLatency(), REQ, same) == [100.0, 100.0, 0.0]
    assert score(LeastLatency(), REQ, [cand(i, in_flight=0) for i in range(3)]) == [0.0, 0.0, 0.0]


def test_kv_cache_scores_free_share_clamped_unknown_as_full() -> None:
    cs = [cand(0, in_flight=0, kv_usage=0.2), cand(1, in_flight=0, kv_usage=0.5), cand(2, in_flight=0),
          cand(3, in_flight=0, kv_usage=1.3), cand(4, in_flight=0, kv_usage=-0.1)]
    assert score(KVCache(), REQ, cs) == approx([80, 50, 0, 0, 100])


def test_prefix_cache_match_share_from_the_routers_store() -> None:
    store = PrefixStore()
    hashes = chained_block_hashes("You are a helpful assistant. " * 40, 64, 128)
    assert len(hashes) >= 8
    store.record("10.0.0.0:8000", hashes[:len(hashes) // 2])
    store.record("10.0.0.1:8000", hashes)
    cs = [cand(i, in_flight=0) for i in range(3)]
    got = score(PrefixCache(store), Request("m", prefix_hashes=hashes), cs)
    assert got == approx([100 * (len(hashes) // 2) / len(hashes), 100, 0])
    assert score(PrefixCache(store), Request("m"), cs) == [0.0, 0.0, 0.0]  # no prompt blocks
    assert score(PrefixCache(None), Request("m", prefix_hashes=hashes), cs) == [0.0, 0.0, 0.0]  # no hints


class _BatchStore(PrefixStore):
    """The router's store plus the optional one-call ``match_lens`` (counted)."""

    def __init__(self) -> None:
        super().__init__()
        self.batch_calls = 0

    def match_lens(self, keys: list[str], hashes: list[int]) -> list[int]:
        self.batch_calls += 1
        return [self.match_len(k, hashes) for k in keys]


def test_prefix_cache_uses_batched_hints_when_offered() -> None:
    store = _BatchStore()
    hashes = chained_block_hashes("batched lookups " * 100, 64, 128)
    store.record("10.0.0.2:8000", hashes[:3])
    cs = [cand(i, in_flight=0) for i in range(3)]
    got = score(PrefixCache(store), Request("m", prefix_hashes=hashes), cs)
    assert got == approx([0, 0, 300 / len(hashes)]) and store.batch_calls == 1


def _ring_pick(loads: dict[str, int]) -> tuple[HashRing, object]:
    ring = HashRing([f"10.0.0.{i}:8000" for i in range(4)])

    def pick(req: Request, cols: Columns) -> str | None:
        assert req.session is not None
        return ring.get_bounded(req.session, loads, 0.25)
    return ring, pick


def test_session_affinity_scores_the_ring_choice_only() -> None:
    ring, pick = _ring_pick({})
    sa = SessionAffinity(pick)  # type: ignore[arg-type]
    cs = [cand(i, in_flight=0) for i in range(4)]
    for session in ("alice", "bob", "carol"):
        want = ring.get(session)
        got = score(sa, Request("m", session=session), cs)
        assert got == [100.0 if c.key == want else 0.0 for c in cs]
    assert score(sa, Request("m"), cs) == [0.0] * 4
    assert score(SessionAffinity(None), Request("m", session="alice"), cs) == [0.0] * 4
    # the ring names an endpoint the filters removed: no preference rather than a wrong one
    owner = ring.get("alice")
    rest = [c for c in cs if c.key != owner]
    assert score(sa, Request("m", session="alice"), rest) == [0.0] * 3


def test_session_affinity_follows_bounded_load_spill() -> None:
    loads: dict[str, int] = {}
    ring, pick = _ring_pick(loads)
    owner = ring.get("alice")
    assert owner is not None
    loads.update({f"10.0.0.{i}:8000": 1 for i in range(4)})
    loads[owner] = 50  # far over (1 + 0.25) x average: the ring spills clockwise
    cs = [cand(i, in_flight=0) for i in range(4)]
    got = score(SessionAffinity(pick), Request("m", session="alice"), cs)  # type: ignore[arg-type]
    assert sum(got) == 100.0 and got[[c.key for c in cs].index(owner)] == 0.0


def test_lora_affinity_tiers() -> None:
    f = LoraAffinity()
    has = cand(0, in_flight=0, adapters=frozenset({"sql", "chat"}))
    lacks = cand(1, in_flight=0, adapters=frozenset({"chat"}))
    unknown = cand(2, in_flight=0, adapters=None)
    assert list(kept(f, Request("m", adapter="sql"), [lacks, unknown, has])) == [has]
    assert list(kept(f, Request("m", adapter="sql"), [lacks, unknown])) == [unknown]
    assert list(kept(f, Request("m", adapter="sql"), [lacks])) == [lacks]  # falls back to all
    assert list(kept(f, Request("m"), [lacks, unknown, has])) == [lacks, unknown, has]


# ---- the chain -------------------------------------------------------------------------------


class _Const:
    """A scorer with fixed scores (to test the chain's arithmetic alone)."""

    def __init__(self, name: str, scores: list[float]) -> None:
        self.name = name
        self.scores = scores

    def score(self, req: Request, cols: Columns) -> list[float]:
        by_key = {f"10.0.0.{i}:8000": s for i, s in enumerate(self.scores)}
        return [by_key[k] for k in cols.keys]


class _DropAll:
    name = "drop-all"

    def filter(self, req: Request, cols: Columns) -> list[int] | None:
        return []


def test_weights_decide_and_scores_are_reported() -> None:
    cs = [cand(i, in_flight=0) for i in range(3)]
    a, b = _Const("a", [100, 0, 40]), _Const("b", [0, 60, 40])
    d = Scheduler([], [(a, 1), (b, 1)]).choose(REQ, cs)
    assert d.key == cs[0].key  # 100 vs 60 vs 80
    d = Scheduler([], [(a, 1), (b, 2)]).choose(REQ, cs)
    assert d.key == cs[1].key  # 100 vs 120 vs 120: the earlier of equals
    assert d.total == {cs[0].key: 100.0, cs[1].key: 120.0, cs[2].key: 120.0}


def test_best_and_ties_take_turns() -> None:
    cs = [cand(i, in_flight=0) for i in range(3)]
    a, b = _Const("a", [100, 0, 40]), _Const("b", [0, 60, 80])
    sched = Scheduler([], [(a, 1), (b, 2)])  # totals 100, 120, 200
    assert [sched.choose(REQ, cs).key for _ in range(3)] == [cs[2].key] * 3  # no tie: always the best
    tie = Scheduler([], [(_Const("a", [50, 50, 10]), 1)])
    # the two tied for the best take turns, in the caller's order; the third is never picked
    assert [tie.choose(REQ, cs).key for _ in range(4)] == [cs[0].key, cs[1].key, cs[0].key, cs[1].key]
    fresh = Scheduler([], [(_Const("a", [50, 50, 10]), 1)])
    assert fresh.choose(REQ, [cs[1], cs[0], cs[2]]).key == cs[1].key  # the first turn: the earliest
    d = sched.choose(REQ, cs)
    assert d.scores == {cs[0].key: {"a": 100, "b": 0}, cs[1].key: {"a": 0, "b": 60}, cs[2].key: {"a": 40, "b": 80}}
    assert d.total == {cs[0].key: 100.0, cs[1].key: 120.0, cs[2].key: 200.0}


def test_filters_narrow_and_an_emptying_filter_is_ignored() -> None:
    cs = [cand(0, in_flight=0, waiting=20), cand(1, in_flight=5, waiting=0), cand(2, in_flight=0, waiting=None)]
    sched = Scheduler([_DropAll(), LeastRequestFilter()], [(LeastRequest(), 1)])
    d = sched.choose(REQ, cs)
    assert d.key == cs[2].key  # the idle cs[0] is dropped for its queue; cs[2]'s unknown queue stays
    assert set(d.scores) == {cs[1].key, cs[2].key} and d.n_input == 3
    assert "least-request 3->2" in d.reason and "drop-all" not in d.reason
    with pytest.raises(ValueError, match="no candidates"):
        sched.choose(REQ, [])


class _Short:
    name = "short"

    def score(self, req: Request, cols: Columns) -> list[float]:
        return [1.0] * (len(cols) - 1)


def test_scorer_of_wrong_length_is_an_error() -> None:
    cs = [cand(i, in_flight=0) for i in range(3)]
    with pytest.raises(ValueError):
        Scheduler([], [(LeastRequest(), 1), (_Short(), 1)]).choose(REQ, cs)


def _bound(n: int, p: float) -> float:
    return 5 * math.sqrt(n * p * (1 - p)) + 1


def test_weighted_random_follows_totals_within_top_n() -> None:
    cs = [cand(i, in_flight=0) for i in range(4)]
    sched = Scheduler([], [(_Const("a", [60, 30, 10, 0.5]), 1)], top_n=3, pick="weighted-random",
                      rng=random.Random(1234))
    n = 6000
    counts = dict.fromkeys((c.key for c in cs), 0)
    for _ in range(n):
        counts[sched.choose(REQ, cs).key] += 1
    assert counts[cs[3].key] == 0  # outside the top 3
    for i, p in enumerate((0.6, 0.3, 0.1)):
        assert abs(counts[cs[i].key] - n * p) <= _bound(n, p), counts
    d = sched.choose(REQ, cs)
    assert "weighted-random among top 3 of 4" in d.reason


def test_weighted_random_all_zero_is_uniform_over_top() -> None:
    cs = [cand(i, in_flight=0) for i in range(5)]
    sched = Scheduler([], [(_Const("z", [0, 0, 0, 0, 0]), 1)], top_n=2, pick="weighted-random",
                      rng=random.Random(7))
    n = 4000
    counts = [0] * 5
    for _ in range(n):
        counts[int(sched.choose(REQ, cs).key.split(".")[3].split(":")[0])] += 1
    assert counts[2:] == [0, 0, 0]  # stable ranking: the first two of equals are the top 2
    assert abs(counts[0] - n / 2) <= _bound(n, 0.5)


def test_same_seed_same_sequence() -> None:
    cs = [cand(i, in_flight=i) for i in range(6)]

    def run() -> list[str]:
        s = parse_config("least-request:1;top=4;pick=weighted-random", rng=random.Random(99))
        return [s.choose(REQ, cs).key for _ in range(50)]
    assert run() == run()
    assert len(set(run())) > 1


def test_default_chain_prefers_cached_prefix_over_a_small_load_gap() -> None:
    store = PrefixStore()
    hashes = chained_block_hashes("system prompt shared by the conversation " * 30, 64, 128)
    store.record("10.0.0.1:8000", hashes)
    sched = DEFAULT.with_deps(prefix_hints=store)
    cs = [cand(0, in_flight=3, running=3, waiting=0, ttft_s=0.2, tpot_s=0.02),
          cand(1, in_flight=4, running=4, waiting=0, ttft_s=0.2, tpot_s=0.02),
          cand(2, in_flight=2, running=2, waiting=11, ttft_s=0.1, tpot_s=0.01)]
    d = sched.choose(Request("m", prefix_hashes=hashes), cs)
    assert d.key == cs[1].key  # prefix 100 beats least-request's 25-point gap; cs[2] filtered (queue)
    assert set(d.scores) == {cs[0].key, cs[1].key}
    assert DEFAULT.choose(Request("m", prefix_hashes=hashes), cs).key == cs[0].key  # no hints bound


# ---- config ----------------------------------------------------------------------------------


def test_parse_string_and_mapping_forms() -> None:
    s = parse_config("least-request:2,kv-cache,session-affinity:0.5;filters=least-request,lora-affinity;top=5;"
                     "pick=weighted-random")
    assert [(p.name, w) for p, w in s.scorers] == [("least-request", 2.0), ("kv-cache", 1.0),
                                                   ("session-affinity", 0.5)]
    assert [f.name for f in s.filters] == ["least-request", "lora-affinity"]
    assert (s.top_n, s.pick) == (5, "weighted-random")
    m = parse_config({"scorers": {"least-request": 2, "kv-cache": 1, "session-affinity": 0.5},
                      "filters": ["least-request", "lora-affinity"], "top": 5, "pick": "weighted-random"})
    assert m.spec == s.spec
    assert parse_config({"scorers": ["least-request:2", "kv-cache"]}).spec == \
        "least-request:2,kv-cache:1;filters=;top=3;pick=best"
    assert parse_config("scorers=prefix-cache;filters=").filters == ()
    assert DEFAULT.spec == DEFAULT_SPEC
    assert [(p.name, w) for p, w in DEFAULT.scorers] == [("least-request", 1), ("least-latency", 1),
                                                         ("prefix-cache", 1)]
    assert [f.name for f in DEFAULT.filters] == ["least-request"] and DEFAULT.pick == "best"


def test_with_deps_binds_hints_and_ring() -> None:
    store = PrefixStore()

    def ring(req: Request, cols: Columns) -> str | None:
        return cols.keys[-1]
    s = parse_config("prefix-cache,session-affinity").with_deps(prefix_hints=store, ring_pick=ring)
    pc, sa = (p for p, _ in s.scorers)
    assert isinstance(pc, PrefixCache) and pc.hints is store
    assert isinstance(sa, SessionAffinity) and sa.ring_pick is ring


@pytest.mark.parametrize(("spec", "message"), [
    ("least-requests:1", "unknown scorer 'least-requests'"),
    ("least-request:abc", "scorer 'least-request': weight 'abc' is not a number"),
    ("kv-cache:-1", "scorer 'kv-cache': weight '-1' must be a positive"),
    ("kv-cache:0", "scorer 'kv-cache': weight '0' must be a positive"),
    ("kv-cache:nan", "weight 'nan' must be a positive finite"),
    ("kv-cache,kv-cache:2", "scorer 'kv-cache' named twice"),
    ("kv-cache;filters=lora", "unknown filter 'lora'"),
    ("kv-cache;filters=lora-affinity,lora-affinity", "filter 'lora-affinity' named twice"),
    ("kv-cache;top=0", "top '0': expected an integer >= 1"),
    ("kv-cache;top=x", "top 'x'"),
    ("kv-cache;pick=random", "pick 'random': expected one of best, weighted-random"),
    ("kv-cache;colour=red", "unknown key(s) colour"),
    ("kv-cache;top=2;top=3", "'top' given twice"),
    ("kv-cache;least-request", "'least-request' is not key=value"),
    (";filters=least-request", "no scorer named"),
    ({"scorers": {"kv-cache": "heavy"}}, "scorer 'kv-cache': weight 'heavy'"),
    ({"scorers": [3]}, "entry 3 is not"),
    ({"scorers": "kv-cache", "top": 2.5}, "top 2.5"),
    ({"scorers": "kv-cache", "top": True}, "top True"),
])
def test_config_errors_name_the_culprit(spec: object, message: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_config(spec)  # type: ignore[arg-type]
    assert message in str(err.value)


# ---- explain header --------------------------------------------------------------------------


def test_header_format() -> None:
    cs = [cand(i, in_flight=0) for i in range(3)]
    sched = Scheduler([], [(_Const("a", [10, 90, 50]), 1), (_Const("b", [0, 10, 40]), 2)])
    d = sched.choose(REQ, cs)
    assert d.key == "10.0.0.2:8000"  # 10, 110, 130
    assert d.header() == ("pick=10.0.0.2:8000; reason=best total 130.0 of 3; "
                          "10.0.0.2:8000 t=130.0 a=50 b=40; 10.0.0.1:8000 t=110.0 a=90 b=10; "
                          "10.0.0.0:8000 t=10.0 a=10 b=0")
    d.header().encode("ascii")


def test_header_is_bounded() -> None:
    cs = [Candidate(f"10.1.{i // 200}.{i % 200}:8000", in_flight=i % 5, running=1, waiting=0, kv_usage=0.5,
                    ttft_s=0.1 + i / 1000, tpot_s=0.02) for i in range(64)]
    d = parse_config("least-request,least-latency,kv-cache,prefix-cache").choose(REQ, cs)
    full = d.header(100_000)
    assert full.count("10.1.") == 64 + 1 and "more" not in full
    for limit in (300, 512, 1024):
        h = d.header(limit)
        assert len(h) <= limit and h.startswith(f"pick={d.key}; reason=")
        assert h.endswith(" more") and h.count("10.1.") >= 2  # the chosen one's scores always fit here
        shown = h.count("10.1.") - 1
        assert h.endswith(f"+{64 - shown} more")
    assert len(d.header(20)) <= 20


def test_header_bound_holds_at_every_limit_and_counts_the_rest() -> None:
    cs = [Candidate(f"10.2.0.{i}:8000", in_flight=i % 3, running=0, kv_usage=i / 20) for i in range(12)]
    d = parse_config("least-request,kv-cache").choose(REQ, cs)
    for limit in range(1, 700):
        h = d.header(limit)
        assert len(h) <= limit, limit
        if limit < 20:
            continue
        shown = max(h.count("10.2.") - 1, 0)
        if shown < 12:
            assert h.endswith(f"; +{12 - shown} more"), (limit, h)
        else:
            assert h == d.header(100_000)


_opt = st.one_of(st.none(), st.floats(0.0, 50.0))


@settings(deadline=None, max_examples=200)
@given(st.lists(st.tuples(st.integers(0, 30), _opt, _opt, st.one_of(st.none(), st.floats(0.0, 1.0)), _opt, _opt),
                min_size=1, max_size=16),
       st.sampled_from(["least-request,least-latency,prefix-cache;filters=least-request",
                        "least-request:2,kv-cache:1,least-latency:0.5", "kv-cache", "prefix-cache:3,least-request"]),
       st.integers(0, 7))
def test_the_fused_pick_is_the_chains_pick(rows: list[tuple[Any, ...]], spec: str, calls: int) -> None:
    """choose_index (one compiled call) picks what choose (plugin by plugin) picks, tie turns
    included, and the Decision rebuilt with the turn it used names the same endpoint."""
    store = PrefixStore()
    keys = [f"10.0.0.{i}:8000" for i in range(len(rows))]
    hashes = chained_block_hashes("shared head " * 50, 64, 128, packed=True)
    for i, k in enumerate(keys):
        store.record(k, hashes[: (i * 5) % len(hashes)])
    fused = parse_config(spec, prefix_hints=store)
    plain = parse_config(spec, prefix_hints=store)
    assert fused.fused is not None
    in_flight = [r[0] for r in rows]
    engine = (*([r[i] for r in rows] for i in (1, 2, 3, 4, 5)), [None] * len(rows))
    req = Request("m", prefix_hashes=hashes)
    for _ in range(calls + 1):
        i = fused.choose_index(hashes, keys, in_flight, engine)
        d = plain.choose(req, Columns(keys, in_flight, *engine))
        assert keys[i] == d.key
        assert fused.last_full == (store.match_len(keys[i], hashes) >= len(hashes))
        again = fused.choose(req, Columns(keys, in_flight, *engine), turn=fused.last_turn)
        assert again.key == keys[i]


def test_chains_the_fused_call_cannot_run_use_choose() -> None:
    assert parse_config("least-request;pick=weighted-random").fused is None
    assert parse_config("least-request;filters=lora-affinity").fused is None
    assert parse_config("session-affinity,least-request").fused is None
    assert parse_config(DEFAULT_SPEC).fused is not None
