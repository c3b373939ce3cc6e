"""Rate limits: a global token bucket first, then one bucket per model.

Off by default; when on: global 1000 rps / burst 200, per model 100 rps / burst 50 (configurable).
A refusal raises ``RateLimited`` (429 ``rate_limit_exceeded``) with ``Retry-After`` taken from the
bucket, so the request never reaches a backend, and counts in
``flexinfer_proxy_rate_limited_total{model,scope}``. Buckets use the monotonic clock.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from flexinfer._speedups import BucketRegistry, TokenBucket
from flexinfer.errors import RateLimited
from flexinfer.proxy.metrics import ProxyMetrics
from flexinfer.settings import ProxySettings


class Limiter:
    """Global, then per-model admission."""

    def __init__(self, settings: ProxySettings, metrics: ProxyMetrics,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.metrics = metrics
        self.global_bucket = TokenBucket(settings.rate_limit_global, settings.rate_limit_global_burst, clock)
        self.per_model = BucketRegistry(settings.rate_limit_per_model, settings.rate_limit_burst,
                                        clock=clock)

    def check(self, model: str) -> None:
        now = self.clock()
        wait = self.global_bucket.take(1.0, now)
        scope = "global"
        if wait == 0.0:
            wait = self.per_model.take(model, 1.0, now)
            scope = "model"
        if wait > 0.0:
            self.metrics.rate_limited.labels(model, scope).inc()
            raise RateLimited(f"rate limit exceeded ({scope}); retry in {wait:.2f}s",
                              retry_after=max(1, math.ceil(wait)),
                              headers=[(b"retry-after-ms", str(max(1, math.ceil(wait * 1000))).encode())])
