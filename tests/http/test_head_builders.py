"""The two head builders of the HTTP core (a request to a backend, a response to a client) give the
same bytes, or the same ValueError, with their one-pass head_block as without it.

``serialize_request`` and ``ResponseWriter._build_head`` try ``head_block`` (a compiled primitive in
the compiled build) and fall back to their own loop when it answers None. Here each builder runs
twice on the same input: as it is, and with ``head_block`` replaced by one that always answers None
(the loop alone, the code before head_block existed). Run on the compiled and the pure build (the
Makefile's second pass)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flexinfer.http import request as request_mod
from flexinfer.http import upstream as upstream_mod
from flexinfer.http.request import Request, ResponseWriter
from flexinfer.http.upstream import serialize_request
from flexinfer.proxy import forward as forward_mod

_NAMES = st.sampled_from([b"x-a", b"content-type", b"Content-Type", b"content-length", b"Content-Length",
                          b"connection", b"Connection", b"keep-alive", b"transfer-encoding", b"host", b"expect",
                          b"te", b"date", b"x-hop", b"X-Hop", b"", b"bad name", b"a:b", b"\xff", b"authorization",
                          b"x-flexinfer-route", b"x-request-id"])
_VALUES = st.sampled_from([b"", b"1", b"x-hop", b"x-hop, x-a", b"close", b"application/json",
                           b"a\r\nx-evil: 1", b"a\nb", b"\r", b"\x00", b"\xff", b" v "])


def _outcome(fn: Any, *args: Any) -> tuple[str, Any]:
    try:
        return "ok", fn(*args)
    except ValueError as exc:
        return "ValueError", str(exc)


def _never(*_: Any) -> None:
    return None


@given(st.lists(st.tuples(_NAMES, _VALUES), max_size=12), st.sampled_from(["GET", "POST", "DELETE"]),
       st.sampled_from([b"", b"{}"]))
@settings(max_examples=1000, deadline=None)
def test_request_head_with_and_without_head_block(headers: list[tuple[bytes, bytes]], method: str,
                                                  body: bytes) -> None:
    args = (method, "/v1/chat/completions", headers, body, b"host: up:8000\r\n")
    fast = _outcome(serialize_request, *args)
    real = upstream_mod.head_block
    setattr(upstream_mod, "head_block", _never)  # noqa: B010 (mypy: a different signature)
    try:
        slow = _outcome(serialize_request, *args)
    finally:
        upstream_mod.head_block = real
    assert fast == slow


class _Proto:
    draining = False
    transport = None
    flow = None


def _writer(version: str, keep_alive: bool) -> ResponseWriter:
    req = Request("GET", b"/", "/", "", version, [], keep_alive, "127.0.0.1:1", b"")
    return ResponseWriter(_Proto(), req)  # type: ignore[arg-type]


@given(st.lists(st.tuples(_NAMES, _VALUES), max_size=12), st.sampled_from([200, 404, 503]),
       st.sampled_from([b"", b"content-length: 2\r\n", b"transfer-encoding: chunked\r\n"]),
       st.sampled_from(["1.1", "1.0"]), st.booleans())
@settings(max_examples=1000, deadline=None)
def test_response_head_with_and_without_head_block(headers: list[tuple[bytes, bytes]], status: int,
                                                   framing: bytes, version: str, keep_alive: bool) -> None:
    fast = _outcome(_writer(version, keep_alive)._build_head, status, headers, framing)
    real = request_mod.head_block
    setattr(request_mod, "head_block", _never)  # noqa: B010
    try:
        slow = _outcome(_writer(version, keep_alive)._build_head, status, headers, framing)
    finally:
        request_mod.head_block = real
    assert fast == slow


def test_the_common_heads_take_the_one_pass() -> None:
    """The proxy's usual heads are built by head_block (no fallback), so the tests above compare
    both paths on them (a head_block that always gave up would pass those and cost twice)."""
    calls: list[bool] = []
    real_up, real_req = upstream_mod.head_block, request_mod.head_block

    def spy(real: Any) -> Any:
        def run(*args: Any) -> Any:
            out = real(*args)
            calls.append(out is not None)
            return out
        return run

    setattr(upstream_mod, "head_block", spy(real_up))  # noqa: B010
    setattr(request_mod, "head_block", spy(real_req))  # noqa: B010
    try:
        serialize_request("POST", "/v1/chat/completions", [(b"content-type", b"application/json"),
                                                            (b"x-request-id", b"abc")], b"{}", b"host: up\r\n")
        _writer("1.1", True)._build_head(200, [(b"content-type", b"application/json"),
                                               (b"content-length", b"2")], b"content-length: 2\r\n")
    finally:
        upstream_mod.head_block, request_mod.head_block = real_up, real_req
    assert calls == [True, True]


def _req(headers: list[tuple[bytes, bytes]], peer: str = "10.1.2.3:5555") -> Request:
    """A real Request (the compiled forward types its argument: a stand-in is refused there)."""
    return Request("POST", b"/v1/chat/completions", "/v1/chat/completions", "", "1.1", headers, True, peer,
                   b"application/json")


_LOWER = st.sampled_from([b"x-a", b"content-type", b"connection", b"keep-alive", b"host", b"authorization",
                          b"x-flexinfer-route", b"x-flexinfer-explain", b"x-request-id", b"x-forwarded-for",
                          b"te", b"x-hop", b"proxy-authorization", b"user-agent"])


@given(st.lists(st.tuples(_LOWER, st.sampled_from([b"1", b"x-hop", b"x-a, te", b"close"])), max_size=10),
       st.booleans())
@settings(max_examples=500, deadline=None)
def test_upstream_headers_as_before(headers: list[tuple[bytes, bytes]], drop_auth: bool) -> None:
    """forward.upstream_headers (a verdict per name, remembered) against its rules written out."""
    out = forward_mod.upstream_headers(_req(headers), b"rid", drop_auth)
    named = {t.strip().lower() for k, v in headers if k == b"connection" for t in v.split(b",")}
    expected = [(k, v) for k, v in headers
                if k not in forward_mod._DROP_UP and k not in named and not k.startswith(b"x-flexinfer-")
                and not (drop_auth and k == b"authorization")]
    expected += [(b"x-request-id", b"rid"), (b"x-forwarded-for", b"10.1.2.3"), (b"x-forwarded-proto", b"http")]
    assert out == expected


@pytest.mark.parametrize(("peer", "host"), [("10.1.2.3:5555", b"10.1.2.3"), ("[::1]:80", b"[::1]"),
                                            ("unix", b"unix")])
def test_forwarded_for(peer: str, host: bytes) -> None:
    assert forward_mod.upstream_headers(_req([], peer), b"r", False)[-2] == (b"x-forwarded-for", host)
