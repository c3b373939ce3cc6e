"""Table tests of the shared-GPU leader choice (used by the operator and the local runtime)."""

from __future__ import annotations

import pytest

from flexinfer.sharing import (
    GroupPolicy,
    Member,
    Windows,
    better,
    choose_leader,
    cooldown_of,
    evictions,
    holds,
    queue_positions,
)

NOW = 10_000.0
M = Member


def ago(s: float) -> float:
    return NOW - s


CASES: list[tuple[str, list[Member], str | None]] = [
    ("empty group", [], None),
    ("single idle member", [M("a")], "a"),
    ("single ready member", [M("a", phase="Ready")], "a"),
    ("nobody active: higher priority", [M("a", 50), M("b", 150)], "b"),
    ("nobody active: equal priority -> smaller name", [M("b"), M("a")], "a"),
    ("ready beats idle higher priority", [M("a", 50, "Ready"), M("b", 900)], "a"),
    ("ready and busy keeps lead against equal demand",
     [M("a", phase="Ready", last_active=ago(30)), M("b", last_active=ago(1))], "a"),
    ("ready idle loses to equal-priority demand",
     [M("a", phase="Ready", last_active=ago(200)), M("b", last_active=ago(1))], "b"),
    ("ready with no activity loses to demand", [M("a", phase="Ready"), M("b", last_active=ago(5))], "b"),
    ("ready idle keeps lead against lower-priority demand",
     [M("a", 200, "Ready", ago(500)), M("b", 100, last_active=ago(1))], "a"),
    ("higher-priority demand preempts busy ready",
     [M("a", 100, "Ready", ago(10)), M("b", 500, last_active=ago(1))], "b"),
    ("equal priority demand cannot preempt busy ready",
     [M("a", 100, "Ready", ago(10)), M("b", 100, last_active=ago(1))], "a"),
    ("demand outside window does not count",
     [M("a", phase="Ready", last_active=ago(500)), M("b", last_active=ago(130))], "a"),
    ("recent (5m) leads when nobody is ready", [M("a", last_active=ago(200)), M("b", 50)], "a"),
    ("recent prefers higher priority", [M("a", 10, last_active=ago(10)), M("b", 20, last_active=ago(250))], "b"),
    ("recent equal priority -> newer", [M("a", last_active=ago(10)), M("b", last_active=ago(250))], "a"),
    ("stale everyone -> fallback by priority", [M("a", 1, last_active=ago(9999)), M("b", 2, last_active=ago(9999))], "b"),
    ("two ready: priority", [M("a", 1, "Ready"), M("b", 2, "Ready")], "b"),
    ("two ready equal: newer activity", [M("a", phase="Ready", last_active=ago(50)),
                                         M("b", phase="Ready", last_active=ago(20))], "b"),
    ("two ready equal, the idle one leads by name, the demanded one wins",
     [M("b", phase="Ready", last_active=ago(5)), M("a", phase="Ready")], "b"),
    ("cooldown keeps the active member",
     [M("a", 100, "Ready", ago(500), "Active"), M("b", 900, last_active=ago(1), preempted_at=ago(60))], "a"),
    ("cooldown over: demand wins again",
     [M("a", 100, "Ready", ago(500), "Active"), M("b", 900, last_active=ago(1), preempted_at=ago(400))], "b"),
    ("cooldown but nobody active: normal rules",
     [M("a", 100, "Ready", ago(500), "Queued"), M("b", 900, last_active=ago(1), preempted_at=ago(60))], "b"),
    ("member swap cooldown extends the window",
     [M("a", 100, "Ready", ago(500), "Active", swap_cooldown=900),
      M("b", 900, last_active=ago(1), preempted_at=ago(600))], "a"),
    ("preempted leader is still eligible after cooldown",
     [M("a", 100, "", ago(1), "Preempted", preempted_at=ago(1000)), M("b", 100, "Ready", ago(400))], "a"),
    ("loading member counts only by activity",
     [M("a", 100, "Loading", ago(1)), M("b", 100, "Ready", ago(400))], "a"),
    ("failed member with demand can still be chosen when ready idle",
     [M("a", 100, "Failed", ago(1)), M("b", 100, "Ready", ago(400))], "a"),
    ("three members: highest-priority demand",
     [M("a", 100, "Ready", ago(400)), M("b", 300, last_active=ago(1)), M("c", 200, last_active=ago(2))], "b"),
    ("three members: ready busy, two lower demands", [M("a", 500, "Ready", ago(5)), M("b", 300, last_active=ago(1)),
                                                      M("c", 200, last_active=ago(2))], "a"),
    ("three members: demand tie by recency", [M("a", 100, "Ready", ago(400)), M("b", 100, last_active=ago(1)),
                                              M("c", 100, last_active=ago(3))], "b"),
    ("priority 0 vs 1000", [M("low", 0, last_active=ago(1)), M("high", 1000, last_active=ago(1))], "high"),
    ("ready is the demanded one", [M("a", 100, "Ready", ago(1)), M("b", 50)], "a"),
    ("demand at exactly the window edge counts", [M("a", 100, "Ready", ago(121)), M("b", 100, last_active=ago(120))], "b"),
    ("ready active at exactly the edge is busy", [M("a", 100, "Ready", ago(120)), M("b", 100, last_active=ago(1))], "a"),
]


