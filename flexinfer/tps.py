"""Bench runner (``flexinfer bench``): tokens/s, TTFT and latency of one model behind any OpenAI endpoint.

This module owns measuring a model (through the FlexInfer proxy or directly against any
OpenAI-compatible ``/v1`` base URL), reporting it (text, ``--json``, ``--csv``, ``--plot``) and, in a
cluster, publishing it to ConfigMaps for the operator and the scheduler extender (that part is
:mod:`flexinfer.tps_publish`; ``shared/reference/flexinfer-upstream.md`` §7.1; the key scheme lives in
:mod:`flexinfer.benchkeys`).

Method: 2 warm-up requests (the first one waits up to ``--ready-timeout`` while the endpoint answers
404/502/503/504 or refuses connections), then streaming chat requests until at least
``--iterations`` samples **and** ``--min-duration`` seconds. Per sample, the decode time is the
time from the first to the last content chunk; tokens are ``usage.completion_tokens`` when the
server sends a usage chunk (we ask with ``stream_options.include_usage``), else the number of content
chunks (llama.cpp sends no usage chunk). tokens/s = Σ decode tokens ÷ Σ decode seconds, where a
sample's decode tokens are its tokens × (chunks − 1) ÷ chunks: the first chunk's tokens arrive at
the start of the decode window, so they are not part of its rate (for N tokens there are N − 1
intervals). With ``--no-stream`` the sample is ``usage.completion_tokens`` ÷ wall time.

HTTP is the standard library's ``http.client`` (keep-alive off, one connection per request, opened
before the clock starts, so TTFT excludes TCP/TLS setup): no dependency beyond the runtime's, sync
and sequential like the measurement itself. ``kubernetes_asyncio`` (the ``kube`` extra) is imported
only inside the ConfigMap writer, ``matplotlib`` (not a dependency) only inside ``--plot``.
This module must not be imported by the proxy.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import http.client
import importlib.util
import io
import json
import logging
import math
import ssl
import sys
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, TextIO

import orjson

from flexinfer import benchkeys
from flexinfer.settings import SettingsError, from_env

log = logging.getLogger("flexinfer.tps")

DEFAULT_PROMPT = "Write a long story about a space adventure to Mars."
WAIT_STATUSES = frozenset({404, 502, 503, 504})
MAX_LINE = 1 << 20  # longest SSE line accepted
MAX_ERROR_BODY = 64 * 1024


class BenchError(Exception):
    """A failure with a one-line message for the user; the command exits 1 with it."""


class HTTPStatusError(BenchError):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


# ---- configuration ---------------------------------------------------------------------------

def _f(default: Any, env: str | None, doc: str) -> Any:
    return field(default=default, metadata={"env": env, "doc": doc})


@dataclass(frozen=True, slots=True)
class BenchConfig:
    """What to measure and where to publish it. Built by :func:`load_config` (env, then flags)."""

    base_url: str = _f("", None, "OpenAI base URL ending in /v1; derived from the proxy URL when empty.")
    proxy_url: str = _f("", "PROXY_URL", "FlexInfer proxy root URL (first choice when --base-url is unset).")
    benchmark_proxy_url: str = _f("", "BENCHMARK_PROXY_URL", "Proxy root URL (second choice).")
    proxy_namespace: str = _f("flexinfer-system", "BENCHMARK_PROXY_NAMESPACE",
                              "Namespace of the in-cluster proxy Service (last resort URL).")
    model: str = _f("", "MODEL_NAME", "Model name sent in the body; if empty and /models lists one, that one.")
    api_key: str = _f("", "BENCHMARK_API_KEY", "Bearer token (falls back to OPENAI_API_KEY).")
    openai_api_key: str = _f("", "OPENAI_API_KEY", "Bearer token fallback.")
    warmup: int = _f(2, None, "Unmeasured requests first.")
    iterations: int = _f(5, None, "At least this many measured requests ...")
    min_duration: float = _f(30.0, None, "... and at least this many seconds of measuring.")
    max_tokens: int = _f(128, None, "max_tokens of each request.")
    prompt: str = _f(DEFAULT_PROMPT, None, "User message of each request.")
    stream: bool = _f(True, None, "Streaming requests (decode time from the stream).")
    timeout: float = _f(180.0, None, "Per-request timeout (socket inactivity), seconds.")
    ready_timeout: float = _f(300.0, None, "How long the first request waits for the model to be ready.")
    ready_poll: float = _f(5.0, None, "Retry interval while waiting for readiness.")
    configmap: str = _f("", None, "Per-deployment ConfigMap to write (empty: no cluster writes).")
    namespace: str = _f("", "POD_NAMESPACE", "Namespace of the ConfigMaps.")
    global_configmap: str = _f(benchkeys.GLOBAL_CONFIGMAP_DEFAULT, benchkeys.GLOBAL_CONFIGMAP_ENV,
                               "Global ConfigMap of bench_<hash>/meta_<hash> keys.")
    backend: str = _f("", "BENCHMARK_BACKEND", "Canonical backend name for the keys (else from /models).")
    device_class: str = _f("", "BENCHMARK_DEVICE_CLASS", "Device class for the keys (else from the node).")
    node_name: str = _f("", "NODE_NAME", "Node whose gpu.* labels give the device class.")
    kubeconfig: str = _f("", "KUBECONFIG", "Kubeconfig used outside a cluster (default ~/.kube/config).")

    def validate(self) -> None:
        if self.warmup < 0:
            raise SettingsError(f"--warmup must be >= 0, got {self.warmup}")
        if self.iterations < 1:
            raise SettingsError(f"--iterations must be >= 1, got {self.iterations}")
        if self.min_duration < 0 or math.isnan(self.min_duration):
            raise SettingsError("--min-duration must be >= 0")
        if self.max_tokens < 1:
            raise SettingsError(f"--max-tokens must be >= 1, got {self.max_tokens}")
        if self.timeout <= 0:
            raise SettingsError("--timeout must be > 0")

    @property
    def bearer(self) -> str:
        return self.api_key or self.openai_api_key


def base_url_from_proxy(proxy_url: str) -> str:
    """A proxy root (``http://h:80``) -> its OpenAI base (``http://h:80/v1``); ``/v1`` kept if present."""
    u = proxy_url.rstrip("/")
    return u if u.endswith("/v1") else u + "/v1"


def load_config(env: Mapping[str, str] | None = None, **overrides: Any) -> BenchConfig:
    """Read the environment once (``None``: the process's); ``overrides`` are CLI flags (None = unset).

    Base URL: ``--base-url`` → ``PROXY_URL`` → ``BENCHMARK_PROXY_URL`` →
    ``http://flexinfer-proxy.<BENCHMARK_PROXY_NAMESPACE|flexinfer-system>.svc.cluster.local:80``,
    the proxy forms getting ``/v1`` appended.
    """
    cfg: BenchConfig = from_env(BenchConfig, env, **overrides)
    base = cfg.base_url.rstrip("/")
    if not base:
        root = cfg.proxy_url or cfg.benchmark_proxy_url or (
            f"http://flexinfer-proxy.{cfg.proxy_namespace}.svc.cluster.local:80")
        base = base_url_from_proxy(root)
    u = urllib.parse.urlsplit(base)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise SettingsError(f"base URL must be http(s)://host[:port]/..., got {base!r}")
    return replace(cfg, base_url=base)


# ---- HTTP ------------------------------------------------------------------------------------

class Endpoint:
    """An OpenAI-compatible base URL; opens one fresh connection per request."""

    def __init__(self, base_url: str, api_key: str = "", timeout: float = 180.0) -> None:
        u = urllib.parse.urlsplit(base_url)
        self.base_url = base_url
        self.https = u.scheme == "https"
        self.host = u.hostname or "127.0.0.1"
        self.port = u.port or (443 if self.https else 80)
        self.path = u.path.rstrip("/")
        self.timeout = timeout
        self.headers = {"Content-Type": "application/json", "Accept": "text/event-stream, application/json",
                        "User-Agent": "flexinfer-bench", "Connection": "close"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"

    def connect(self) -> http.client.HTTPConnection:
        conn: http.client.HTTPConnection
        if self.https:
            conn = http.client.HTTPSConnection(self.host, self.port, timeout=self.timeout,
                                               context=ssl.create_default_context())
        else:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            conn.connect()
        except OSError as exc:
            conn.close()
            raise ConnectionError(f"cannot connect to {self.host}:{self.port}: {exc.strerror or exc}") from None
        return conn

    def get_json(self, path: str) -> Any:
        conn = self.connect()
        try:
            conn.request("GET", self.path + path, headers=self.headers)
            resp = conn.getresponse()
            body = resp.read(MAX_ERROR_BODY * 16)
            if resp.status != 200:
                raise HTTPStatusError(resp.status, _error_message(body))
            return orjson.loads(body)
        finally:
            conn.close()


def _error_message(body: bytes) -> str:
    try:
        obj = orjson.loads(body)
        err = obj.get("error") if isinstance(obj, dict) else None
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])[:300]
        if isinstance(err, str):
            return err[:300]
    except orjson.JSONDecodeError:
        pass
    text = body.decode("utf-8", "replace").strip().replace("\n", " ")
    return text[:300] or "(empty body)"


