"""Open-loop load for the scheduling benchmark: shared-prefix conversations, streamed, measured.

Owns: the request plan (:func:`plan`: Poisson arrivals at ``rate`` per second for ``seconds``; each
arrival either opens a conversation on one of ``systems`` shared system prompts or adds a turn to an
open one, so prompts share a system prefix and grow turn by turn; prompt and output lengths vary;
all of it drawn from ``random.Random(seed)``, so a seed is one fixed sequence), sending it
(:func:`run_load`: each request leaves at its planned time whatever the earlier ones are doing,
streamed with ``stream_options.include_usage``), measuring each request (TTFT = the first event
with content, end-to-end latency, errors), and the :class:`Summary` (:func:`summarize`: TTFT
p50/p99, e2e p50/p99, throughput, and the engines' prefix-cache hit rate from their ``/metrics``
counters read before and after).

Must not: import FlexInfer (it stands for the clients, outside the system under test); wait for a
response before sending the next request (open loop); feed a reply back into the plan (the
assistant turns are synthetic, so the sequence depends on the seed only).

CLI: ``python bench/simload.py --url http://127.0.0.1:8080 --model sim --rate 20 --seconds 10
--metrics http://127.0.0.1:18001/metrics ...`` prints the summary as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

_WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet",
          "kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango",
          "uniform", "victor", "whiskey", "xray", "yankee", "zulu", "the", "of", "and", "to", "in",
          "is", "that", "for", "it", "with", "as", "was", "on", "be", "at", "by", "this", "had", "not",
          "are", "but", "from", "or", "have", "an", "they", "which")


@dataclass(frozen=True)
class Planned:
    """One request of the plan: when it leaves (seconds after the start) and what it says."""

    at: float
    conversation: int
    turn: int
    system: int
    messages: tuple[tuple[str, str], ...]
    max_tokens: int

    def body(self, model: str) -> dict[str, Any]:
        return {"model": model, "messages": [{"role": r, "content": c} for r, c in self.messages],
                "max_tokens": self.max_tokens, "stream": True, "stream_options": {"include_usage": True}}


@dataclass
class Result:
    """One request as the client saw it (seconds; ``ttft``/``e2e`` are None when it failed)."""

    planned: Planned
    target: str
    sent: float = 0.0
    ttft: float | None = None
    e2e: float | None = None
    tokens: int = 0
    status: int = 0
    error: str = ""


@dataclass
class Summary:
    requests: int
    ok: int
    errors: int
    ttft_p50: float
    ttft_p99: float
    e2e_p50: float
    e2e_p99: float
    throughput_rps: float
    tokens_per_s: float
    hit_rate: float | None
    elapsed: float
    error_kinds: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _text(rng: random.Random, chars: int) -> str:
    out: list[str] = []
    n = 0
    while n < chars:
        w = rng.choice(_WORDS)
        out.append(w)
        n += len(w) + 1
    return " ".join(out)[:chars]


def plan(seed: int, rate: float, seconds: float, *, systems: int = 4, system_chars: tuple[int, int] = (1500, 4000),
         user_chars: tuple[int, int] = (60, 600), reply_chars: tuple[int, int] = (100, 500),
         max_tokens: tuple[int, int] = (8, 64), new_conversation: float = 0.35, max_turns: int = 6) -> list[Planned]:
    """The request sequence for ``seed`` (see the module doc); ``(lo, hi)`` ranges are uniform."""
    rng = random.Random(seed)
    sys_prompts = [f"[system {k}] " + _text(rng, rng.randint(*system_chars)) for k in range(systems)]
    open_convs: dict[int, tuple[int, list[tuple[str, str]], int]] = {}  # id -> (system, messages, turns left)
    out: list[Planned] = []
    t = 0.0
    next_conv = 0
    while True:
        t += rng.expovariate(rate)
        if t >= seconds:
            return out
        if not open_convs or rng.random() < new_conversation:
            cid, next_conv = next_conv, next_conv + 1
            k = rng.randrange(systems)
            msgs: list[tuple[str, str]] = [("system", sys_prompts[k])]
            open_convs[cid] = (k, msgs, rng.randint(1, max_turns))
        else:
            cid = rng.choice(sorted(open_convs))
            k, msgs, _ = open_convs[cid]
            msgs.append(("assistant", _text(rng, rng.randint(*reply_chars))))
        k, msgs, left = open_convs[cid]
        msgs.append(("user", f"[conv {cid}] " + _text(rng, rng.randint(*user_chars))))
        turn = sum(1 for r, _ in msgs if r == "user")
        out.append(Planned(at=t, conversation=cid, turn=turn, system=k, messages=tuple(msgs),
                           max_tokens=rng.randint(*max_tokens)))
        if left <= 1:
            del open_convs[cid]
        else:
            open_convs[cid] = (k, msgs, left - 1)


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile ``q`` (0..100) of ``values``; NaN when empty."""
    if not values:
        return math.nan
    s = sorted(values)
    pos = (len(s) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def prefix_counters(text: str) -> tuple[float, float]:
    """(hits, queries) summed over a Prometheus page's ``vllm:prefix_cache_hits``/``_queries`` counters."""
    hits = queries = 0.0
    for fam in text_string_to_metric_families(text):
        name = fam.name.removesuffix("_total")
        if name in ("vllm:prefix_cache_hits", "vllm:prefix_cache_queries"):
            v = sum(s.value for s in fam.samples if s.name.endswith("_total"))
            if name.endswith("hits"):
                hits += v
            else:
                queries += v
    return hits, queries


async def read_counters(session: aiohttp.ClientSession, urls: Sequence[str]) -> tuple[float, float]:
    hits = queries = 0.0
    for u in urls:
        async with session.get(u) as r:
            h, q = prefix_counters(await r.text())
        hits += h
        queries += q
    return hits, queries


def summarize(results: Sequence[Result], elapsed: float, before: tuple[float, float] | None = None,
              after: tuple[float, float] | None = None) -> Summary:
    """The :class:`Summary` of ``results`` over ``elapsed`` seconds; the hit rate from counter deltas."""
    ok = [r for r in results if not r.error]
    ttft = [r.ttft for r in ok if r.ttft is not None]
    e2e = [r.e2e for r in ok if r.e2e is not None]
    kinds: dict[str, int] = {}
    for r in results:
        if r.error:
            kinds[r.error] = kinds.get(r.error, 0) + 1
    hit_rate = None
    if before is not None and after is not None and after[1] > before[1]:
        hit_rate = (after[0] - before[0]) / (after[1] - before[1])
    el = max(elapsed, 1e-9)
    return Summary(requests=len(results), ok=len(ok), errors=len(results) - len(ok),
                   ttft_p50=percentile(ttft, 50), ttft_p99=percentile(ttft, 99),
                   e2e_p50=percentile(e2e, 50), e2e_p99=percentile(e2e, 99),
                   throughput_rps=len(ok) / el, tokens_per_s=sum(r.tokens for r in ok) / el,
                   hit_rate=hit_rate, elapsed=elapsed, error_kinds=kinds)


async def _one(session: aiohttp.ClientSession, res: Result, model: str, timeout: float) -> None:
    loop = asyncio.get_running_loop()
    res.sent = loop.time()
    done = False
    try:
        async with asyncio.timeout(timeout), session.post(res.target + "/v1/chat/completions",
                                                          json=res.planned.body(model)) as r:
            res.status = r.status
            if r.status != 200:
                await r.read()
                res.error = f"status {r.status}"
                return
            async for raw in r.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    done = True
                    break
                ev = json.loads(payload)
                for ch in ev.get("choices") or ():
                    delta = ch.get("delta") or {}
                    if delta.get("content") or ch.get("text"):
                        if res.ttft is None:
                            res.ttft = loop.time() - res.sent
                        res.tokens += 1
        if not done:
            res.error = "stream ended without [DONE]"
        elif res.ttft is None:
            res.error = "no content"
        else:
            res.e2e = loop.time() - res.sent
    except TimeoutError:
        res.error = "timeout"
    except (aiohttp.ClientError, ValueError, OSError) as e:
        res.error = type(e).__name__


async def run_load(base_url: str | Sequence[str], model: str, rate: float, seconds: float, seed: int, *,
                   metrics_urls: Sequence[str] = (), timeout: float = 60.0,
                   requests: list[Planned] | None = None, results: list[Result] | None = None,
                   **plan_kw: Any) -> Summary:
    """Send :func:`plan` ``(seed, rate, seconds, **plan_kw)`` (or ``requests``) open-loop and summarize.

    ``base_url`` is the proxy (or several engines, taken in turn per request). ``metrics_urls`` are
    the engines' ``/metrics`` pages for the hit rate. Each request's :class:`Result` is appended to
    ``results`` when given.
    """
    targets = [base_url] if isinstance(base_url, str) else list(base_url)
    reqs = requests if requests is not None else plan(seed, rate, seconds, **plan_kw)
    out: list[Result] = results if results is not None else []
    loop = asyncio.get_running_loop()
    conn = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=None)) as session:
        before = await read_counters(session, metrics_urls) if metrics_urls else None
        tasks: list[asyncio.Task[None]] = []
        t0 = loop.time()
        for i, p in enumerate(reqs):
            delay = t0 + p.at - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            res = Result(planned=p, target=targets[i % len(targets)].rstrip("/"))
            out.append(res)
            tasks.append(asyncio.create_task(_one(session, res, model, timeout)))
        if tasks:
            await asyncio.gather(*tasks)
        elapsed = loop.time() - t0
        after = await read_counters(session, metrics_urls) if metrics_urls else None
    return summarize(out, elapsed, before, after)


def main() -> None:
    ap = argparse.ArgumentParser(description="open-loop shared-prefix load (streamed chat completions)")
    ap.add_argument("--url", action="append", required=True, help="proxy or engine base URL (repeatable)")
    ap.add_argument("--model", default="sim")
    ap.add_argument("--rate", type=float, default=10.0, help="requests per second (Poisson)")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--systems", type=int, default=4, help="shared system prompts")
    ap.add_argument("--metrics", action="append", default=[], help="an engine's /metrics URL (repeatable)")
    args = ap.parse_args()
    t = time.monotonic()
    s = asyncio.run(run_load(args.url, args.model, args.rate, args.seconds, args.seed,
                             metrics_urls=args.metrics, systems=args.systems))
    print(json.dumps(s.as_dict() | {"wall_s": round(time.monotonic() - t, 3)}, indent=2))


if __name__ == "__main__":
    main()