# The late refinements (§2.4, last bullet). Every case of LATE picks another leader under the rule without
# them; LATE_BOUNDS are their limits (the same leader either way).
LATE: list[tuple[str, list[Member], str | None]] = [
    # config.warmPolicy: primary wins the idle fallback
    ("primary wins the idle fallback", [M("a", 200), M("p", 50, primary=True)], "p"),
    ("primary wins over stale activity", [M("a", 200, last_active=ago(9999)),
                                          M("p", 50, last_active=ago(9999), primary=True)], "p"),
    ("two primaries: the better one", [M("a", 900), M("p", 50, primary=True), M("q", 60, primary=True)], "q"),
    # gpu.forcePromotion: a demanded forced member takes the GPU now
    ("forced demand ignores the cooldown",
     [M("a", 100, "Ready", ago(500), "Active"), M("b", 100, last_active=ago(1), preempted_at=ago(60),
                                                  force_promotion=True)], "b"),
    ("forced demand preempts a busy ready leader",
     [M("a", 100, "Ready", ago(5), "Active"), M("b", 100, last_active=ago(1), force_promotion=True)], "b"),
    ("forced demand preempts a busy higher-priority leader",
     [M("a", 900, "Ready", ago(5), "Active"), M("b", 10, last_active=ago(1), force_promotion=True)], "b"),
    ("forced demand beats a cold-start hold",
     [M("a", 100, "Loading", ago(10), "Active", loading_since=ago(10)),
      M("b", 50, last_active=ago(1), force_promotion=True)], "b"),
    ("two forced: the active one keeps the lead against equal priority",
     [M("a", 100, "Loading", ago(3), "Active", force_promotion=True),
      M("b", 100, last_active=ago(1), force_promotion=True)], "a"),
    ("two forced: a higher priority takes over, cooldown or not",
     [M("a", 100, "Ready", ago(3), "Active", force_promotion=True),
      M("b", 200, last_active=ago(1), preempted_at=ago(10), force_promotion=True)], "b"),
    ("two forced, neither active: the better one",
     [M("a", 100, "Ready", ago(3), "Active"), M("b", 100, last_active=ago(1), force_promotion=True),
      M("c", 100, last_active=ago(2), force_promotion=True)], "b"),
    # a demanded model whose cache is not ready cannot preempt a ready leader
    ("uncached demand cannot preempt an idle ready leader",
     [M("a", 100, "Ready", ago(500)), M("b", 100, last_active=ago(1), cache_ready=False)], "a"),
    ("uncached higher-priority demand cannot preempt a busy ready leader",
     [M("a", 100, "Ready", ago(10)), M("b", 500, last_active=ago(1), cache_ready=False)], "a"),
    ("the best cached demand preempts instead",
     [M("a", 100, "Ready", ago(500)), M("b", 500, last_active=ago(1), cache_ready=False),
      M("c", 100, last_active=ago(2))], "c"),
    # an Active Pending/Loading member keeps the lead within its coldStartTimeout
    ("loading leader holds against newer demand",
     [M("a", 100, "Loading", ago(20), "Active", loading_since=ago(20)), M("b", 100, last_active=ago(1))], "a"),
    ("pending leader holds against higher-priority demand",
     [M("a", 100, "Pending", ago(20), "Active", loading_since=ago(20)), M("b", 900, last_active=ago(1))], "a"),
    ("hold at exactly the timeout",
     [M("a", 100, "Loading", ago(60), "Active", loading_since=ago(60)), M("b", 900, last_active=ago(1))], "a"),
    ("hold follows the member's coldStartTimeout",
     [M("a", 100, "Loading", ago(200), "Active", loading_since=ago(200), cold_start_timeout=300),
      M("b", 900, last_active=ago(1))], "a"),
    ("hold beats a ready idle member", [M("a", 100, "Loading", ago(200), "Active", loading_since=ago(5)),
                                        M("b", 100, "Ready", ago(400)), M("c", 300, last_active=ago(1))], "a"),
]

