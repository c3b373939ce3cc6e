"""The local runtime behind the proxy, with the stub engine as the model process (fast)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import socket
import time
import urllib.request
from pathlib import Path

import openai
import pytest

from flexinfer.sharing import Windows
from tests.runtime.conftest import LocalStack, fast_local_settings, stub_cmd

MSG = [{"role": "user", "content": "hi"}]


def client(st: LocalStack, **kw: object) -> openai.OpenAI:
    return openai.OpenAI(base_url=st.base_url, api_key="k", max_retries=0, **kw)  # type: ignore[arg-type]


def fetch(url: str | urllib.request.Request, timeout: float = 5) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return bytes(r.read())


def running(st: LocalStack) -> dict[str, dict]:  # type: ignore[type-arg]
    with urllib.request.urlopen(st.url + "/running", timeout=5) as r:
        return {row["model"]: row for row in json.loads(r.read())["running"]}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie counts as gone
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def wait_for(cond, timeout: float = 10.0) -> bool:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.05)
    return bool(cond())


def test_cold_start_holds_then_serves(local: LocalStack) -> None:
    local.start(f"""
        models:
          - name: m
            command: {stub_cmd("--start-delay", "0.5")}
            health_path: /health
    """)
    assert running(local)["m"]["state"] == "stopped"
    listed = {m.id: m for m in client(local).models.list()}
    assert list(listed) == ["m"] and listed["m"].model_extra["ready"] is False  # type: ignore[index]
    t0 = time.monotonic()
    out = client(local).chat.completions.create(model="m", messages=MSG)  # type: ignore[arg-type]
    assert out.choices[0].message.content == "hello from stub"
    assert time.monotonic() - t0 >= 0.5
    row = running(local)["m"]
    assert row["state"] == "ready" and alive(row["pid"]) and row["load_seconds"] >= 0.5
    # a streaming request to the now-warm model, token by token
    stream = client(local).chat.completions.create(model="m", messages=MSG, stream=True,  # type: ignore[arg-type]
                                                   extra_headers={"x-stub-chunks": "3"})
    assert [c.choices[0].delta.content for c in stream if c.choices] == ["", "tok0 ", "tok1 ", "tok2 ", None]
    text = fetch(local.url + "/metrics").decode()
    assert 'flexinfer_proxy_activations_total{model="m",result="success"} 1.0' in text
    assert "flexinfer_proxy_queue_wait_seconds_bucket" in text


async def _raw_chat(port: int, model: str, stream: bool = False) -> tuple[int, bytes]:
    r, w = await asyncio.open_connection("127.0.0.1", port)
    body = json.dumps({"model": model, "messages": MSG, "stream": stream}).encode()
    w.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\n"
            b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    data = await r.read()
    w.close()
    return int(data.split(b" ", 2)[1]), data


def test_queue_bound_101st_is_refused(local: LocalStack) -> None:
    local.start(f"""
        models:
          - name: m
            command: {stub_cmd("--start-delay", "2")}
    """)

    async def burst() -> list[tuple[int, bytes]]:
        return await asyncio.gather(*(_raw_chat(local.port, "m") for _ in range(101)))

    t0 = time.monotonic()
    results = asyncio.run(burst())
    codes = sorted(c for c, _ in results)
    assert codes.count(200) == 100 and codes.count(503) == 1, codes
    refused = next(d for c, d in results if c == 503)
    assert json.loads(refused.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "queue_full"
    assert b"retry-after: 2" in refused.lower()
    assert time.monotonic() - t0 >= 2


def test_activation_deadline_is_504(local: LocalStack) -> None:
    local.start(f"""
        models:
          - name: m
            command: {stub_cmd("--start-delay", "5")}
            cold_start_timeout: 0.5
    """, fast_local_settings(queue_timeout=0.5))
    t0 = time.monotonic()
    with pytest.raises(openai.APIStatusError) as ei:
        client(local).chat.completions.create(model="m", messages=MSG)  # type: ignore[arg-type]
    assert ei.value.status_code == 504 and ei.value.code == "timeout"
    assert "did not become ready within 0.5s" in ei.value.message
    assert 0.4 < time.monotonic() - t0 < 3.0


def test_crash_during_start_then_later_request_succeeds(local: LocalStack, tmp_path: Path) -> None:
    marker = tmp_path / "started-once"
    local.start(f"""
        models:
          - name: m
            command: {stub_cmd("--fail-once", str(marker))}
    """)
    with pytest.raises(openai.APIStatusError) as ei:
        client(local).chat.completions.create(model="m", messages=MSG)  # type: ignore[arg-type]
    assert ei.value.status_code == 503 and ei.value.code == "activation_failed"
    assert "exited with code 1" in ei.value.message and "failing on purpose" in ei.value.message
    assert running(local)["m"]["state"] == "failed"
    out = client(local).chat.completions.create(model="m", messages=MSG)  # type: ignore[arg-type]
    assert out.choices[0].message.content == "hello from stub"


def test_idle_ttl_unloads(local: LocalStack) -> None:
    local.start(f"""
        models:
          - name: m
            command: {stub_cmd()}
            idle_ttl: 0.5
    """)
    client(local).chat.completions.create(model="m", messages=MSG)  # type: ignore[arg-type]
    pid = running(local)["m"]["pid"]
    assert alive(pid)
    assert wait_for(lambda: not alive(pid), 5)
    # the process can be gone a moment before the runtime has reaped it and published "stopped"
    assert wait_for(lambda: running(local)["m"]["state"] == "stopped", 5), running(local)["m"]
    # and it comes back on demand
    client(local).chat.completions.create(model="m", messages=MSG)  # type: ignore[arg-type]
    assert running(local)["m"]["state"] == "ready"


def test_crash_while_running_restarts(local: LocalStack) -> None:
    local.start(f"""
        models:
          - name: m
            command: {stub_cmd()}
    """)
    local.call(lambda: setattr(local.runtime, "restart_backoff", (0.1, 1.0)))
    client(local).chat.completions.create(model="m", messages=MSG)  # type: ignore[arg-type]
    pid = running(local)["m"]["pid"]
    os.kill(pid, 9)
    assert wait_for(lambda: running(local)["m"]["restarts"] == 1 and running(local)["m"]["state"] == "ready", 10)
    assert running(local)["m"]["pid"] != pid
    client(local).chat.completions.create(model="m", messages=MSG)  # type: ignore[arg-type]


GROUP = f"""
    models:
      - name: a
        command: {stub_cmd()}
        group: gpu0
        priority: 100
      - name: b
        command: {stub_cmd()}
        group: gpu0
        priority: PRIO
