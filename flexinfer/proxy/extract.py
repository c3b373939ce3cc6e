"""What a request asks for: the model name, the parsed JSON body, and the upstream body.

This is the ONE place request JSON is parsed (orjson, once). Order of the model name:
``X-Model-ID`` header, then a ``/model/<name>/...`` path prefix (stripped before forwarding), then the
JSON body's ``"model"`` (POST, application/json), then a multipart/form-data field ``model`` (the body
is forwarded untouched). The first source found wins and the upstream body always names the routed
model, so a client cannot make the backend see a model other than the one it was routed to: a JSON
body whose ``model`` key occurs twice after decoding (whatever its spelling: ``"model"``,
``"\u006dodel"``) is refused, and so is a multipart body with more than one ``model`` field or one
that names another model than the header or path it was routed by.

It is also THE place of the path policy (:func:`route_path`): what the proxy does with empty
segments, dot segments and percent-encoded separators, and which paths may reach a backend.
This module does no I/O and knows nothing about the runtime.
"""

from __future__ import annotations

import re
from typing import Any

import orjson
from orjson import loads as _json_loads

try:
    import cython
except ImportError:  # no Cython here: its decorators do nothing in pure Python
    from flexinfer import _nocython as cython  # type: ignore[no-redef]

from flexinfer._speedups import model_key_scan
from flexinfer.errors import BadRequest, InvalidJSON, InvalidModelName, NotFound, PayloadTooLarge

# A model name as clients may send it: ASCII letters, digits and . _ : / @ + -, at most 256
# characters, starting and ending with a letter or digit, no "..". Anything else (CR/LF, spaces,
# obs-text, %-escapes) is a 400: names never reach a header, a log line or a resolver unchecked.
_NAME_RE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._:/@+\-]{0,254}[A-Za-z0-9])?\Z")
_PATH_NAME_RE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._:@+\-]{0,254}[A-Za-z0-9])?\Z")
#: ``model_key_scan``'s answer: (occurrences of ``"model"``, offset of the first or -1, escaped spelling seen)
KeyScan = tuple[int, int, bool]
_NO_KEY: KeyScan = (0, -1, False)
_MODEL_VALUE_RE = re.compile(rb'"model"\s*:\s*"((?:[^"\\]|\\.)*)"')
_MAX_MULTIPART_PARTS = 1000
_MAX_FIELD_BYTES = 256
# The checks below are memoized: the hot path sees the same few names and paths again and again.
# A memo remembers only what returned (a refused value raises, so it is checked in full every time)
# and is bounded: emptied once it holds _MEMO_MAX entries, so random input cannot grow it. Plain
# dicts, not functools.lru_cache: a hit is one dict lookup, where the cache's call cost 500-800
# instructions (its key, its recency list and the call through Python: bench/instr.py, issue 15).
_MEMO_MAX = 1024
_names_ok: dict[str, str] = {}
_paths: dict[str, str] = {}
_routes: dict[str, tuple[str | None, str]] = {}


@cython.annotation_typing(False)  # the cpdef of extract.pxd
def _remember(memo: dict[str, Any], key: str, value: Any) -> None:
    if len(memo) >= _MEMO_MAX:
        memo.clear()
    memo[key] = value


@cython.annotation_typing(False)  # the cpdef of extract.pxd
def check_model_name(name: str, source: str) -> str:
    memo = _names_ok
    if name in memo:
        return name
    if not _NAME_RE.match(name) or ".." in name:
        raise InvalidModelName(
            f"invalid model name from {source}: use letters, digits and . _ : / @ + - (at most 256)",
            param="model")
    _remember(memo, name, name)
    return name


# A dot segment (``.``/``..``, also percent-encoded), an encoded separator (``%2f`` ``%5c``), an
# encoded NUL, a double encoding (``%25``), an overlong UTF-8 lead byte (``%c0``/``%c1``: ``%c0%ae``
# is a '.' to a lax decoder) or a backslash: a backend that decodes or normalizes the path could
# climb out of the API, so these are refused, never rewritten.
_BAD_PATH_RE = re.compile(r"(?:^|/)(?:\.|%2e){1,2}(?:/|$)|%2f|%5c|%00|\\|%25|%c[01]", re.IGNORECASE)
_SLASHES_RE = re.compile(r"//+")
#: The only paths forwarded to a backend (after a ``/model/<name>`` prefix is stripped).
API_PREFIX = "/v1/"