# ---- one request -------------------------------------------------------------------------------

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


def request_body(cfg: BenchConfig, model: str) -> bytes:
    body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": cfg.prompt}],
                            "max_tokens": cfg.max_tokens, "stream": cfg.stream}
    if cfg.stream:
        body["stream_options"] = {"include_usage": True}
    return orjson.dumps(body)


def _content_of(choice: Any) -> str:
    if not isinstance(choice, dict):
        return ""
    delta = choice.get("delta")
    if isinstance(delta, dict):
        for k in ("content", "reasoning_content", "reasoning"):
            v = delta.get(k)
            if isinstance(v, str) and v:
                return v
        return ""
    text = choice.get("text")  # legacy completions chunks
    return text if isinstance(text, str) else ""


def measure_once(ep: Endpoint, body: bytes, stream: bool,
                 clock: Callable[[], float] = time.perf_counter) -> Sample:
    """Send one chat request and time it. Raises HTTPStatusError, ConnectionError or BenchError."""
    conn = ep.connect()
    try:
        t0 = clock()
        try:
            conn.request("POST", ep.path + "/chat/completions", body=body, headers=ep.headers)
            resp = conn.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            raise ConnectionError(f"request to {ep.base_url} failed: {exc}") from None
        if resp.status != 200:
            raise HTTPStatusError(resp.status, _error_message(resp.read(MAX_ERROR_BODY)))
        if not stream:
            raw = resp.read()
            latency = clock() - t0
            try:
                obj = orjson.loads(raw)
            except orjson.JSONDecodeError:
                raise BenchError("response is not JSON") from None
            usage = obj.get("usage") if isinstance(obj, dict) else None
            tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
            if not isinstance(tokens, int):
                raise BenchError("non-stream response has no usage.completion_tokens; try streaming")
            return Sample(tokens=tokens, chunks=0, latency=latency, usage=True)
        first: float | None = None
        last = 0.0
        chunks = 0
        usage_tokens: int | None = None
        try:
            while True:
                line = resp.readline(MAX_LINE)
                if not line:
                    break
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                try:
                    obj = orjson.loads(data)
                except orjson.JSONDecodeError:
                    raise BenchError(f"bad SSE data line: {data[:80]!r}") from None
                if not isinstance(obj, dict):
                    continue
                if obj.get("error"):
                    err = obj["error"]
                    msg = err.get("message") if isinstance(err, dict) else err
                    raise BenchError(f"error in stream: {msg}")
                choices = obj.get("choices")
                if isinstance(choices, list) and any(_content_of(c) for c in choices):
                    now = clock()
                    if first is None:
                        first = now
                    last = now
                    chunks += 1
                u = obj.get("usage")
                if isinstance(u, dict) and isinstance(u.get("completion_tokens"), int):
                    usage_tokens = u["completion_tokens"]
        except (OSError, http.client.HTTPException) as exc:
            raise ConnectionError(f"stream from {ep.base_url} broke: {exc}") from None
        end = clock()
        if chunks == 0:
            raise BenchError("the stream carried no content tokens")
        assert first is not None
        tokens = usage_tokens if usage_tokens is not None else chunks
        decode = (last - first) if chunks >= 2 and last > first else None
        return Sample(tokens=tokens, chunks=chunks, latency=end - t0, ttft=first - t0,
                      decode_seconds=decode, usage=usage_tokens is not None)
    finally:
        conn.close()


