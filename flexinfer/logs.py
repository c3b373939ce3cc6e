"""How every component logs: ``--log-format text|json``, secret redaction, control-character escaping.

Owns: :func:`configure` (called once by ``flexinfer.cli`` for every command: the root logger's one
handler, its level and formatter; kopf logs through the same root logger, its per-object records
keep their object reference as ``"object"``), :class:`TextFormatter` and :class:`JsonFormatter`,
:func:`redact` (known secret shapes: ``Bearer``/``Basic`` credentials, ``Authorization:`` values,
``sk-...`` and ``hf_...`` keys, ``api_key=``/``token=``/``password=`` pairs, passwords in URLs such
as ``redis://:pw@host``) and :func:`escape` (control characters as ``\\xNN``, so a CR/LF or ANSI
escape in a path, model or User-Agent can neither forge a line nor colour a terminal: log injection,
reliability plan L1). Both run in the formatter, so every record of every component passes them; what Python prints
by itself (an uncaught exception, "Exception ignored in ..." at exit) is routed through it too.
A record may carry ``fields`` (a dict: the access log's, see ``flexinfer.proxy.accesslog``): JSON
lines carry them as top-level keys, text lines as one JSON object after the message.
Must not: read the environment, import anything of ours, or be on the path of a record that is not
emitted (redaction costs only what is written).
"""

from __future__ import annotations

import logging
import re
import sys
import threading
import time
from typing import Any, TextIO

import orjson

__all__ = ["FORMATS", "JsonFormatter", "TextFormatter", "configure", "escape", "redact"]

FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
MASK = "***"

# (pattern, replacement): the kept prefix is group 1, the secret is masked
_SECRETS: list[tuple[re.Pattern[str], str]] = [
    # a header as text or as a (name, value) pair: "Authorization: Bearer x", (b'authorization', b'x')
    (re.compile(r"""(?i)\b((?:proxy-)?authorization|x-api-key|api-key|cookie|set-cookie)"""
                r"""(['"]?\s*(?:[:=]|,)\s*(?:(?-i:b)?['"])?)[^'"\r\n]+"""), r"\1\2" + MASK),
    # credentials of an auth scheme wherever they appear
    (re.compile(r"(?i)\b(bearer|basic)(\s+)[A-Za-z0-9._~+/=-]+"), r"\1\2" + MASK),
    # key=value / "key": "value" pairs (query strings, env dumps, JSON)
    (re.compile(r"""(?i)(api[_-]?key|token|secret|password|passwd|pwd)"""
                r"""(['"]?\s*[=:]\s*['"]?)(?!\*\*\*)[^\s&'",;)}\]]+"""), r"\1\2" + MASK),
    # well-known key shapes (OpenAI-style and Hugging Face tokens)
    (re.compile(r"\b(sk-)[A-Za-z0-9_-]{6,}"), r"\1" + MASK),
    (re.compile(r"\b(hf_)[A-Za-z0-9]{6,}"), r"\1" + MASK),
    # the password of scheme://user:password@host (redis://:pw@h, https://u:pw@h)
    (re.compile(r"""(://[^/@\s'"]*?:)[^/@\s'"]+@"""), r"\1" + MASK + "@"),
]
# a cheap first look: a line with none of these cannot hold a known secret shape
# (searched in the lower-cased text: an IGNORECASE alternation is several times slower)
_HINT = re.compile(r"auth|key|cookie|bearer|basic|token|secret|pass|pwd|sk-|hf_|://")
_CONTROLS = re.compile(r"[\x00-\x1f\x7f]")
_CONTROLS_BUT_NL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f]")
_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def redact(text: str) -> str:
    """``text`` with every known secret shape masked (``***``)."""
    if not _HINT.search(text.lower()):
        return text
    for pattern, repl in _SECRETS:
        text = pattern.sub(repl, text)
    return text


def _esc(m: re.Match[str]) -> str:
    c = m.group()
    return _ESCAPES.get(c) or f"\\x{ord(c):02x}"


def escape(text: str, *, keep_newlines: bool = False) -> str:
    """Control characters as ``\\n``, ``\\r``, ``\\t`` or ``\\xNN`` (``keep_newlines``: LF stays,
    for the lines of a traceback)."""
    pattern = _CONTROLS_BUT_NL if keep_newlines else _CONTROLS
    return pattern.sub(_esc, text) if pattern.search(text) else text


def _clean(value: Any) -> Any:
    return redact(value) if isinstance(value, str) else value


def _clean_fields(fields: dict[str, Any]) -> dict[str, Any]:
    """``fields`` with each string value redacted; the dict itself when no string can hold a secret
    (one look at all of them: the access log's common case)."""
    strings = [v for v in fields.values() if type(v) is str]
    if not strings or not _HINT.search("\n".join(strings).lower()):
        return fields
    return {k: _clean(v) for k, v in fields.items()}