@cython.annotation_typing(False)  # the cpdef of extract.pxd
def normalize_path(path: str) -> str:
    """The request path as the proxy routes it, decided once for every route.

    Empty segments are merged (``//v1//chat`` is ``/v1/chat``, as nginx's ``merge_slashes``): the
    backend is sent exactly the path the proxy routed by, so merging cannot confuse them. Dot
    segments, encoded separators, encoded NUL, double encoding and backslashes are refused (400).
    """
    memo = _paths
    done = memo.get(path)
    if done is not None:
        return done
    if _BAD_PATH_RE.search(path):
        raise BadRequest("request path contains dot segments or encoded separators", code="invalid_path")
    done = _SLASHES_RE.sub("/", path) if "//" in path else path
    _remember(memo, path, done)
    return done


@cython.annotation_typing(False)  # the cpdef of extract.pxd
def route_path(path: str) -> tuple[str | None, str]:
    """A normalized path -> (model name from a ``/model/<name>/`` prefix or None, upstream path).

    The upstream path always starts with ``/v1/``: anything else is a 404 (``unknown_url``), so
    ``/model/<name>`` with nothing after it, or a backend's own admin routes, are never forwarded.
    """
    memo = _routes
    done = memo.get(path)
    if done is not None:
        return done
    name: str | None = None
    rest = path
    if path.startswith("/model/") or path == "/model":
        name, _, tail = path[7:].partition("/")
        if not name:
            raise InvalidModelName("empty model name in /model/<name>/ path", param="model")
        if not _PATH_NAME_RE.match(name) or ".." in name:
            raise InvalidModelName("invalid model name in /model/<name>/ path", param="model")
        rest = "/" + tail
    if not rest.startswith(API_PREFIX):
        raise NotFound(f"no such API route: {path[:200]} (the proxy forwards {API_PREFIX}... paths, "
                       "optionally behind /model/<name>)", code="unknown_url")
    done = (name, rest)
    _remember(memo, path, done)
    return done


def parse_json(body: bytes) -> dict[str, Any] | None:
    """Parse a JSON request body; None for an empty body. Only objects are accepted."""
    return parse_json_counted(body)[0]


@cython.annotation_typing(False)  # the cpdef of extract.pxd
def parse_json_counted(body: bytes) -> tuple[dict[str, Any] | None, KeyScan]:
    """(parsed body, the raw scan of its ``"model"`` key): the body is scanned once, and the scan is
    handed to :func:`rewrite_model`, which needs it too.

    orjson keeps the last of duplicate keys silently, and a backend may keep another one, so a
    top-level ``model`` key that occurs twice after decoding is refused. The raw scan decides
    without a second parser only when it cannot be wrong: the key can be spelled with ``\\u``
    escapes of its letters (``m o d e l`` are U+0064..U+006F, so every such escape starts with
    ``\\u006``), and JSON encoders never escape ASCII letters, so a body without ``\\u006`` spells
    it only as ``"model"``; one occurrence of that cannot be a duplicate. Any other body is checked
    by the stdlib parser, which sees the top-level pairs.
    """
    if not body:
        return None, _NO_KEY
    try:
        data = _json_loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidJSON(f"request body is not valid JSON: {exc.msg} at position {exc.pos}") from None
    if not isinstance(data, dict):
        raise InvalidJSON("request body must be a JSON object")
    scan = model_key_scan(body)
    keys, _, escaped = scan
    if (keys > 1 or escaped) and _top_level_model_keys(body) > 1:
        raise InvalidJSON("request body has more than one top-level \"model\" key", param="model")
    return data, scan


def _top_level_model_keys(body: bytes) -> int:
    """How many top-level keys decode to ``model`` (slow path: the stdlib parser keeps the pairs)."""
    import json

    try:
        top = json.loads(body, object_pairs_hook=list)
    except RecursionError:
        # orjson accepted nesting deeper than the stdlib parser can follow: refuse rather than guess
        raise InvalidJSON("request body is nested too deeply") from None
    except ValueError as exc:  # pragma: no cover - orjson accepted it, the stdlib parser agrees
        raise InvalidJSON(f"request body is not valid JSON: {exc}") from None
    return sum(1 for k, _ in top if k == "model") if isinstance(top, list) else 0


@cython.annotation_typing(False)  # the cpdef of extract.pxd
def body_model(data: dict[str, Any] | None) -> str | None:
    if data is None or "model" not in data:
        return None
    value = data["model"]
    if not isinstance(value, str) or not value:
        raise InvalidModelName("\"model\" must be a non-empty string", param="model")
    return check_model_name(value, "the request body")