# ---- the run -----------------------------------------------------------------------------------

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


# ---- reports -------------------------------------------------------------------------------------

CSV_FIELDS = ("iteration", "tokens", "chunks", "ttft_seconds", "decode_seconds", "latency_seconds",
              "tokens_per_second", "usage")


def to_csv(result: BenchResult) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_FIELDS)
    for i, s in enumerate(result.samples, 1):
        w.writerow([i, s.tokens, s.chunks, "" if s.ttft is None else f"{s.ttft:.5f}",
                    "" if s.decode_seconds is None else f"{s.decode_seconds:.5f}", f"{s.latency:.5f}",
                    f"{s.tokens_per_second:.3f}", int(s.usage)])
    return buf.getvalue()


def to_text(result: BenchResult) -> str:
    ttft = "n/a (non-stream)" if result.ttft_p50 is None else f"{result.ttft_p50 * 1000:.1f} ms"
    return (f"model {result.model} @ {result.base_url} ({'stream' if result.stream else 'non-stream'}): "
            f"{result.iterations} iterations, {result.completion_tokens} tokens in {result.duration_seconds:.1f} s\n"
            f"  tokens/s      {result.tokens_per_second:.2f} (decode)   {result.e2e_tokens_per_second:.2f} (end to end)\n"
            f"  TTFT p50      {ttft}\n"
            f"  latency       p50 {result.latency(50):.3f} s   p90 {result.latency(90):.3f} s   "
            f"p99 {result.latency(99):.3f} s\n")