_last_second = [-1, ""]  # the RFC 3339 text of the last whole second formatted


def _rfc3339(created: float) -> str:
    sec = int(created)
    if sec != _last_second[0]:
        _last_second[:] = [sec, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec))]
    return f"{_last_second[1]}.{int(created * 1000) % 1000:03d}Z"


def _default(value: Any) -> str:
    """orjson's fallback for a value it cannot write: its text, redacted."""
    return redact(str(value))


class TextFormatter(logging.Formatter):
    """``time LEVEL logger: message`` on one line; the traceback (when any) on the lines after it,
    each indented by two spaces."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        msg = record.getMessage()
        msg = redact(msg)
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):  # (each string redacted alone: the keys hold no secret)
            msg = f"{msg} {orjson.dumps(_clean_fields(fields), default=_default).decode()}"
        line = f"{self.formatTime(record)} {record.levelname} {record.name}: {escape(msg)}"
        extra = self._trace(record)
        return f"{line}\n{extra}" if extra else line

    def _trace(self, record: logging.LogRecord) -> str:
        parts = []
        if record.exc_info:
            parts.append(self.formatException(record.exc_info))
        elif record.exc_text:
            parts.append(record.exc_text)
        if record.stack_info:
            parts.append(self.formatStack(record.stack_info))
        if not parts:
            return ""
        # indented: only a record's first line starts at column 0 (a CR/LF in an exception message
        # cannot forge a record either)
        return "\n".join("  " + ln for ln in escape(redact("\n".join(parts)), keep_newlines=True).split("\n"))


_LEVELS = {logging.DEBUG: "debug", logging.INFO: "info", logging.WARNING: "warning", logging.ERROR: "error",
           logging.CRITICAL: "critical"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``time`` (RFC 3339, UTC, milliseconds), ``level``, ``logger``,
    ``message``, then ``exception`` / ``stack`` when present, kopf's ``object`` reference, and the
    record's ``fields``. orjson escapes every control character (``\\u001b``), redaction runs on
    each string value (so the line stays valid JSON)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": _rfc3339(record.created),
            "level": _LEVELS.get(record.levelno) or record.levelname.lower(),
            "logger": record.name,
            "message": redact(record.getMessage()),
        }
        if record.exc_info:
            out["exception"] = redact(self.formatException(record.exc_info))
        elif record.exc_text:
            out["exception"] = redact(record.exc_text)
        if record.stack_info:
            out["stack"] = redact(self.formatStack(record.stack_info))
        ref = getattr(record, "k8s_ref", None)  # kopf's per-object loggers
        if isinstance(ref, dict):
            out["object"] = {k: _clean(v) for k, v in ref.items()}
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):  # (their keys must not be the four above)
            out = {**out, **_clean_fields(fields)}
        return orjson.dumps(out, default=_default).decode()


def formatter(fmt: str) -> logging.Formatter:
    """The formatter of ``--log-format`` ``fmt`` (``text`` or ``json``)."""
    if fmt == "json":
        return JsonFormatter()
    if fmt == "text":
        return TextFormatter()
    raise ValueError(f"log format must be one of {', '.join(FORMATS)}, got {fmt!r}")


def configure(level: str = "info", fmt: str = "text", stream: TextIO | None = None, *,
              force: bool = False) -> logging.Handler | None:
    """Route every logger of the process through one stderr handler with the ``fmt`` formatter at
    ``level``; returns the handler. Like ``logging.basicConfig``, nothing is done when the root
    logger has handlers already (an embedding program's, pytest's) unless ``force`` (which closes them)."""
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    handler.setFormatter(formatter(fmt))  # (a bad format raises before anything changes)
    if logging.getLogger().handlers and not force:
        return None
    logging.basicConfig(level=level.upper(), handlers=[handler], force=force)
    sys.unraisablehook = _unraisable  # what Python prints itself goes through the formatter too
    sys.excepthook = _uncaught
    threading.excepthook = _thread_uncaught
    return handler


def _uncaught(typ: type[BaseException], value: BaseException, tb: Any) -> None:
    logging.getLogger("flexinfer").critical("uncaught exception", exc_info=value)


def _thread_uncaught(args: threading.ExceptHookArgs) -> None:
    if args.exc_type is SystemExit:
        return
    name = args.thread.name if args.thread is not None else "?"
    logging.getLogger("flexinfer").error("uncaught exception in thread %s", name, exc_info=args.exc_value)


def _unraisable(u: Any) -> None:
    """What Python would print as "Exception ignored in ..." (a finalizer's error, at exit too), as a
    record of ours: in the log format, redacted."""
    try:
        what = u.err_msg or "Exception ignored in"
        obj = f": {u.object!r}" if u.object is not None else ""
        logging.getLogger("flexinfer").error("%s%s", what, obj, exc_info=u.exc_value)
    except Exception:  # pragma: no cover - logging torn down: Python's own way
        sys.__unraisablehook__(u)
