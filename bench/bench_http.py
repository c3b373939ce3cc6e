"""Benchmarks: the per-request HTTP and proxy primitives (pytest-benchmark; reported, not asserted).

Run: ``.venv/bin/python -m pytest bench/bench_http.py --benchmark-only -p no:cacheprovider``.
The benchmark gate (``bench/gate.py``) runs this file on HEAD and on the baseline commit and prints
the per-case median ratio; it uses only signatures the baseline shares. Cases, with the request a
chat client sends (a 1000-character message, the headers of the ``openai`` client):

- ``parse_json``: :func:`flexinfer.proxy.extract.parse_json_counted` (orjson plus the model-key scan)
- ``body_model``: the model name of the parsed body, checked
- ``rewrite_model``: :func:`~flexinfer.proxy.extract.rewrite_model` to another name (the splice)
- ``rewrite_model_same``: the same name (no copy)
- ``route_path``: :func:`~flexinfer.proxy.extract.normalize_path` then ``route_path`` (cached)
- ``serialize_request``: :func:`flexinfer.http.upstream.serialize_request` of the forwarded head
- ``read_headers``: :func:`flexinfer.http.head.read_headers` of the client's header block
- ``request_line``: :func:`flexinfer.http.head.request_line`
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from flexinfer.http.head import read_headers, request_line
from flexinfer.http.upstream import serialize_request
from flexinfer.proxy.extract import body_model, normalize_path, parse_json_counted, rewrite_model, route_path

BODY = json.dumps({"model": "gate", "messages": [{"role": "user", "content": "x" * 1000}],
                   "max_tokens": 64, "temperature": 0.7}).encode()
RAW_HEADERS: list[tuple[bytes, bytes]] = [
    (b"Host", b"127.0.0.1:8080"), (b"Accept-Encoding", b"gzip, deflate"), (b"Connection", b"keep-alive"),
    (b"Accept", b"application/json"), (b"Content-Type", b"application/json"),
    (b"User-Agent", b"OpenAI/Python 1.54.0"), (b"X-Stainless-Lang", b"python"),
    (b"X-Stainless-Package-Version", b"1.54.0"), (b"X-Stainless-OS", b"Linux"),
    (b"X-Stainless-Arch", b"x64"), (b"X-Stainless-Runtime", b"CPython"),
    (b"X-Stainless-Runtime-Version", b"3.11.7"), (b"Authorization", b"Bearer sk-gate"),
    (b"X-Stainless-Async", b"false"), (b"x-stainless-retry-count", b"0"),
    (b"Content-Length", b"%d" % len(BODY)),
]
FORWARD_HEADERS = [(k.lower(), v) for k, v in RAW_HEADERS if k.lower() not in (b"host", b"content-length")]
HOST_LINE = b"host: 127.0.0.1:8000\r\n"


def _parse() -> Any:
    return parse_json_counted(BODY)


def _body_model() -> Any:
    data, _ = parse_json_counted(BODY)
    return lambda: body_model(data)


def _rewrite(new: str) -> Callable[[], Any]:
    data, scan = parse_json_counted(BODY)
    assert data is not None
    return lambda: rewrite_model(BODY, data, new, scan)


def _route() -> Any:
    return route_path(normalize_path("/v1/chat/completions"))


def _serialize() -> Any:
    return serialize_request("POST", "/v1/chat/completions", FORWARD_HEADERS, BODY, HOST_LINE)


def _read_headers() -> Any:
    return read_headers(RAW_HEADERS, "1.1", 65536)


def _request_line() -> Any:
    return request_line("1.1", b"POST", b"/v1/chat/completions")


CASES: dict[str, Callable[[], Callable[[], Any]]] = {
    "parse_json": lambda: _parse,
    "body_model": _body_model,
    "rewrite_model": lambda: _rewrite("gate-routed"),
    "rewrite_model_same": lambda: _rewrite("gate"),
    "route_path": lambda: _route,
    "serialize_request": lambda: _serialize,
    "read_headers": lambda: _read_headers,
    "request_line": lambda: _request_line,
}


@pytest.mark.parametrize("case", list(CASES))
def test_http(benchmark: Any, case: str) -> None:
    fn = CASES[case]()
    fn()  # a failing primitive fails here, not inside the timer
    benchmark.group = "http"
    benchmark(fn)


if __name__ == "__main__":  # `python bench/bench_http.py` (pytest does not collect bench_*.py)
    import sys

    raise SystemExit(pytest.main([__file__, "--benchmark-only", "-p", "no:cacheprovider", *sys.argv[1:]]))
