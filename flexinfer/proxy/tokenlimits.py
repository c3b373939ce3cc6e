"""Token-based rate limits: tokens per minute per model and per API key (off by default).

Owns: the input-token estimate of a request body (prompt characters / ``PROXY_TOKEN_ESTIMATE_DIVISOR``),
the admission of that estimate against the buckets ``tokens:model:<name>`` and ``tokens:key:<id>``
(id: the first 16 hex digits of the bearer token's SHA-256, never the token), the 429
``rate_limit_exceeded`` refusal (``Retry-After``, ``retry-after-ms``, counted in
``flexinfer_proxy_rate_limited_total{model,scope="tokens-model"|"tokens-key"}``), and the charge when the
response body is complete, before its last bytes are written to the client: ``prompt_tokens +
completion_tokens`` of the response's ``usage`` minus what admission took (debt when more: the next
requests wait; a refund when less), read from the request's one :class:`flexinfer.proxy.usage.UsageTap`
(the relay tells the tap the body is complete; a request that ends otherwise is settled when the
pipeline is done with it).
Must not: do I/O, parse a body it was not handed, log per request, let anything about a response's
``usage`` (absent, malformed, huge) fail the response to the client, or hold its last bytes back
longer than one parse of the tap's kept tail (at most 32 KiB: well under a microsecond when the usage
object ends the body, tens of microseconds for a tail without one; docs/token-limits.md).

Buckets: :class:`TokenBuckets` (``take`` + ``charge``): ``limits.LocalBuckets`` (one process),
``limits.MachineBuckets`` (shared memory, ``--workers N``) or ``redisshare.RedisShare`` (every
replica, falling back to the machine while Redis is away), all GCRA with the same arithmetic.

Rules. Admission takes ``min(max(1, estimate), burst)`` tokens from the model bucket, then the key
bucket (a model admission refused by the key bucket is given back), so a prompt larger than a whole
burst is admitted from a full bucket and its excess becomes debt. Usage read: non-streaming, the
body's last ``"usage":{...}`` object; streaming, the last one of the SSE tail (the final usage chunk
that ``stream_options.include_usage`` asks for). Without one: the estimate stands for the prompt
and, for SSE, every content-bearing event counts as one output token (an approximation: engines
send about one token per event); a JSON answer without usage charges the estimate only. An
upstream error status (>= 400) without usage, or a request that never reached an engine, gives
everything back. A client that leaves mid-stream is charged for what was relayed until then.
One charge is capped by the buckets at one burst of debt (a bogus ``usage`` cannot lock a key out
for longer than ``burst / rate`` past empty), and token counts above 10**9 are clamped.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable
from typing import Any, Protocol

from flexinfer.errors import RateLimited
from flexinfer.proxy.metrics import ProxyMetrics
from flexinfer.proxy.usage import UsageTap
from flexinfer.settings import ProxySettings

__all__ = ["TokenBuckets", "TokenCharge", "TokenLimiter", "estimate_tokens", "key_id"]


class TokenBuckets(Protocol):
    def take(self, key: str, rate: float, burst: float, n: float = 1.0) -> float | Awaitable[float]: ...
    def charge(self, key: str, rate: float, burst: float, n: float) -> object: ...


def key_id(digest: bytes) -> str:
    """The API key's id in bucket keys: 16 hex digits of its SHA-256 digest (never the token)."""
    return digest.hex()[:16]


def _text_len(v: Any, depth: int = 0) -> int:
    """Characters of prompt text in a message content / prompt / input value."""
    if isinstance(v, str):
        return len(v)
    if depth > 4:
        return 0
    if isinstance(v, list):
        return sum(_text_len(x, depth + 1) for x in v)
    if isinstance(v, dict):  # a content part: {"type": "text", "text": ...}
        t = v.get("text")
        return len(t) if isinstance(t, str) else 0
    return 0


def estimate_tokens(data: dict[str, Any] | None, body_len: int, divisor: float) -> float:
    """Input tokens of a request: the characters of its messages/prompt/input over ``divisor``
    (a body that is not JSON: its length over ``divisor``)."""
    if data is None:
        return body_len / divisor
    chars = 0
    msgs = data.get("messages")
    if isinstance(msgs, list):
        for m in msgs:
            if isinstance(m, dict):
                chars += _text_len(m.get("content"))
    for field in ("prompt", "input"):
        if field in data:
            chars += _text_len(data[field])
    return chars / divisor