"""


def test_group_swaps_on_demand_without_thrashing(local: LocalStack) -> None:
    w = Windows(demand=0.6, recent=1.2, min_cooldown=2.5)
    local.start(GROUP.replace("PRIO", "100"), windows=w)
    c = client(local)
    c.chat.completions.create(model="a", messages=MSG)  # type: ignore[arg-type]
    assert running(local)["a"]["state"] == "ready"
    t0 = time.monotonic()
    c.chat.completions.create(model="b", messages=MSG)  # type: ignore[arg-type]  # waits for a to go idle
    waited_b = time.monotonic() - t0
    rows = running(local)
    assert rows["b"]["state"] == "ready" and rows["a"]["state"] == "stopped"
    assert waited_b >= 0.5  # a kept the GPU while it was in demand
    t1 = time.monotonic()
    c.chat.completions.create(model="a", messages=MSG)  # type: ignore[arg-type]  # a was preempted: cooldown
    assert time.monotonic() - t1 >= 2.0  # not before the swap cooldown
    rows = running(local)
    assert rows["a"]["state"] == "ready" and rows["b"]["state"] == "stopped"


def test_swap_lets_in_flight_stream_finish(local: LocalStack) -> None:
    w = Windows(demand=5, recent=10, min_cooldown=0.5)
    local.start(GROUP.replace("PRIO", "500"), windows=w)  # b outranks a: demand preempts it
    c = client(local)
    c.chat.completions.create(model="a", messages=MSG)  # type: ignore[arg-type]

    def long_stream() -> list[str | None]:
        s = c.chat.completions.create(model="a", messages=MSG, stream=True,  # type: ignore[arg-type]
                                      extra_headers={"x-stub-chunks": "15", "x-stub-interval": "0.1"})
        return [ch.choices[0].delta.content for ch in s if ch.choices]

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        fut = pool.submit(long_stream)
        time.sleep(0.3)
        out_b = pool.submit(lambda: c.chat.completions.create(model="b", messages=MSG))  # type: ignore[arg-type]
        deltas = fut.result(30)
        assert out_b.result(30).choices[0].message.content == "hello from stub"
    assert len(deltas) == 17 and deltas[-1] is None  # role + 15 tokens + finish: complete
    rows = running(local)
    assert rows["b"]["state"] == "ready" and rows["a"]["state"] == "stopped"


def test_client_disconnect_while_queued_frees_the_slot(local: LocalStack) -> None:
    local.start(f"""
        models:
          - name: m
            command: {stub_cmd("--start-delay", "1.5")}
    """)
    with socket.create_connection(("127.0.0.1", local.port)) as s:
        body = json.dumps({"model": "m", "messages": MSG}).encode()
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        assert wait_for(lambda: running(local)["m"]["queue_depth"] == 1, 2)
    assert wait_for(lambda: running(local)["m"]["queue_depth"] == 0, 1)
    out = client(local).chat.completions.create(model="m", messages=MSG)  # type: ignore[arg-type]
    assert out.choices[0].message.content == "hello from stub"


def test_streaming_waiter_gets_sse_comments_then_tokens(local: LocalStack) -> None:
    local.start(f"""
        models:
          - name: m
            command: {stub_cmd("--start-delay", "1.2")}
    """)
    code, data = asyncio.run(_raw_chat(local.port, "m", stream=True))
    assert code == 200
    text = data.decode()
    assert ": waiting for model m, position 1, ~?s" in text
    assert text.index(": waiting") < text.index("data: {")
    assert "data: [DONE]" in text
    # and the openai client sees a normal stream for a request that waited (comments are ignored)
    local.run(local.runtime.stop("m"))  # type: ignore[union-attr]
    stream = client(local).chat.completions.create(model="m", messages=MSG, stream=True)  # type: ignore[arg-type]
    assert len([c for c in stream]) == 34


def test_admin_endpoints(local: LocalStack) -> None:
    local.start(f"""
        models:
          - name: m
            command: {stub_cmd()}
    """)
    client(local).chat.completions.create(model="m", messages=MSG)  # type: ignore[arg-type]
    logs = fetch(local.url + "/logs/m").decode()
    assert "[flexinfer] starting m" in logs and "stub engine on" in logs
    page = fetch(local.url + "/").decode()
    assert "/ui/status.js" in page  # the status page's shell; its data: tests/runtime/test_status_page.py
    pid = running(local)["m"]["pid"]
    req = urllib.request.Request(local.url + "/unload/m", method="POST", data=b"")
    assert json.loads(fetch(req, timeout=10)) == {"unloaded": ["m"]}
    assert wait_for(lambda: not alive(pid), 5)
    req = urllib.request.Request(local.url + "/unload/nope", method="POST", data=b"")
    with pytest.raises(urllib.error.HTTPError) as ei:
        urllib.request.urlopen(req, timeout=5)
    ei.value.close()
    assert ei.value.code == 404