@cython.annotation_typing(False)  # the cpdef of extract.pxd
def rewrite_model(body: bytes, data: dict[str, Any], new: str, scan: KeyScan | None = None) -> bytes:
    """The body with its top-level ``"model"`` set to ``new``.

    Splices the new value into the raw bytes when the key occurs exactly once, in plain form and with
    no escaped spelling anywhere (the common case: no re-encoding of the messages), at the offset the
    scan found; otherwise re-serializes the parsed object.
    """
    if data.get("model") == new:
        return body
    count, first, escaped = model_key_scan(body) if scan is None else scan
    if count == 1 and not escaped:
        m = _MODEL_VALUE_RE.match(body, first)
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
    """The ``model`` form field of a multipart body (body untouched), scanning at most 1000 parts.

    Every part is looked at, not just up to the first ``model``: two ``model`` fields are refused
    (a backend may read either), and so is a part whose Content-Disposition is ambiguous (two
    Content-Disposition headers, two ``name`` parameters). ``name`` is matched as parsers read it:
    a quoted string with its escapes or a bare token, the parameter name in any case, ``name*``
    (RFC 8187) decoded; ``filename`` never counts.
    """
    delim = b"--" + _boundary(content_type_header)
    pos = body.find(delim)
    parts = 0
    found: bytes | None = None
    while pos != -1:
        parts += 1
        if parts > _MAX_MULTIPART_PARTS:
            raise PayloadTooLarge("multipart body has too many parts")
        start = pos + len(delim)
        if body[start:start + 2] == b"--":
            break
        head_end = body.find(b"\r\n\r\n", start)
        if head_end == -1:
            raise BadRequest("malformed multipart body", code="invalid_multipart")
        nxt = body.find(b"\r\n" + delim, head_end + 4)
        if nxt == -1:
            raise BadRequest("malformed multipart body: missing closing boundary", code="invalid_multipart")
        if _part_is_model(body[start:head_end]):
            if found is not None:
                raise BadRequest("multipart body has more than one \"model\" field", param="model",
                                 code="duplicate_model")
            found = body[head_end + 4:nxt]
        pos = nxt + 2
    else:
        raise BadRequest("malformed multipart body: no boundary found", code="invalid_multipart")
    if found is None:
        return None
    if len(found) > _MAX_FIELD_BYTES:
        raise InvalidModelName("multipart model field is too long", param="model")
    try:
        text = found.decode("ascii")
    except UnicodeDecodeError:
        raise InvalidModelName("multipart model field must be ASCII", param="model") from None
    return check_model_name(text, "the multipart form")


def _part_is_model(head: bytes) -> bool:
    """Whether a part's header block names the form field ``model``."""
    disposition: bytes | None = None
    for line in head.split(b"\r\n"):
        hname, colon, value = line.partition(b":")
        if colon and hname.strip().lower() == b"content-disposition":
            if disposition is not None:
                raise BadRequest("multipart part with two Content-Disposition headers", code="invalid_multipart")
            disposition = value
    if disposition is None:
        return False
    names = [v for k, v in _disposition_params(disposition) if k in (b"name", b"name*")]
    if len(names) > 1:
        raise BadRequest("multipart part with more than one field name", code="invalid_multipart")
    return bool(names) and names[0] == b"model"


def _disposition_params(value: bytes) -> list[tuple[bytes, bytes]]:
    """``form-data; name="a\\"b"; filename=x`` -> [(b"name", b'a"b'), (b"filename", b"x")]: parameter
    names lower-cased, quoted strings unescaped, ``name*=utf-8''...`` percent-decoded."""
    out: list[tuple[bytes, bytes]] = []
    i, n = value.find(b";"), len(value)
    while i != -1 and i < n:
        i += 1
        eq = value.find(b"=", i)
        if eq == -1:
            break
        key = value[i:eq].strip().lower()
        j = eq + 1
        while j < n and value[j] in b" \t":
            j += 1
        if j < n and value[j] == 34:  # a quoted string
            buf = bytearray()
            j += 1
            while j < n and value[j] != 34:
                if value[j] == 92 and j + 1 < n:
                    j += 1
                buf.append(value[j])
                j += 1
            val = bytes(buf)
            i = value.find(b";", j)
        else:
            i = value.find(b";", j)
            val = value[j:i if i != -1 else n].strip()
        if key.endswith(b"*"):
            val = _ext_value(val)
        out.append((key, val))
    return out


def _ext_value(val: bytes) -> bytes:
    """RFC 8187 ``charset'lang'pct-encoded`` -> the decoded bytes (undecodable: unchanged)."""
    import urllib.parse

    charset, q1, rest = val.partition(b"'")
    _, q2, encoded = rest.partition(b"'")
    if not (q1 and q2):
        return val
    try:
        return urllib.parse.unquote_to_bytes(encoded).decode(charset.decode("ascii") or "utf-8").encode()
    except (LookupError, UnicodeDecodeError):
        return val


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
