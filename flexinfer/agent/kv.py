"""KV-cache usage of the model pods on this node, scraped from their Prometheus endpoints.

:func:`parse_kv_usage` is a pure parser of the Prometheus text format that averages the KV-cache
gauges it knows (vLLM ``vllm:kv_cache_usage_perc`` and its older ``vllm:gpu_cache_usage_perc``,
llama.cpp ``llamacpp:kv_cache_usage_ratio``; all are fractions 0..1 despite the names).
:func:`scrape_kv_usage` fetches ``http://<podIP>:<port>/metrics`` for each pod (2 s timeout, the
pod's declared container ports first, then 8000/8080/11434) and averages the pods that answered.
No Kubernetes calls here: the caller passes the pods.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

log = logging.getLogger(__name__)

KV_METRICS = frozenset({
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",
    "vllm:gpu_cache_usage_percent",
    "llamacpp:kv_cache_usage_ratio",
    "llamacpp_kv_cache_usage_ratio",
})
DEFAULT_PORTS = (8000, 8080, 11434)
MAX_METRICS_BYTES = 4 * 1024 * 1024


def _split_sample(line: str) -> tuple[str, str] | None:
    """(metric name, value token) of one sample line; None when malformed."""
    brace = line.find("{")
    space = min((i for i in (line.find(" "), line.find("\t")) if i >= 0), default=-1)
    if brace >= 0 and (space < 0 or brace < space):
        name = line[:brace]
        i, in_quotes = brace + 1, False
        while i < len(line):  # find the closing brace, skipping quoted label values
            ch = line[i]
            if in_quotes:
                if ch == "\\":
                    i += 1
                elif ch == '"':
                    in_quotes = False
            elif ch == '"':
                in_quotes = True
            elif ch == "}":
                break
            i += 1
        else:
            return None
        rest = line[i + 1:].split()
    else:
        if space < 0:
            return None
        name, rest = line[:space], line[space:].split()
    return (name.strip(), rest[0]) if rest else None


def parse_kv_usage(text: str, metrics: Iterable[str] = KV_METRICS) -> float | None:
    """Average of the known KV-cache gauges in a Prometheus text page (clamped to 0..1), or None."""
    wanted = metrics if isinstance(metrics, frozenset | set) else frozenset(metrics)
    total, n = 0.0, 0
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        got = _split_sample(line)
        if got is None or got[0] not in wanted:
            continue
        try:
            v = float(got[1])
        except ValueError:
            continue
        if math.isfinite(v):
            total += min(max(v, 0.0), 1.0)
            n += 1
    return total / n if n else None


def pod_targets(pod: Mapping[str, Any], default_ports: Sequence[int] = DEFAULT_PORTS) -> tuple[str, list[int]] | None:
    """(pod IP, ports to try) for a running pod given as a raw dict, or None."""
    status = pod.get("status") if isinstance(pod.get("status"), Mapping) else {}
    meta = pod.get("metadata") if isinstance(pod.get("metadata"), Mapping) else {}
    spec = pod.get("spec") if isinstance(pod.get("spec"), Mapping) else {}
    assert isinstance(status, Mapping) and isinstance(meta, Mapping) and isinstance(spec, Mapping)
    ip = status.get("podIP")
    if not ip or status.get("phase") != "Running" or meta.get("deletionTimestamp"):
        return None
    declared: list[int] = []
    for c in spec.get("containers") or []:
        ports = c.get("ports") if isinstance(c, Mapping) else None
        for p in ports or []:
            if isinstance(p, Mapping) and isinstance(p.get("containerPort"), int) and p.get("protocol", "TCP") == "TCP":
                declared.append(p["containerPort"])
    ordered = list(dict.fromkeys([*declared, *default_ports]))
    return str(ip), ordered


async def fetch_metrics(session: Any, url: str, timeout: float = 2.0) -> str | None:
    """GET ``url`` with ``session`` (aiohttp); the text on 200, else None. Never raises (bar cancel)."""
    import aiohttp

    try:
        async with asyncio.timeout(timeout):
            async with session.get(url) as resp:
                if resp.status != 200:
                    return None
                body = await resp.content.read(MAX_METRICS_BYTES)
                return bytes(body).decode("utf-8", "replace")
    except (TimeoutError, aiohttp.ClientError, OSError, ValueError) as exc:
        log.debug("kv scrape %s failed: %s", url, exc)
        return None


async def pod_kv_usage(session: Any, ip: str, ports: Sequence[int], timeout: float = 2.0) -> float | None:
    """KV usage of one pod: the first port whose /metrics has a known gauge."""
    host = f"[{ip}]" if ":" in ip else ip
    for port in ports:
        text = await fetch_metrics(session, f"http://{host}:{port}/metrics", timeout)
        if text is not None:
            v = parse_kv_usage(text)
            if v is not None:
                return v
    return None


async def scrape_kv_usage(pods: Iterable[Mapping[str, Any]], *, timeout: float = 2.0,
                          default_ports: Sequence[int] = DEFAULT_PORTS, concurrency: int = 16,
                          session: Any = None, deadline: float | None = None) -> float | None:
    """Average KV usage over the pods that report one; None when none does.

    Each request has ``timeout``; the whole scrape ends after ``deadline`` (default 3 × timeout):
    pods still being tried then are left out of this round.
    """
    targets = [t for t in (pod_targets(p, default_ports) for p in pods) if t is not None]
    if not targets:
        return None
    import aiohttp

    own = session is None
    if own:
        session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout))
    sem = asyncio.Semaphore(concurrency)

    async def one(ip: str, ports: list[int]) -> float | None:
        async with sem:
            return await pod_kv_usage(session, ip, ports, timeout)

    tasks = [asyncio.ensure_future(one(ip, ports)) for ip, ports in targets]
    try:
        done, pending = await asyncio.wait(tasks, timeout=deadline if deadline is not None else 3 * timeout)
        for t in pending:
            t.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
    finally:
        if own:
            await session.close()
    got = [v for t in done if not t.cancelled() and t.exception() is None and (v := t.result()) is not None]
    return sum(got) / len(got) if got else None
