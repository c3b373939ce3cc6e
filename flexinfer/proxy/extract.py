"""What a request asks for: the model name, the parsed JSON body, and the upstream body.

This is the ONE place request JSON is parsed (orjson, once). Order of the model name:
``X-Model-ID`` header, then a ``/model/<name>/...`` path prefix (stripped before forwarding), then the
JSON body's ``"model"`` (POST, application/json), then a multipart/form-data field ``model`` (the body
is forwarded untouched). The first source found wins and the upstream body always names the routed
model, so a client cannot make the backend see a model other than the one it was routed to.
This module does no I/O and knows nothing about the runtime.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import orjson

from flexinfer.errors import BadRequest, InvalidJSON, InvalidModelName, PayloadTooLarge

# A model name as clients may send it: ASCII letters, digits and . _ : / @ + -, at most 256
# characters, starting and ending with a letter or digit, no "..". Anything else (CR/LF, spaces,
# obs-text, %-escapes) is a 400: names never reach a header, a log line or a resolver unchecked.
_NAME_RE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._:/@+\-]{0,254}[A-Za-z0-9])?\Z")
_PATH_NAME_RE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._:@+\-]{0,254}[A-Za-z0-9])?\Z")
_MODEL_KEY = b'"model"'
_MODEL_VALUE_RE = re.compile(rb'"model"\s*:\s*"((?:[^"\\]|\\.)*)"')
_MAX_MULTIPART_PARTS = 1000
_MAX_FIELD_BYTES = 256
# The checks below are memoized: the hot path sees the same few names and paths again and again.
# lru_cache remembers only what returned (a refused value raises, so it is checked in full every
# time) and is bounded, so random input cannot grow it.


@functools.lru_cache(maxsize=1024)
def check_model_name(name: str, source: str) -> str:
    if not _NAME_RE.match(name) or ".." in name:
        raise InvalidModelName(
            f"invalid model name from {source}: use letters, digits and . _ : / @ + - (at most 256)",
            param="model")
    return name


def split_model_path(path: str) -> tuple[str | None, str]:
    """``/model/<name>/rest`` -> (name, ``/rest``); other paths -> (None, path)."""
    if not path.startswith("/model/"):
        return None, path
    rest = path[7:]
    name, slash, tail = rest.partition("/")
    if not name:
        raise InvalidModelName("empty model name in /model/<name>/ path", param="model")
    if not _PATH_NAME_RE.match(name) or ".." in name:
        raise InvalidModelName("invalid model name in /model/<name>/ path", param="model")
    return name, "/" + tail if slash else "/"


_BAD_PATH_RE = re.compile(r"(?:^|/)(?:\.|%2e){1,2}(?:/|$)|%2f|%5c|%00|\\|%25", re.IGNORECASE)


@functools.lru_cache(maxsize=1024)
def check_path(path: str) -> str:
    """Refuse paths that could climb out of the API on the backend (dot segments, encoded slashes)."""
    if _BAD_PATH_RE.search(path):
        raise BadRequest("request path contains dot segments or encoded separators", code="invalid_path")
    return path


def parse_json(body: bytes) -> dict[str, Any] | None:
    """Parse a JSON request body; None for an empty body. Only objects are accepted."""
    return parse_json_counted(body)[0]


def parse_json_counted(body: bytes) -> tuple[dict[str, Any] | None, int]:
    """(parsed body, occurrences of the raw ``"model"`` key token): the body is scanned once and the
    count is handed to :func:`rewrite_model`, which needs it too."""
    if not body:
        return None, 0
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidJSON(f"request body is not valid JSON: {exc.msg} at position {exc.pos}") from None
    if not isinstance(data, dict):
        raise InvalidJSON("request body must be a JSON object")
    keys = body.count(_MODEL_KEY)
    if keys > 1 and _has_duplicate_model(body):
        raise InvalidJSON("request body has more than one top-level \"model\" key", param="model")
    return data, keys


def _has_duplicate_model(body: bytes) -> bool:
    """Slow path, only when "model" occurs more than once in the raw bytes: orjson keeps the last
    of duplicate keys silently, so look at the top-level pairs with the stdlib parser."""
    import json

    try:
        top = json.loads(body, object_pairs_hook=lambda pairs: pairs)
    except (ValueError, RecursionError):
        return False
    return isinstance(top, list) and sum(1 for k, _ in top if k == "model") > 1


def body_model(data: dict[str, Any] | None) -> str | None:
    if data is None or "model" not in data:
        return None
    value = data["model"]
    if not isinstance(value, str) or not value:
        raise InvalidModelName("\"model\" must be a non-empty string", param="model")
    return check_model_name(value, "the request body")


def rewrite_model(body: bytes, data: dict[str, Any], new: str, key_count: int | None = None) -> bytes:
    """The body with its top-level ``"model"`` set to ``new``.

    Splices the new value into the raw bytes when the key occurs exactly once in plain form (the
    common case: no re-encoding of the messages); otherwise re-serializes the parsed object.
    """
    if data.get("model") == new:
        return body
    if key_count is None:
        key_count = body.count(_MODEL_KEY)
    if key_count == 1 and b"\\u" not in body:
        m = _MODEL_VALUE_RE.search(body)
        if m is not None:
            raw = m.group(1)
            if b"\\" not in raw and raw.decode("utf-8", "replace") == data.get("model"):
                return body[: m.start(1)] + orjson.dumps(new)[1:-1] + body[m.end(1):]
    out = dict(data)
    out["model"] = new
    return orjson.dumps(out)


def is_stream(data: dict[str, Any] | None) -> bool:
    return bool(data is not None and data.get("stream") is True)


def _boundary(content_type_header: bytes) -> bytes:
    for param in content_type_header.split(b";")[1:]:
        k, _, v = param.strip().partition(b"=")
        if k.strip().lower() == b"boundary":
            v = v.strip()
            if v.startswith(b'"') and v.endswith(b'"') and len(v) >= 2:
                v = v[1:-1]
            if not 1 <= len(v) <= 70:
                raise BadRequest("multipart boundary must be 1 to 70 characters", code="invalid_multipart")
            return v
    raise BadRequest("multipart/form-data without a boundary", code="invalid_multipart")


def multipart_model(body: bytes, content_type_header: bytes) -> str | None:
    """The ``model`` form field of a multipart body, scanning at most 1000 parts; body untouched."""
    delim = b"--" + _boundary(content_type_header)
    pos = body.find(delim)
    parts = 0
    while pos != -1:
        parts += 1
        if parts > _MAX_MULTIPART_PARTS:
            raise PayloadTooLarge("multipart body has too many parts before the model field")
        start = pos + len(delim)
        if body[start:start + 2] == b"--":
            return None
        head_end = body.find(b"\r\n\r\n", start)
        if head_end == -1:
            raise BadRequest("malformed multipart body", code="invalid_multipart")
        nxt = body.find(b"\r\n" + delim, head_end + 4)
        if nxt == -1:
            raise BadRequest("malformed multipart body: missing closing boundary", code="invalid_multipart")
        headers = body[start:head_end].lower()
        if b'name="model"' in headers and b"content-disposition" in headers:
            value = body[head_end + 4:nxt]
            if len(value) > _MAX_FIELD_BYTES:
                raise InvalidModelName("multipart model field is too long", param="model")
            try:
                text = value.decode("ascii")
            except UnicodeDecodeError:
                raise InvalidModelName("multipart model field must be ASCII", param="model") from None
            return check_model_name(text.strip(), "the multipart form")
        pos = nxt + 2
    raise BadRequest("malformed multipart body: no boundary found", code="invalid_multipart")


def clamp_max_tokens(data: dict[str, Any], window: int, reserve: int) -> tuple[int, int] | None:
    """Lower ``max_tokens`` / ``max_completion_tokens`` above ``window - reserve`` in place.

    Returns (from, to) when something was lowered. The reserve keeps room for the prompt, so a
    request the backend would reject for its context length gets a usable answer instead.
    """
    limit = max(1, window - reserve)
    out: tuple[int, int] | None = None
    for key in ("max_tokens", "max_completion_tokens"):
        v = data.get(key)
        if isinstance(v, int) and not isinstance(v, bool) and v > limit:
            data[key] = limit
            out = (v, limit)
    return out