class TokenCharge:
    """One admitted request's token account: what admission took, settled once: by its tap when the
    response body is complete, before the client has its last byte (:meth:`UsageTap.complete`), or
    when the request ends otherwise (the pipeline's ``finally``: a failure, a client gone)."""

    __slots__ = ("_buckets", "_scopes", "estimate", "settled", "taken", "tap")

    def __init__(self, buckets: TokenBuckets, scopes: list[tuple[str, float, float]], estimate: float,
                 taken: float) -> None:
        self._buckets = buckets
        self._scopes = scopes
        self.estimate = estimate
        self.taken = taken
        self.tap = tap = UsageTap()  # the request's one tap: the forwarder installs it (metrics read it too)
        tap.charge = self  # while not settled (a reference cycle until settle() breaks it)
        self.settled = 0.0  # the tokens finally charged (prompt + completion), for tests and logs

    def used(self) -> float:
        """The tokens this request used, as far as the tap saw."""
        tap = self.tap
        usage = tap.usage()  # parsed once per request (the metrics read the same result)
        if usage is None and (tap.status is None or tap.status >= 400):
            return 0.0  # never reached an engine, or the engine refused it
        prompt = float(usage[0]) if usage is not None and usage[0] >= 0 else self.estimate
        if usage is not None:
            return prompt + usage[1]
        return prompt + (tap.events if tap.sse else 0)

    def settle(self) -> None:
        """Charge the difference between what was used and what admission took (once: later calls
        do nothing)."""
        tap = self.tap
        if tap.charge is not self:
            return
        tap.charge = None
        used = self.used()
        self.settled = used
        for key, rate, burst in self._scopes:
            delta = used - min(self.taken, burst)  # what admission took from this bucket
            if delta == 0.0 or not math.isfinite(delta):
                continue
            try:
                self._buckets.charge(key, rate, burst, delta)
            except Exception:  # a full table, a bad number: the charge is dropped, the answer is not
                pass


class TokenLimiter:
    """Admission of a request's token estimate per model and per API key."""

    def __init__(self, settings: ProxySettings, metrics: ProxyMetrics, buckets: TokenBuckets) -> None:
        self.metrics = metrics
        self.buckets = buckets
        self.divisor = settings.token_estimate_divisor
        self.model = _limit(settings.token_limit_model_tpm, settings.token_limit_model_burst)
        self.key = _limit(settings.token_limit_key_tpm, settings.token_limit_key_burst)

    @staticmethod
    def enabled(settings: ProxySettings) -> bool:
        return settings.token_limit_model_tpm > 0 or (settings.token_limit_key_tpm > 0 and settings.auth_enabled)

    def admit(self, model: str, key: str | None, data: dict[str, Any] | None, body_len: int,
              counted: float | None = None) -> TokenCharge | Awaitable[TokenCharge]:
        """A :class:`TokenCharge` when admitted (or an awaitable of one: a Redis lease is on its
        way); raises :class:`RateLimited` when a bucket cannot hold the estimate (``counted``: the
        engine tokenizer's count, used instead of the estimate)."""
        estimate = estimate_tokens(data, body_len, self.divisor) if counted is None else counted
        scopes: list[tuple[str, float, float]] = []
        if self.model is not None:
            scopes.append(("tokens:model:" + model, *self.model))
        if self.key is not None and key is not None:
            scopes.append(("tokens:key:" + key, *self.key))
        taken = max(1.0, estimate)
        for i, (k, rate, burst) in enumerate(scopes):
            n = min(taken, burst)
            wait = self.buckets.take(k, rate, burst, n)
            if not isinstance(wait, float):
                return self._later(wait, model, scopes, i, estimate, taken)
            if wait != 0.0:
                self._refuse(model, scopes, i, wait, taken)
        return TokenCharge(self.buckets, scopes, estimate, taken)

    async def _later(self, pending: Awaitable[float], model: str, scopes: list[tuple[str, float, float]],
                     i: int, estimate: float, taken: float) -> TokenCharge:
        wait = await pending
        if wait != 0.0:
            self._refuse(model, scopes, i, wait, taken)
        for j in range(i + 1, len(scopes)):
            k, rate, burst = scopes[j]
            decision = self.buckets.take(k, rate, burst, min(taken, burst))
            wait = decision if isinstance(decision, float) else await decision
            if wait != 0.0:
                self._refuse(model, scopes, j, wait, taken)
        return TokenCharge(self.buckets, scopes, estimate, taken)

    def _refuse(self, model: str, scopes: list[tuple[str, float, float]], i: int, wait: float,
                taken: float) -> None:
        key = scopes[i][0]
        for k, rate, burst in scopes[:i]:  # give back what the earlier scopes took
            try:
                self.buckets.charge(k, rate, burst, -min(taken, burst))
            except Exception:
                pass
        scope = "tokens-key" if key.startswith("tokens:key:") else "tokens-model"
        self.metrics.rate_limited.labels(model, scope).inc()
        ms = max(1, math.ceil(wait * 1000)) if wait < math.inf else 86_400_000
        raise RateLimited(f"token rate limit exceeded ({scope}); retry in {wait:.2f}s",
                          retry_after=max(1, math.ceil(min(wait, 86_400.0))),
                          headers=[(b"retry-after-ms", str(ms).encode())])


def _limit(tpm: float, burst: float) -> tuple[float, float] | None:
    """(rate per second, burst) of a TPM setting, or None when off."""
    if not tpm > 0:
        return None
    return tpm / 60.0, (burst if burst > 0 else tpm)
