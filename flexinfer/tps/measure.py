"""Bench runner measuring loop (:func:`run_bench`): model discovery, readiness, warm-up, iterations.

Method: 2 warm-up requests (the first one waits up to ``--ready-timeout`` while the endpoint answers
404/502/503/504 or refuses connections), then chat requests until at least ``--iterations`` samples
**and** ``--min-duration`` seconds; the readiness wait is not part of the measured phase. A missing
model name is taken from ``/models`` when it lists exactly one, the backend from FlexInfer's
``/v1/models`` metadata. Progress goes to a stderr line. One request on the wire is
:mod:`flexinfer.tps.client`'s, the statistics are :mod:`flexinfer.tps.stats`'; this module only
sequences them and must not format reports or touch the cluster.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TextIO

import orjson

from flexinfer.tps.client import Endpoint, measure_once, request_body
from flexinfer.tps.config import BenchConfig, BenchError, HTTPStatusError
from flexinfer.tps.stats import BenchResult, Sample

WAIT_STATUSES = frozenset({404, 502, 503, 504})


class _Progress:
    """A dependency-free progress line on stderr: redrawn with \\r on a TTY, one line per sample elsewhere."""

    WIDTH = 24

    def __init__(self, out: TextIO | None, iterations: int, min_duration: float) -> None:
        self.out = out
        self.tty = bool(out is not None and getattr(out, "isatty", lambda: False)())
        self.iterations = iterations
        self.min_duration = min_duration

    def update(self, n: int, elapsed: float, last: Sample) -> None:
        if self.out is None:
            return
        frac = min(n / self.iterations, elapsed / self.min_duration if self.min_duration > 0 else 1.0, 1.0)
        filled = round(frac * self.WIDTH)
        bar = "#" * filled + "-" * (self.WIDTH - filled)
        text = (f"bench [{bar}] {n}/{self.iterations}+ iters {elapsed:5.1f}/{self.min_duration:g} s  "
                f"last {last.tokens_per_second:7.1f} tok/s {last.latency:6.2f} s")
        self.out.write(f"\r{text}\x1b[K" if self.tty else text + "\n")
        self.out.flush()

    def note(self, text: str) -> None:
        if self.out is not None:
            self.out.write(("\r\x1b[K" if self.tty else "") + text + "\n")
            self.out.flush()

    def done(self) -> None:
        if self.out is not None and self.tty:
            self.out.write("\r\x1b[K")
            self.out.flush()


Measure = Callable[[Endpoint, bytes, bool], Sample]


def wait_ready(ep: Endpoint, body: bytes, cfg: BenchConfig, measure: Measure, progress: _Progress,
               clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> Sample:
    """The first request, retried while the model is not there yet (404/502/503/504, refused)."""
    deadline = clock() + cfg.ready_timeout
    while True:
        try:
            return measure(ep, body, cfg.stream)
        except (HTTPStatusError, ConnectionError) as exc:
            retryable = not isinstance(exc, HTTPStatusError) or exc.status in WAIT_STATUSES
            if not retryable or clock() + cfg.ready_poll > deadline:
                if retryable and cfg.ready_timeout > 0:
                    raise BenchError(f"model not ready after {cfg.ready_timeout:g} s: {exc}") from None
                raise
            progress.note(f"bench: waiting for the model ({exc}); retry in {cfg.ready_poll:g} s")
            sleep(cfg.ready_poll)


def run_bench(cfg: BenchConfig, *, progress_out: TextIO | None = None, measure: Measure | None = None,
              clock: Callable[[], float] = time.perf_counter,
              sleep: Callable[[float], None] = time.sleep) -> BenchResult:
    """Warm up, then measure until ``iterations`` samples AND ``min_duration`` seconds."""
    measure_fn: Measure = measure or (lambda e, b, s: measure_once(e, b, s, clock))
    ep = Endpoint(cfg.base_url, cfg.bearer, cfg.timeout)
    model, backend = cfg.model, cfg.backend
    if not model or not backend:
        model, backend = discover_model(ep, model, backend)
    body = request_body(cfg, model)
    progress = _Progress(progress_out, cfg.iterations, cfg.min_duration)
    samples: list[Sample] = []
    first = True
    for _ in range(cfg.warmup):
        if first:
            wait_ready(ep, body, cfg, measure_fn, progress, sleep=sleep)
            first = False
        else:
            measure_fn(ep, body, cfg.stream)
    start = clock()
    while len(samples) < cfg.iterations or clock() - start < cfg.min_duration:
        if first:
            s = wait_ready(ep, body, cfg, measure_fn, progress, sleep=sleep)
            first = False
            start = clock() - s.latency  # the readiness wait is not part of the measured phase
        else:
            s = measure_fn(ep, body, cfg.stream)
        samples.append(s)
        progress.update(len(samples), clock() - start, s)
    duration = clock() - start
    progress.done()
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return BenchResult(model, cfg.base_url, cfg.stream, cfg.warmup, tuple(samples), duration, backend, stamp)


def discover_model(ep: Endpoint, model: str, backend: str) -> tuple[str, str]:
    """Fill in the model (when ``/models`` lists exactly one) and the backend (FlexInfer's ``/v1/models``
    metadata) — best effort for the backend; a missing model is an error."""
    try:
        listing = ep.get_json("/models")
    except (BenchError, ConnectionError, orjson.JSONDecodeError) as exc:
        if not model:
            raise BenchError(f"--model (or MODEL_NAME) is required; listing {ep.base_url}/models failed: {exc}") \
                from None
        return model, backend
    entries = [e for e in (listing.get("data") if isinstance(listing, dict) else None) or [] if isinstance(e, dict)]
    if not model:
        ids = [str(e.get("id")) for e in entries if e.get("id")]
        if len(ids) != 1:
            raise BenchError(f"--model (or MODEL_NAME) is required; {ep.base_url}/models lists {len(ids)} models"
                             + (f": {', '.join(ids[:10])}" if ids else ""))
        model = ids[0]
    if not backend:
        for e in entries:
            if e.get("id") == model:
                meta = e.get("metadata")
                b = e.get("backend") or (meta.get("backend") if isinstance(meta, dict) else None)
                if isinstance(b, str):
                    backend = b
    return model, backend
