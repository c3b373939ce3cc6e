"""F12 (reliability plan U1 + Envoy's retry budget): one of three replicas refuses connections.

Two stub engines and a bound port that does not listen (every connect is refused), round-robin, C
clients in a closed loop, each POST carrying its own marker. Figures: success share; the retry
budget's high-water mark (open retries at once) against ``max(3, 20 % of the model's in-flight)``
at that moment; total retries; POST duplicates (a marker seen twice by the engines) = 0; and what
the budget refused. With the outlier ejector on (the default), the refusing replica leaves
rotation after 5 refusals and the budget only has to hold the first burst; with it off
(``eject_consecutive=0``, reported only) every third request needs a retry and the budget is
what bounds the extra load.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections import Counter
from collections.abc import Iterator

import pytest

from tests.proxy._procs import request
from tests.proxy._rel import chat_body, figure
from tests.proxy.conftest import Stack, fast_settings, model


@pytest.fixture
def refusing() -> Iterator[int]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))  # bound, never listening: connect() is refused
    try:
        yield s.getsockname()[1]
    finally:
        s.close()


def run(stack: Stack, refusing: int, total: int, concurrency: int, eject: int = 5) -> tuple[Counter[int], int]:
    second = stack.add_stub()
    stack.start_proxy([model("m", stack.stub, refusing, second, routing="round-robin")],
                      fast_settings(eject_consecutive=eject))
    port = stack.port
    codes: Counter[int] = Counter()
    counter = iter(range(total))

    async def client() -> None:
        for i in counter:
            status, _, _ = await request(port, "POST", "/v1/chat/completions", chat_body("m", f"req-{i}"))
            codes[status] += 1

    async def scenario() -> None:
        await asyncio.gather(*(client() for _ in range(concurrency)))

    asyncio.run(scenario())
    fwd = stack.handler.forwarder
    budget = fwd.retries
    seen = Counter(json.loads(c.body)["messages"][0]["content"] for s in stack.stubs for c in s.requests)
    dups = sum(v - 1 for v in seen.values() if v > 1)
    hw_open, hw_in_flight = budget.high_water
    text = stack.call(lambda: stack.handler.metrics.render().decode())
    retries = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                  if line.startswith("flexinfer_proxy_upstream_retries_total{"))
    figure("F12", eject_consecutive=eject, requests=total, concurrency=concurrency, ok=codes[200],
           success_pct=codes[200] / total * 100, retries=int(retries), budget_refused=budget.refused, budget_waited=budget.waited,
           high_water_open=hw_open, in_flight_then=hw_in_flight, allowed_then=budget.allowed(hw_in_flight),
           post_duplicates=dups, engine_requests=sum(seen.values()), codes=dict(codes))
    assert sum(codes.values()) == total
    assert dups == 0 and sum(seen.values()) == codes[200]  # each POST reached an engine at most once
    assert hw_open <= budget.allowed(hw_in_flight)
    assert retries == budget.granted
    return codes, dups


def test_one_of_three_refusing_ci(stack: Stack, refusing: int) -> None:
    codes, _ = run(stack, refusing, total=600, concurrency=20)
    assert codes[200] / 600 >= 0.99, codes  # CI size: the first burst weighs more (full size: >= 99.9 %)
    assert stack.handler.forwarder.retries.refused == 0  # a full budget made retries wait, not fail


@pytest.mark.reliability
@pytest.mark.parametrize("concurrency", [20, 50])
def test_one_of_three_refusing_full(stack: Stack, refusing: int, concurrency: int) -> None:
    codes, _ = run(stack, refusing, total=10_000, concurrency=concurrency)
    assert codes[200] / 10_000 >= 0.999, codes


@pytest.mark.reliability
def test_one_of_three_refusing_no_ejection(stack: Stack, refusing: int) -> None:
    """Reported: the budget alone (no ejection); the success share is what it costs."""
    run(stack, refusing, total=3000, concurrency=50, eject=0)


def test_budget_arithmetic() -> None:
    from flexinfer.proxy.retrybudget import RetryBudget
    b = RetryBudget()
    assert [b.take("m", 1) for _ in range(4)] == [True, True, True, False]  # the minimum: 3
    assert b.take("other", 1)  # per model
    b.done("m")
    assert b.take("m", 1) and not b.take("m", 19)
    assert b.take("m", 20)  # 20 % of 20 = 4 open
    assert (b.granted, b.high_water) == (6, (4, 20))  # refusals are the forwarder's (after its wait)
    with pytest.raises(ValueError):
        RetryBudget(percent=1.5)


async def test_a_full_budget_hands_its_next_slot_to_the_oldest_waiter() -> None:
    from flexinfer.proxy.retrybudget import RetryBudget
    b = RetryBudget(min_concurrency=1, percent=0.0)
    assert b.take("m", 1) and not b.take("m", 1)
    first, second, other = b.wait_slot("m"), b.wait_slot("m"), b.wait_slot("x")
    first.cancel()  # a waiter that gave up is skipped
    b.done("m")
    assert second.done() and not other.done()
    assert b.take("m", 1)  # the woken waiter takes the slot that ended