LATE_BOUNDS: list[tuple[str, list[Member], str | None]] = [
    ("ready beats primary", [M("a", 50, "Ready"), M("p", 900, primary=True)], "a"),
    ("recent beats primary", [M("a", 50, last_active=ago(200)), M("p", 900, primary=True)], "a"),
    ("demand beats an idle primary", [M("a", 50, last_active=ago(1)), M("p", 900, primary=True)], "a"),
    ("forced without demand is not forced",
     [M("a", 100, "Ready", ago(500), "Active"), M("b", 900, preempted_at=ago(60), force_promotion=True)], "a"),
    ("forced demand past the window is not forced",
     [M("a", 100, "Ready", ago(5), "Active"), M("b", 900, last_active=ago(121), force_promotion=True)], "a"),
    ("forced with an uncached model waits",
     [M("a", 100, "Ready", ago(5), "Active"), M("b", 100, last_active=ago(1), force_promotion=True,
                                                cache_ready=False)], "a"),
    ("uncached demand leads when nobody is ready",
     [M("a", 100, last_active=ago(500)), M("b", 100, last_active=ago(1), cache_ready=False)], "b"),
    ("hold over after the timeout",
     [M("a", 100, "Loading", ago(61), "Active", loading_since=ago(61)), M("b", 900, last_active=ago(1))], "b"),
    ("a loading member that is not active holds nothing",
     [M("a", 100, "Loading", ago(20), "Queued", loading_since=ago(20)), M("b", 900, last_active=ago(1))], "b"),
    ("no load start known: no hold (the local runtime)",
     [M("a", 100, "Loading", ago(20), "Active"), M("b", 900, last_active=ago(1))], "b"),
    ("a ready member holds nothing",
     [M("a", 100, "Ready", ago(400), "Active", loading_since=ago(5)), M("b", 100, last_active=ago(1))], "b"),
]

@pytest.mark.parametrize(("members", "leader"), [(c[1], c[2]) for c in CASES], ids=[c[0] for c in CASES])
def test_choose_leader(members: list[Member], leader: str | None) -> None:
    assert choose_leader(members, NOW) == leader


def test_case_count() -> None:
    assert len(CASES) >= 30


@pytest.mark.parametrize(("members", "leader"), [(c[1], c[2]) for c in LATE + LATE_BOUNDS],
                         ids=[c[0] for c in LATE + LATE_BOUNDS])
def test_late_refinements(members: list[Member], leader: str | None) -> None:
    assert choose_leader(members, NOW) == leader


def test_late_refinements_change_the_choice() -> None:
    """Without the refinements' fields (the defaults), every LATE case chooses another leader."""
    from dataclasses import replace

    for name, members, leader in LATE:
        plain = [replace(m, force_promotion=False, primary=False, cache_ready=True, loading_since=None)
                 for m in members]
        assert choose_leader(plain, NOW) != leader, name


