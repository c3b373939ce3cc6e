"""Upstream and client faults end to end: retries, resets, timeouts, aborts and leaks."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import socket
import time

import openai
import pytest

from flexinfer.http import task as request_tasks
from flexinfer.settings import with_changes
from tests.proxy.conftest import Stack, fast_settings, model

CHAT = b'{"model":"%s","messages":[{"role":"user","content":"x"}]%s}'



def tasks_in_flight() -> int:
    """The loop's asyncio tasks and its unfinished request tasks (which asyncio.all_tasks() does
    not list: flexinfer/http/task.py). Call on the loop's thread."""
    return len(asyncio.all_tasks()) + request_tasks.live()

def raw_request(port: int, model_name: str, headers: dict[str, str] | None = None, stream: bool = False) -> bytes:
    body = CHAT % (model_name.encode(), b',"stream":true' if stream else b"")
    head = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    return (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n{head}\r\n").encode() + body


def read_head(sock: socket.socket) -> bytes:
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            break
        buf += chunk
    return buf


def test_refused_replica_is_retried_once_on_another(stack: Stack) -> None:
    # port 1 refuses; the request must land on the stub exactly once
    stack.start_proxy([model("m", 1, stack.stub, routing="round-robin")], fast_settings())
    c = openai.OpenAI(base_url=stack.base_url, api_key="k", max_retries=0)
    for _ in range(4):
        c.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    assert len(stack.stub.requests) == 4
    ids = [r.headers["x-request-id"] for r in stack.stub.requests]
    assert len(set(ids)) == 4


@pytest.mark.parametrize(("mode", "status"), [("reset", 502), ("close", 502), ("garbage", 502)])
def test_request_sent_then_upstream_fails_is_not_retried(stack: Stack, mode: str, status: int) -> None:
    second = stack.add_stub()
    stack.start_proxy([model("m", stack.stub, second, routing="round-robin")], fast_settings())
    c = openai.OpenAI(base_url=stack.base_url, api_key="k", max_retries=0)
    with pytest.raises(openai.APIStatusError) as ei:
        c.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}],
                                  extra_headers={"x-stub-mode": mode})
    assert ei.value.status_code == status
    assert len(stack.stub.requests) + len(second.requests) == 1


def test_response_timeout_is_504(stack: Stack) -> None:
    s = fast_settings()
    s = with_changes(s, upstream=with_changes(s.upstream, response_timeout=0.5))
    stack.start_proxy([model("m", stack.stub)], s)
    c = openai.OpenAI(base_url=stack.base_url, api_key="k", max_retries=0)
    t0 = time.monotonic()
    with pytest.raises(openai.APIStatusError) as ei:
        c.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}],
                                  extra_headers={"x-stub-mode": "hang"})
    assert ei.value.status_code == 504
    assert 0.4 < time.monotonic() - t0 < 3
    assert json.loads(ei.value.response.content)["error"]["code"] == "upstream_timeout"


def test_stream_idle_timeout_ends_with_error_event(stack: Stack) -> None:
    s = fast_settings()
    s = with_changes(s, upstream=with_changes(s.upstream, stream_idle_timeout=0.5))
    stack.start_proxy([model("m", stack.stub)], s)
    c = openai.OpenAI(base_url=stack.base_url, api_key="k", max_retries=0)
    stream = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], stream=True,
                                       extra_headers={"x-stub-mode": "hang-mid"})
    got = []
    with pytest.raises(openai.APIError):
        for ch in stream:
            got.append(ch)
    assert len(got) == 2


def _wait(cond, timeout: float = 5.0) -> bool:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.01)
    return bool(cond())


@pytest.mark.parametrize("phase", ["before-head", "mid-stream"])
def test_client_abort_closes_upstream_within_1s(proxy: Stack, phase: str) -> None:
    stub = proxy.stub
    hdrs = {"x-stub-mode": "hang"} if phase == "before-head" else {"x-stub-interval": "0.05",
                                                                     "x-stub-chunks": "1000"}
    with socket.create_connection(("127.0.0.1", proxy.port)) as s:
        s.sendall(raw_request(proxy.port, "m1", hdrs, stream=True))
        assert _wait(lambda: len(stub.requests) == 1)
        if phase == "mid-stream":
            assert b"200 OK" in read_head(s)
        closed_before = len(stub.closed_at)
        t0 = time.monotonic()
    assert _wait(lambda: len(stub.closed_at) > closed_before, 2.0)
    assert stub.closed_at[-1] - t0 < 1.0


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_200_aborts_leave_nothing_behind(proxy: Stack) -> None:
    stub = proxy.stub

    def one_abort(i: int) -> None:
        with socket.create_connection(("127.0.0.1", proxy.port)) as s:
            s.sendall(raw_request(proxy.port, "m1", {"x-stub-interval": "0.01", "x-stub-chunks": "500"}, True))
            read_head(s)
            s.recv(100)

    one_abort(0)  # warm the pools
    assert _wait(lambda: stub.open_connections == 0)
    time.sleep(0.1)
    gc.collect()
    fds0, tasks0 = _fds(), proxy.call(tasks_in_flight)
    for i in range(200):
        one_abort(i)
    assert _wait(lambda: stub.open_connections == 0, 5), "upstream connections left open"
    assert _wait(lambda: proxy.call(lambda: proxy.server.stats.connections_active) == 0, 5)  # type: ignore[union-attr]
    assert _wait(lambda: proxy.call(tasks_in_flight) <= tasks0, 5)
    gc.collect()
    assert _wait(lambda: _fds() <= fds0 + 2, 5), (_fds(), fds0)
    assert len(stub.requests) == 201
    inflight = proxy.call(lambda: dict(proxy.handler.router.in_flight))  # type: ignore[union-attr]
    assert all(v == 0 for v in inflight.values())


def test_post_reset_on_a_reused_connection_is_not_sent_twice(stack: Stack) -> None:
    # The keep-alive race: the replica resets a pooled connection after the proxy wrote the request
    # and before the response head. The engine may already run it, so it is never written again:
    # the client gets a 502 in the OpenAI shape, the engine saw it once, and a metric counts it.
    import urllib.request

    stack.start_proxy([model("m", stack.stub)], fast_settings())
    c = openai.OpenAI(base_url=stack.base_url, api_key="k", max_retries=0)
    c.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])  # pools the connection
    with pytest.raises(openai.InternalServerError) as ei:
        c.chat.completions.create(model="m", messages=[{"role": "user", "content": "again"}],
                                  extra_headers={"x-stub-mode": "reset"})
    assert ei.value.status_code == 502
    err = json.loads(ei.value.response.content)["error"]
    assert err["code"] == "upstream_not_replayed" and err["type"] == "server_error"
    assert len(stack.stub.requests) == 2
    with urllib.request.urlopen(stack.url + "/metrics", timeout=5) as r:
        text = r.read().decode()
    ep = f"127.0.0.1:{stack.stub.port}"
    assert f'flexinfer_proxy_upstream_errors_total{{endpoint="{ep}",reason="not_replayed"}} 1.0' in text
