"""F13 (reliability plan U11): outlier ejection through the real proxy, on the real clock.

Two replicas, round-robin: one answers every request with a 500 (a raw server counting them), one
is the stub engine. Sequential requests every ``base/40`` seconds. Figures: the failing replica's
hits before each ejection (pass: exactly 5 in a row), its share of traffic while ejected (pass:
0), and how long each ejection lasted (from the response of the 5th failure to the next request it
got; pass: base x n within ± 10 % + one request spacing, n = times ejected). ``base`` is the plan's
30 s scaled x 0.01 in make test, x 0.1 under the ``reliability`` marker.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.proxy._procs import request
from tests.proxy._rel import chat_body, figure
from tests.proxy.conftest import Stack, fast_settings, model
from tests.proxy.test_ejection_proxy import Failing


def ejection(stack: Stack, base: float, cycles: int = 2, slack: float | None = None) -> None:
    bad = Failing()
    port = stack.run(bad.start())
    try:
        stack.start_proxy([model("m", port, stack.stub, routing="round-robin")],
                          fast_settings(eject_base=base, eject_max=10 * base))
        step = base / 40
        events: list[tuple[float, bool]] = []  # (time of the answer, went to the failing replica)

        async def scenario() -> None:
            end_hits = 5 * cycles + 1  # the 5 of each cycle, then the first request after the last return
            while bad.hits < end_hits:
                before = bad.hits
                status, _, _ = await request(stack.port, "POST", "/v1/chat/completions", chat_body("m", "x"))
                events.append((time.monotonic(), bad.hits > before))
                assert status in (200, 500)
                await asyncio.sleep(step)

        asyncio.run(scenario())
        hits_at = [t for t, b in events if b]
        runs, durations, share_while_out = [], [], 0
        for c in range(cycles):
            five = hits_at[5 * c: 5 * c + 5]
            runs.append(len(five))
            ejected_at, back_at = five[-1], hits_at[5 * c + 5]
            durations.append(back_at - ejected_at)
            share_while_out += sum(1 for t, b in events if ejected_at < t < back_at and b)
        expected = [base * (c + 1) for c in range(cycles)]
        errors = [(d - e) / e * 100 for d, e in zip(durations, expected, strict=True)]
        figure("F13", base_s=base, requests=len(events), hits_per_ejection=runs, hits_while_ejected=share_while_out,
               ejected_for_s=[round(d, 4) for d in durations], expected_s=expected,
               error_pct=[round(e, 2) for e in errors])
        assert runs == [5] * cycles and share_while_out == 0
        for d, e in zip(durations, expected, strict=True):
            late = e * 0.10 + 2 * step if slack is None else slack
            assert e <= d <= e + late, (durations, expected)  # never early; late by one pick at most
    finally:
        stack.run(bad.stop())


def test_ejection_ci(stack: Stack) -> None:
    ejection(stack, base=0.3, slack=1.0)  # make test: never early; the ± 10 % is judged at full size


@pytest.mark.reliability
def test_ejection_full(stack: Stack) -> None:
    ejection(stack, base=3.0, cycles=3)
