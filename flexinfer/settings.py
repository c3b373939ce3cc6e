"""Settings: frozen dataclass groups, read ONCE from the environment, CLI flags or a file.

Nothing else in FlexInfer reads ``os.environ``. Each field documents its meaning and default; the
defaults follow the reliability plan (``shared/reference/reliability-plan.md`` §6) and the original
proxy (``PROXY_*`` variables). Booleans accept 1/true/yes/on and 0/false/no/off; float fields are
durations and take a number of seconds (``30``, ``0.5``) or Go syntax (``500ms``, ``1m30s``, see
``flexinfer.units``). Every field is built by :func:`setting`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any
from urllib.parse import urlsplit

from flexinfer import units

KiB = 1024
MiB = 1024 * KiB

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


class SettingsError(ValueError):
    """A setting has a value that cannot be used."""


def parse_bool(name: str, raw: str) -> bool:
    v = raw.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise SettingsError(f"{name}: expected a boolean (1/true/yes/on or 0/false/no/off), got {raw!r}")


def parse_duration(name: str, raw: str) -> float:
    """Seconds from a bare number (``"30"``, ``"0.5"``) or a Go-style duration (``"500ms"``, ``"1m30s"``)."""
    try:
        return units.parse_duration(raw)
    except ValueError as exc:
        raise SettingsError(f"{name}: {exc}") from None


def _coerce(name: str, typ: Any, raw: str) -> Any:
    if typ in (bool, "bool"):
        return parse_bool(name, raw)
    if typ in (float, "float"):
        return parse_duration(name, raw)
    if typ in (int, "int"):
        try:
            return int(raw.strip())
        except ValueError:
            raise SettingsError(f"{name}: expected an integer, got {raw!r}") from None
    if typ in ("tuple[str, ...]",):
        return tuple(p.strip() for p in raw.split(",") if p.strip())
    return raw


def from_env(cls: Any, env: Mapping[str, str] | None = None, **overrides: Any) -> Any:
    """Build a settings group from the environment variables named in each field's metadata."""
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    for f in fields(cls):
        var = f.metadata.get("env")
        if var and var in env:
            values[f.name] = _coerce(var, f.type, env[var])
    values.update({k: v for k, v in overrides.items() if v is not None})
    obj = cls(**values)
    validate = getattr(obj, "validate", None)
    if validate is not None:
        validate()
    return obj


def setting(default: Any, env: str | None = None, doc: str = "") -> Any:
    """A documented settings field: its default, the environment variable :func:`from_env` reads it
    from (None: flags or code only) and a one-line doc. Every settings dataclass builds its fields so."""
    return field(default=default, metadata={"env": env, "doc": doc})


_f = setting  # the short name the tables below use


@dataclass(frozen=True, slots=True)
class HTTPSettings:
    """Limits and deadlines of the raw HTTP/1.1 server (``flexinfer.http``)."""

    max_request_line: int = _f(8 * KiB, "PROXY_MAX_URL_BYTES", "Request line / URL limit; over it: 414.")
    max_header_bytes: int = _f(16 * KiB, "PROXY_MAX_HEADER_BYTES", "Header block limit; over it: 431.")
    max_headers: int = _f(100, "PROXY_MAX_HEADERS", "Header count limit; over it: 431.")
    max_body_json: int = _f(10 * MiB, "PROXY_MAX_BODY_BYTES", "Body limit for non-multipart; over it: 413.")
    max_body_multipart: int = _f(25 * MiB, "PROXY_MAX_MULTIPART_BYTES", "Body limit for multipart; 413.")
    max_chunk_extension: int = _f(16 * KiB, "PROXY_MAX_CHUNK_METADATA_BYTES",
                                  "Chunk extensions + trailer fields of one chunked request; 400.")
    header_timeout: float = _f(10.0, "PROXY_HEADER_TIMEOUT", "Time to receive the full header block; 408.")
    body_timeout: float = _f(60.0, "PROXY_BODY_TIMEOUT", "Time to receive the full body; 408.")
    keepalive_timeout: float = _f(60.0, "PROXY_KEEPALIVE_TIMEOUT", "Idle keep-alive connection lifetime.")
    write_buffer_high: int = _f(64 * KiB, None, "Per-connection write buffer high-water mark.")
    max_connections: int = _f(10_000, "PROXY_MAX_CONNECTIONS", "Connections over this get 503 + close.")
    drain_timeout: float = _f(30.0, "PROXY_GRACEFUL_SHUTDOWN_TIMEOUT", "How long open streams may run after SIGTERM.")


