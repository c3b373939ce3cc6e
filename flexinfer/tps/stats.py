"""Bench runner statistics: one measured request (:class:`Sample`), a finished run (:class:`BenchResult`)
and the percentile they use. Pure: no I/O, no clock, no HTTP.

tokens/s = Σ decode tokens ÷ Σ decode seconds, where a streamed sample's decode window runs from the
first to the last content chunk and its decode tokens are its tokens × (chunks − 1) ÷ chunks: the
first chunk's tokens arrive at the start of the decode window, so they are not part of its rate (for
N tokens there are N − 1 intervals). A non-stream sample (or one with a single chunk) counts all its
tokens over its wall time. :meth:`BenchResult.summary` is the ``--json`` document.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Sample:
    """One measured request. Times are seconds from sending the request."""

    tokens: int  # completion tokens (usage, else content chunks)
    chunks: int  # content chunks seen (0 for non-stream)
    latency: float  # request sent -> response complete
    ttft: float | None = None  # request sent -> first content chunk (stream only)
    decode_seconds: float | None = None  # first -> last content chunk (stream, >= 2 chunks)
    usage: bool = False  # tokens came from usage.completion_tokens

    @property
    def decode_tokens(self) -> float:
        """Tokens produced inside the rate window (see the module docstring)."""
        if self.decode_seconds is None:
            return float(self.tokens)
        return self.tokens * (self.chunks - 1) / self.chunks

    @property
    def rate_seconds(self) -> float:
        return self.decode_seconds if self.decode_seconds is not None else self.latency

    @property
    def tokens_per_second(self) -> float:
        return self.decode_tokens / self.rate_seconds if self.rate_seconds > 0 else 0.0


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), q in [0, 100]; NaN for no values."""
    if not values:
        return math.nan
    s = sorted(values)
    pos = (len(s) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


@dataclass(frozen=True, slots=True)
class BenchResult:
    """A finished run. ``duration_seconds`` is the measured phase's wall time."""

    model: str
    base_url: str
    stream: bool
    warmup: int
    samples: tuple[Sample, ...]
    duration_seconds: float
    backend: str = ""
    timestamp: str = ""

    @property
    def iterations(self) -> int:
        return len(self.samples)

    @property
    def completion_tokens(self) -> int:
        return sum(s.tokens for s in self.samples)

    @property
    def tokens_per_second(self) -> float:
        """Σ decode tokens ÷ Σ decode seconds."""
        secs = sum(s.rate_seconds for s in self.samples)
        return sum(s.decode_tokens for s in self.samples) / secs if secs > 0 else 0.0

    @property
    def e2e_tokens_per_second(self) -> float:
        """Σ tokens ÷ Σ latency (what one client sees, TTFT included)."""
        secs = sum(s.latency for s in self.samples)
        return self.completion_tokens / secs if secs > 0 else 0.0

    def latency(self, q: float) -> float:
        return percentile([s.latency for s in self.samples], q)

    @property
    def ttft_p50(self) -> float | None:
        vals = [s.ttft for s in self.samples if s.ttft is not None]
        return percentile(vals, 50) if vals else None

    def summary(self) -> dict[str, Any]:
        """The JSON document of ``--json``."""
        return {
            "model": self.model, "backend": self.backend, "base_url": self.base_url, "stream": self.stream,
            "timestamp": self.timestamp, "warmup": self.warmup, "iterations": self.iterations,
            "duration_seconds": round(self.duration_seconds, 4),
            "completion_tokens": self.completion_tokens,
            "tokens_per_second": round(self.tokens_per_second, 3),
            "e2e_tokens_per_second": round(self.e2e_tokens_per_second, 3),
            "ttft_p50_seconds": None if self.ttft_p50 is None else round(self.ttft_p50, 5),
            "latency_seconds": {f"p{q}": round(self.latency(q), 5) for q in (50, 90, 99)},
            "samples": [dict(asdict(s), tokens_per_second=round(s.tokens_per_second, 3)) for s in self.samples],
        }