def test_member_defaults_refine_nothing() -> None:
    m = M("a", phase="Loading", state="Active")
    assert (m.force_promotion, m.primary, m.cache_ready, m.loading_since) == (False, False, True, None)
    assert not holds(m, NOW)
    assert holds(M("a", phase="Pending", state="Active", loading_since=ago(1)), NOW)


def test_order_independent() -> None:
    for _, members, leader in CASES + LATE + LATE_BOUNDS:
        assert choose_leader(list(reversed(members)), NOW) == leader


def test_scaled_windows() -> None:
    w = Windows(demand=1.0, recent=2.0, min_cooldown=3.0)
    ms = [M("a", phase="Ready", last_active=ago(1.5)), M("b", last_active=ago(0.1))]
    assert choose_leader(ms, NOW, w) == "b"
    assert choose_leader(ms, NOW) == "a"
    assert cooldown_of(ms, w) == 300.0  # member default swap cooldown still applies
    assert cooldown_of([M("a", swap_cooldown=1)], w) == 3.0


def test_better_and_positions() -> None:
    assert better(M("a", 2), M("b", 1))
    assert better(M("b", last_active=2.0), M("a", last_active=1.0))
    assert better(M("a"), M("b"))
    pos = queue_positions([M("a", 1), M("b", 5), M("c", 5), M("d", 9)], "d")
    assert pos == {"d": 0, "b": 1, "c": 2, "a": 3}


EX, PER, BOTH = GroupPolicy(exclusive=True), GroupPolicy(persistent=True), GroupPolicy(True, True)
#: (case, starting model, its group, running (name, group), policies, what must stop first)
EVICTIONS: list[tuple[str, str, str | None, list[tuple[str, str | None]], dict[str, GroupPolicy], list[str]]] = [
    ("nothing running", "a", "g", [], {"g": EX}, []),
    ("plain group: only its own members swap", "a", "g", [("b", "g"), ("x", "h"), ("u", None)], {}, ["b"]),
    ("itself is never evicted", "a", "g", [("a", "g")], {"g": EX}, []),
    ("no group: evicts nothing", "u", None, [("a", "g"), ("v", None)], {"g": EX}, []),
    ("exclusive: other groups and ungrouped go", "a", "g", [("b", "g"), ("x", "h"), ("u", None)], {"g": EX},
     ["b", "u", "x"]),
    ("exclusive spares a persistent group", "a", "g", [("x", "h"), ("p", "keep")], {"g": EX, "keep": PER}, ["x"]),
    ("persistent still swaps within itself", "p", "keep", [("q", "keep"), ("x", "h")], {"keep": PER}, ["q"]),
    ("persistent and exclusive: evicts others, spared by others", "p", "pe", [("x", "h"), ("q", "pe")],
     {"pe": BOTH}, ["q", "x"]),
    ("exclusive spares persistent+exclusive", "a", "g", [("p", "pe")], {"g": EX, "pe": BOTH}, []),
    ("a non-exclusive start leaves an exclusive group alone", "x", "h", [("a", "g")], {"g": EX}, []),
    ("unknown group in policies: defaults", "a", "g", [("x", "nope")], {"g": EX}, ["x"]),
    ("two exclusive groups evict each other", "a", "g", [("b", "g2")], {"g": EX, "g2": EX}, ["b"]),
]


@pytest.mark.parametrize(("starting", "group", "running", "policies", "out"), [c[1:] for c in EVICTIONS],
                         ids=[c[0] for c in EVICTIONS])
def test_evictions(starting: str, group: str | None, running: list[tuple[str, str | None]],
                   policies: dict[str, GroupPolicy], out: list[str]) -> None:
    assert evictions(starting, group, running, policies) == out
    assert evictions(starting, group, list(reversed(running)), policies) == out  # order independent


def test_eviction_defaults_are_todays_one_member_per_group() -> None:
    running = [("b", "g"), ("x", "h"), ("u", None)]
    assert evictions("a", "g", running) == evictions("a", "g", running, {"g": GroupPolicy()}) == ["b"]