@dataclass(frozen=True, slots=True)
class UpstreamSettings:
    """Timeouts and pooling of the upstream (backend) client (``flexinfer.http.client``)."""

    connect_timeout: float = _f(5.0, "PROXY_CONNECT_TIMEOUT", "TCP connect timeout.")
    response_timeout: float = _f(300.0, "PROXY_RESPONSE_TIMEOUT", "Time from request sent to response head.")
    stream_idle_timeout: float = _f(300.0, "PROXY_STREAM_IDLE_TIMEOUT", "Longest silence inside a body.")
    pool_idle_timeout: float = _f(4.0, "PROXY_POOL_IDLE_TIMEOUT",
                                  "Idle pooled connection lifetime; below the ~5 s keep-alive of backends.")
    pool_max_idle: int = _f(256, "PROXY_POOL_MAX_IDLE",
                            "Idle connections kept per backend: above the streams served at once, so a burst's "
                            "connections are reused, not closed at checkin (each closes after the idle timeout).")
    pool_check_after: float = _f(0.05, "PROXY_POOL_CHECK_AFTER",
                                 "A pooled connection idle this long is polled for a FIN/RST before reuse (0: always).")
    read_buffer_high: int = _f(64 * KiB, None, "Buffered upstream bytes before reading pauses.")
    max_response_header_bytes: int = _f(64 * KiB, None,
                                        "Largest response head accepted from a backend; over it: protocol error.")


_REDIS_NAME = re.compile(r"[!-~]{1,64}")  # printable ASCII, no space: Redis key parts, ids


def _redacted(url: str) -> str:
    """``url`` with the password of ``scheme://user:password@host`` replaced by ``***``."""
    return re.sub(r"(://[^/@]*?:)[^/@]*@", r"\1***@", url)


def _check_tracing_extra() -> None:
    """PROXY_TRACING_ENABLED without the otel extra is refused at startup (not a silent no-op)."""
    import importlib.util

    for mod in ("opentelemetry.sdk.trace", "opentelemetry.exporter.otlp.proto.http"):
        try:
            found = importlib.util.find_spec(mod) is not None
        except ImportError:  # a parent package is missing
            found = False
        if not found:
            raise SettingsError(f"PROXY_TRACING_ENABLED needs the otel extra (pip install 'flexinfer[otel]'): "
                                f"{mod} is not installed")


