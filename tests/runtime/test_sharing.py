"""Table tests of the shared-GPU leader choice (used by the operator and the local runtime)."""

from __future__ import annotations

import pytest

from flexinfer.operator.sharing import Member, Windows, better, choose_leader, cooldown_of, queue_positions

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


@pytest.mark.parametrize(("members", "leader"), [(c[1], c[2]) for c in CASES], ids=[c[0] for c in CASES])
def test_choose_leader(members: list[Member], leader: str | None) -> None:
    assert choose_leader(members, NOW) == leader


def test_case_count() -> None:
    assert len(CASES) >= 30


def test_order_independent() -> None:
    for _, members, leader in CASES:
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