def write_plot(result: BenchResult, path: str) -> None:
    """tokens/s per iteration and the latency distribution, as a PNG (needs matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    xs = list(range(1, result.iterations + 1))
    ax1.plot(xs, [s.tokens_per_second for s in result.samples], marker="o")
    ax1.axhline(result.tokens_per_second, linestyle="--", color="gray",
                label=f"overall {result.tokens_per_second:.1f}")
    ax1.set(xlabel="iteration", ylabel="tokens/s", title=f"{result.model}: tokens/s per iteration")
    ax1.xaxis.get_major_locator().set_params(integer=True)
    ax1.legend()
    lat = [s.latency for s in result.samples]
    ax2.hist(lat, bins=min(30, max(5, len(lat) // 2)))
    for q, style in ((50, "-"), (90, "--"), (99, ":")):
        ax2.axvline(result.latency(q), linestyle=style, color="black", label=f"p{q} {result.latency(q):.2f} s")
    ax2.set(xlabel="latency (s)", ylabel="requests", title="latency distribution")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _emit(text: str, dest: str) -> None:
    if dest == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        with open(dest, "w", encoding="utf-8") as fh:
            fh.write(text)


# ---- command ---------------------------------------------------------------------------------------

def configure(parser: argparse.ArgumentParser) -> None:
    """Flags of ``flexinfer bench``; they override the environment."""
    parser.description = ("Measure tokens/s, TTFT and latency of a model through the FlexInfer proxy or any "
                          "OpenAI-compatible endpoint.")
    a = parser.add_argument
    a("--base-url", help="OpenAI base URL, e.g. http://host:port/v1 (default: PROXY_URL, BENCHMARK_PROXY_URL, "
                         "or the in-cluster proxy Service)")
    a("--model", help="model name (MODEL_NAME; default: the only model /models lists)")
    a("--api-key", help="bearer token (BENCHMARK_API_KEY or OPENAI_API_KEY)")
    a("--warmup", type=int, help="unmeasured requests first (default 2)")
    a("--iterations", type=int, help="at least this many measured requests (default 5)")
    a("--min-duration", type=float, help="and at least this many seconds of measuring (default 30)")
    a("--max-tokens", type=int, help="max_tokens per request (default 128)")
    a("--prompt", help=f"user message (default {DEFAULT_PROMPT!r})")
    a("--no-stream", dest="stream", action="store_const", const=False,
      help="non-streaming requests: tokens/s from usage.completion_tokens and wall time")
    a("--timeout", type=float, help="per-request socket timeout in seconds (default 180)")
    a("--ready-timeout", type=float, help="how long the first request waits for readiness (default 300)")
    a("--json", nargs="?", const="-", metavar="PATH", help="write the result as JSON (stdout if no PATH)")
    a("--csv", nargs="?", const="-", metavar="PATH", help="write one CSV row per iteration (stdout if no PATH)")
    a("--plot", metavar="OUT.png", help="plot tokens/s per iteration and latencies (needs matplotlib)")
    a("--no-progress", action="store_true", help="no progress line on stderr")
    a("--configmap", help="in a cluster: write this per-deployment ConfigMap and the global one")
    a("--namespace", help="namespace of the ConfigMaps (POD_NAMESPACE)")
    a("--backend", help="canonical backend name for the result keys (BENCHMARK_BACKEND)")
    a("--device-class", help="device class for the keys, 'vendor=…,arch=…,vram=…,count=…,int4=…' "
                             "(default: from NODE_NAME's gpu.* labels)")
    a("--kubeconfig", help="kubeconfig outside a cluster (KUBECONFIG; in a pod the service account is used)")


def run(args: argparse.Namespace) -> int:
    """Exit 0 on success, 1 with a one-line message on failure."""
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        print("bench: error: --plot needs matplotlib, which FlexInfer does not depend on: pip install matplotlib",
              file=sys.stderr)
        return 1
    try:
        cfg = load_config(None, base_url=args.base_url, model=args.model, api_key=args.api_key,
                          warmup=args.warmup, iterations=args.iterations, min_duration=args.min_duration,
                          max_tokens=args.max_tokens, prompt=args.prompt, stream=args.stream, timeout=args.timeout,
                          ready_timeout=args.ready_timeout, configmap=args.configmap, namespace=args.namespace,
                          backend=args.backend, device_class=args.device_class, kubeconfig=args.kubeconfig)
        result = run_bench(cfg, progress_out=None if args.no_progress else sys.stderr)
        to_stdout = "-" in (args.json, args.csv)
        if args.json:
            _emit(json.dumps(result.summary(), indent=2) + "\n", args.json)
        if args.csv:
            _emit(to_csv(result), args.csv)
        (sys.stderr if to_stdout else sys.stdout).write(to_text(result))
        if args.plot:
            write_plot(result, args.plot)
        if cfg.configmap:
            from flexinfer.tps_publish import publish

            entries = asyncio.run(publish(result, cfg))
            print(f"bench: wrote ConfigMap {cfg.configmap} and {cfg.global_configmap} keys "
                  f"{', '.join(sorted(entries))}", file=sys.stderr)
    except (BenchError, SettingsError, ConnectionError) as exc:
        print(f"bench: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"bench: error: {exc.strerror or exc}" + (f" ({exc.filename})" if exc.filename else ""),
              file=sys.stderr)
        return 1
    except Exception as exc:  # no traceback for the user; --log-level debug shows it
        log.debug("bench failed", exc_info=True)
        print(f"bench: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


__all__ = ["BenchConfig", "BenchError", "BenchResult", "Endpoint", "Sample", "configure", "load_config",
           "measure_once", "percentile", "run", "run_bench", "to_csv", "to_text", "write_plot"]