@dataclass(frozen=True, slots=True)
class ProxySettings:
    """Behaviour of the request pipeline (``flexinfer.proxy``)."""

    host: str = _f("127.0.0.1", "PROXY_HOST", "Listen address.")
    port: int = _f(8080, "PROXY_PORT", "Listen port.")
    workers: int = _f(1, "PROXY_WORKERS", "Worker processes sharing the port (SO_REUSEPORT).")
    auth_enabled: bool = _f(False, "PROXY_AUTH_ENABLED", "Require Authorization: Bearer <token>.")
    auth_tokens: tuple[str, ...] = _f((), "PROXY_AUTH_TOKEN", "Accepted tokens (comma separated).")
    auth_token_file: str = _f("", "PROXY_AUTH_TOKEN_FILE", "File with one accepted token per line.")
    rate_limit_enabled: bool = _f(False, "PROXY_RATE_LIMIT_ENABLED", "Enable token-bucket rate limits.")
    rate_limit_global: float = _f(1000.0, "PROXY_RATE_LIMIT_GLOBAL", "Global requests per second.")
    rate_limit_global_burst: int = _f(200, "PROXY_RATE_LIMIT_GLOBAL_BURST", "Global burst.")
    rate_limit_per_model: float = _f(100.0, "PROXY_RATE_LIMIT_PER_MODEL", "Per-model requests per second.")
    rate_limit_burst: int = _f(50, "PROXY_RATE_LIMIT_BURST", "Per-model burst.")
    token_limit_model_tpm: float = _f(0.0, "PROXY_TOKEN_LIMIT_MODEL_TPM",
                                      "Tokens (prompt + completion) per minute per model; 0: off.")
    token_limit_model_burst: float = _f(0.0, "PROXY_TOKEN_LIMIT_MODEL_BURST", "Per-model token burst; 0: one minute's worth.")
    token_limit_key_tpm: float = _f(0.0, "PROXY_TOKEN_LIMIT_KEY_TPM",
                                    "Tokens per minute per API key (needs PROXY_AUTH_ENABLED); 0: off.")
    token_limit_key_burst: float = _f(0.0, "PROXY_TOKEN_LIMIT_KEY_BURST", "Per-key token burst; 0: one minute's worth.")
    token_estimate_divisor: float = _f(4.0, "PROXY_TOKEN_ESTIMATE_DIVISOR",
                                       "Prompt characters per estimated input token.")
    token_count: str = _f("estimate", "PROXY_TOKEN_COUNT",
                          "Input tokens for admission: 'estimate' (characters / divisor) or 'tokenizer' "
                          "(the engine's /tokenize, falling back to the estimate).")
    token_count_timeout: float = _f(0.2, "PROXY_TOKEN_COUNT_TIMEOUT", "Longest wait on the engine's /tokenize.")
    route_header: bool = _f(True, "PROXY_ROUTE_HEADER", "Add X-Flexinfer-Route to responses.")
    stream_usage: bool = _f(True, "PROXY_STREAM_USAGE",
                            "Ask streams that did not ask for usage for it (stream_options.include_usage) and "
                            "remove that usage chunk from what the client receives: token metrics for every stream.")
    max_queue_size: int = _f(100, "PROXY_MAX_QUEUE_SIZE", "Requests held per model while it wakes.")
    queue_timeout: float = _f(60.0, "PROXY_QUEUE_TIMEOUT", "Longest wait for a model to become ready.")
    cold_start_timeout: float = _f(60.0, "PROXY_COLD_START_TIMEOUT", "Default model cold-start timeout.")
    queue_keepalive_after: float = _f(1.0, "PROXY_QUEUE_KEEPALIVE_AFTER", "Waiting streams get SSE comments after this.")
    queue_keepalive_interval: float = _f(5.0, "PROXY_QUEUE_KEEPALIVE_INTERVAL", "Seconds between SSE waiting comments.")
    send_loading_state: bool = _f(False, "PROXY_SEND_LOADING_STATE",
                                  "Waiting streaming chats get the progress as reasoning_content chunks.")
    max_tokens_clamp: bool = _f(True, "PROXY_MAX_TOKENS_CLAMP_ENABLED", "Clamp max_tokens to the window.")
    max_tokens_reserve: int = _f(512, "PROXY_MAX_TOKENS_CLAMP_PROMPT_RESERVE_TOKENS", "Tokens kept for the prompt.")
    engine_scrape_interval: float = _f(1.0, "PROXY_ENGINE_SCRAPE_INTERVAL",
                                       "How often the engines of 'scored' models are scraped (/metrics, /v1/models).")
    engine_scrape_timeout: float = _f(0.5, "PROXY_ENGINE_SCRAPE_TIMEOUT", "Longest wait for one engine's page.")
    engine_metrics_max_age: float = _f(2.0, "PROXY_ENGINE_METRICS_MAX_AGE",
                                       "Engine metrics older than this count as unknown (never as idle).")
    eject_consecutive: int = _f(5, "PROXY_EJECT_CONSECUTIVE",
                                "Consecutive connect errors, 5xx or timeouts that eject an endpoint (0: never).")
    eject_base: float = _f(30.0, "PROXY_EJECT_BASE", "First ejection; the n-th lasts n times this.")
    eject_max: float = _f(300.0, "PROXY_EJECT_MAX", "Longest ejection.")
    eject_max_share: float = _f(0.5, "PROXY_EJECT_MAX_SHARE",
                                "Largest share of a model's endpoints ejected at once (one always stays).")
    health_check_interval: float = _f(0.0, "PROXY_HEALTH_CHECK_INTERVAL",
                                      "Active health check of static endpoints every N seconds (0: off).")
    health_check_timeout: float = _f(1.0, "PROXY_HEALTH_CHECK_TIMEOUT", "Longest wait for one health answer.")
    health_check_path: str = _f("/health", "PROXY_HEALTH_CHECK_PATH", "Path of the active health check.")
    route_explain: str = _f("off", "PROXY_ROUTE_EXPLAIN",
                            "X-Flexinfer-Explain (the scheduler's per-plugin scores): off, request (when the "
                            "request sends X-Flexinfer-Explain: 1) or always.")
    debug_endpoints: bool = _f(True, "PROXY_DEBUG_ENDPOINTS",
                               "Serve GET /debug/endpoints (behind the API keys when auth is on).")
    access_log: bool = _f(False, "PROXY_ACCESS_LOG",
                          "One access record per request on the flexinfer.access logger (docs/logging.md).")
    namespace: str = _f("default", "POD_NAMESPACE", "Kubernetes namespace of the proxy.")
    redis_url: str = _f("", "PROXY_REDIS_URL",
                        "Redis shared by the proxy replicas (redis://, rediss://, unix://); empty: off.")
    redis_timeout: float = _f(0.1, "PROXY_REDIS_TIMEOUT",
                              "Longest wait on one Redis call (connect included); then local state decides.")
    redis_sync_interval: float = _f(0.1, "PROXY_REDIS_SYNC_INTERVAL",
                                    "Period of the in-flight counts exchange between replicas.")
    redis_prefix: str = _f("flexinfer", "PROXY_REDIS_PREFIX", "Prefix of every Redis key (one per deployment).")
    replica_id: str = _f("", "PROXY_REPLICA_ID",
                         "This machine's id among the replicas (its workers share it); empty: <hostname>-<pid>.")
    tracing_enabled: bool = _f(False, "PROXY_TRACING_ENABLED",
                               "OpenTelemetry spans of forwarded requests, sent by OTLP/HTTP (the otel extra; the "
                               "exporter reads the standard OTEL_EXPORTER_OTLP_* variables). docs/tracing.md.")
    tracing_service_name: str = _f("", "PROXY_TRACING_SERVICE_NAME",
                                   "service.name of the spans; empty: OTEL_SERVICE_NAME, else flexinfer-proxy.")
    http: HTTPSettings = field(default_factory=HTTPSettings)
    upstream: UpstreamSettings = field(default_factory=UpstreamSettings)

    def validate(self) -> None:
        if self.tracing_enabled:
            _check_tracing_extra()
        if not 0 < self.port < 65536:
            raise SettingsError(f"port must be 1..65535, got {self.port}")
        if self.workers < 1:
            raise SettingsError(f"workers must be >= 1, got {self.workers}")
        if self.max_queue_size < 0:
            raise SettingsError("PROXY_MAX_QUEUE_SIZE must be >= 0")
        if not 0 < self.engine_scrape_timeout <= self.engine_scrape_interval < self.engine_metrics_max_age:
            raise SettingsError("engine scraping needs 0 < PROXY_ENGINE_SCRAPE_TIMEOUT <= "
                                "PROXY_ENGINE_SCRAPE_INTERVAL < PROXY_ENGINE_METRICS_MAX_AGE")
        if self.eject_consecutive < 0:
            raise SettingsError(f"PROXY_EJECT_CONSECUTIVE must be >= 0, got {self.eject_consecutive}")
        if self.eject_consecutive and not 0 < self.eject_base <= self.eject_max:
            raise SettingsError("PROXY_EJECT_BASE must be > 0 and <= PROXY_EJECT_MAX")
        if not 0.0 <= self.eject_max_share <= 1.0:
            raise SettingsError(f"PROXY_EJECT_MAX_SHARE must be within [0, 1], got {self.eject_max_share}")
        if self.route_explain not in ("off", "request", "always"):
            raise SettingsError(f"PROXY_ROUTE_EXPLAIN must be off, request or always, got {self.route_explain!r}")
        if self.health_check_interval < 0 or (self.health_check_interval and not
                                              0 < self.health_check_timeout <= self.health_check_interval):
            raise SettingsError("the active health check needs PROXY_HEALTH_CHECK_INTERVAL >= 0 and, when on, "
                                "0 < PROXY_HEALTH_CHECK_TIMEOUT <= PROXY_HEALTH_CHECK_INTERVAL")
        if not self.health_check_path.startswith("/"):
            raise SettingsError(f"PROXY_HEALTH_CHECK_PATH must start with '/', got {self.health_check_path!r}")
        for name in ("token_limit_model_tpm", "token_limit_model_burst", "token_limit_key_tpm", "token_limit_key_burst"):
            if not 0 <= getattr(self, name) < 1e15:
                raise SettingsError(f"{name} must be >= 0")
        if not self.token_estimate_divisor > 0:
            raise SettingsError("PROXY_TOKEN_ESTIMATE_DIVISOR must be > 0")
        if self.token_count not in ("estimate", "tokenizer") or not 0 < self.token_count_timeout <= 10:
            raise SettingsError("PROXY_TOKEN_COUNT must be 'estimate' or 'tokenizer', "
                                "PROXY_TOKEN_COUNT_TIMEOUT in (0, 10] s")
        for name in ("rate_limit_global", "rate_limit_per_model"):
            if getattr(self, name) <= 0:
                raise SettingsError(f"{name} must be > 0")
        self._validate_redis()

    def _validate_redis(self) -> None:
        url = self.redis_url
        if url:
            try:
                parts = urlsplit(url)
                ok = bool(parts.hostname if parts.scheme in ("redis", "rediss") else
                          parts.scheme == "unix" and parts.path.strip("/"))
                parts.port  # noqa: B018 (raises ValueError for a bad port)
            except ValueError:
                ok = False
            if not ok:
                raise SettingsError(f"PROXY_REDIS_URL must be redis://host[:port][/db], rediss://... or "
                                    f"unix:///path, got {_redacted(url)!r}")
        if not 0 < self.redis_timeout <= 10:
            raise SettingsError(f"PROXY_REDIS_TIMEOUT must be in (0, 10] s, got {self.redis_timeout}")
        if not 0.01 <= self.redis_sync_interval <= 60:
            raise SettingsError(f"PROXY_REDIS_SYNC_INTERVAL must be in [0.01, 60] s, got {self.redis_sync_interval}")
        if not _REDIS_NAME.fullmatch(self.redis_prefix):
            raise SettingsError("PROXY_REDIS_PREFIX must be 1-64 printable characters without spaces, "
                                f"got {self.redis_prefix!r}")
        if self.replica_id and not _REDIS_NAME.fullmatch(self.replica_id):
            raise SettingsError("PROXY_REPLICA_ID must be 1-64 printable characters without spaces, "
                                f"got {self.replica_id!r}")

    def tokens(self) -> tuple[str, ...]:
        """Every accepted bearer token: from the env list and, if set, the token file."""
        toks = list(self.auth_tokens)
        if self.auth_token_file:
            try:
                with open(self.auth_token_file, encoding="utf-8") as fh:
                    toks.extend(line.strip() for line in fh if line.strip() and not line.startswith("#"))
            except OSError as exc:
                raise SettingsError(f"PROXY_AUTH_TOKEN_FILE: {exc}") from None
        return tuple(toks)


def load_proxy_settings(env: Mapping[str, str] | None = None, **overrides: Any) -> ProxySettings:
    """Read every proxy settings group once. ``overrides`` come from CLI flags (None = unset)."""
    http = from_env(HTTPSettings, env)
    upstream = from_env(UpstreamSettings, env)
    return from_env(ProxySettings, env, http=http, upstream=upstream, **overrides)


def with_changes(obj: Any, **changes: Any) -> Any:
    """A copy of a frozen settings object with some fields changed (tests scale timeouts this way)."""
    return replace(obj, **changes)
