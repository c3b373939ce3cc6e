"""The per-model options of ``flexinfer serve``'s config that llama-swap users reach for.

Owns: the ``filters:`` type (:class:`Filters`) and :func:`model_options`, which checks a model's
``proxy``, ``cmd_stop``, ``check_endpoint``, ``filters``, limits and listing metadata and turns them
into the keyword arguments of a :class:`~flexinfer.runtime.localconfig.LocalModelSpec`
(docs/config.md "Per-model options"). Must not: start anything, or read anything but the entry.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import msgspec

from flexinfer.runtime.base import BodyFilters, Endpoint
from flexinfer.runtime.configfile import Path, Source, shell_words

if TYPE_CHECKING:
    from flexinfer.runtime.localconfig import LocalModel


class Filters(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Request-body filters, applied to JSON bodies before they are forwarded (llama-swap's)."""

    strip_params: Annotated[str | list[str], msgspec.Meta(
        description="keys removed from the request body: a list, or one comma-separated string")] = []
    set_params: Annotated[dict[str, Any], msgspec.Meta(
        description="keys forced to these values in the request body")] = {}


def _words(value: str | list[str | int]) -> list[str]:
    return shell_words(value) if isinstance(value, str) else [str(v) for v in value]


def model_options(src: Source, path: Path, m: LocalModel, backend: str, command: tuple[str, ...]) -> dict[str, Any]:
    """The per-model options (proxy, cmd_stop, check_endpoint, filters, limits, metadata) of a
    LocalModelSpec; problems go to ``src``."""
    if m.proxy is not None:
        if backend == "llamacpp":
            src.error((*path, "proxy"), "backend llamacpp listens on 127.0.0.1:${PORT}; for a fixed port or "
                      "another host use backend: command with cmd (or no cmd)")
        if not command and "${PORT}" in m.proxy:
            src.error((*path, "proxy"), "without cmd nothing is started: the proxy URL needs a fixed port, "
                      "not ${PORT}")
        try:
            Endpoint.parse(m.proxy.replace("${PORT}", "1").replace("$$", "$"))
        except ValueError as exc:
            src.error((*path, "proxy"), f"{exc} (an upstream URL http://host:port)")
    if not command and m.group:
        src.error((*path, "group"), "a model without cmd is never started or stopped: it cannot be in a group")
    stop = _words(m.cmd_stop) if m.cmd_stop is not None else []
    if m.cmd_stop is not None and not stop:
        src.error((*path, "cmd_stop"), "an empty command")
    if stop and not command:
        src.error((*path, "cmd_stop"), "cmd_stop needs cmd (a model without cmd is never started or stopped)")
    if m.check_endpoint is not None:
        if m.health_path is not None:
            src.error((*path, "check_endpoint"), "give health_path or check_endpoint, not both")
        elif m.check_endpoint != "none" and not m.check_endpoint.startswith("/"):
            src.error((*path, "check_endpoint"), f"{m.check_endpoint!r}: a path starting with / or none")
    filters = None
    if m.filters is not None:
        raw = m.filters.strip_params
        strip = [k.strip() for k in (raw.split(",") if isinstance(raw, str) else raw) if k.strip()]
        for key, where in [*((k, "strip_params") for k in strip), *((k, "set_params") for k in m.filters.set_params)]:
            if key == "model":
                src.error((*path, "filters", where), "the model key cannot be filtered (it routes the request)")
        if strip or m.filters.set_params:
            filters = BodyFilters(tuple(dict.fromkeys(strip)), dict(m.filters.set_params))
    return dict(proxy=m.proxy, stop_command=tuple(stop), unlisted=m.unlisted,
                concurrency_limit=m.concurrency_limit, response_timeout=m.response_timeout, filters=filters,
                display_name=m.display_name, description=m.description)
