"""Explaining and inspecting routing through ``flexinfer proxy`` as a process: the opt-in
``X-Flexinfer-Explain`` header, ``flexinfer_proxy_routing_decisions_total``, ``GET /debug/endpoints``
(engine figures, ages, ejections, the latest scores) and the active health check of static endpoints."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from tests.proxy._procs import proxy, request, samples
from tests.proxy.conftest import Stack
from tests.proxy.test_scored import FAST

PAGE = """# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{model_name="m"}} 0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{model_name="m"}} 0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{model_name="m"}} {kv}
"""
CHAT = b'{"model":"m","messages":[{"role":"user","content":"hi"}]}'


def _inventory(tmp: Path, ports: list[int], routing: str, scheduler: str | None = None) -> Path:
    eps = ", ".join(f"http://127.0.0.1:{p}" for p in ports)
    text = f"models:\n  - name: m\n    routing: {routing}\n    endpoints: [{eps}]\n"
    if scheduler is not None:
        text += f"    scheduler: {scheduler!r}\n"
    path = tmp / "inv.yaml"
    path.write_text(text)
    return path


async def _until(cond: object, what: str, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not cond():  # type: ignore[operator]
        assert time.monotonic() < end, what
        await asyncio.sleep(0.05)


def test_explain_header_decision_counter_and_debug_endpoints(tmp_path: Path) -> None:
    stack = Stack()
    try:
        a, b = stack.add_stub(), stack.add_stub()
        a.metrics_text = PAGE.format(kv=0.9)  # nearly full: kv-cache prefers b
        b.metrics_text = PAGE.format(kv=0.1)
        ka, kb = (f"127.0.0.1:{s.port}" for s in (a, b))
        inv = _inventory(tmp_path, [a.port, b.port], "scored", "kv-cache:2,least-request:1;filters=least-request")
        with proxy(inv, PROXY_ROUTE_EXPLAIN="request", **FAST) as port:

            async def scenario() -> None:
                await _until(lambda: a.metrics_hits >= 2 and b.metrics_hits >= 2, "never scraped")
                status, headers, _ = await request(port, "POST", "/v1/chat/completions", CHAT)
                assert status == 200 and "x-flexinfer-explain" not in headers  # not asked for
                status, headers, _ = await request(port, "POST", "/v1/chat/completions", CHAT,
                                                   {"X-Flexinfer-Explain": "1"})
                assert status == 200
                explain = headers["x-flexinfer-explain"]
                assert explain.startswith(f"pick={kb}; reason=best total ")
                # both candidates with their per-plugin scores, the chosen one first
                assert explain.index(f"{kb} t=") < explain.index(f"{ka} t=")
                assert f"{kb} t=280.0 kv-cache=90 least-request=100" in explain, explain
                assert f"{ka} t=120.0 kv-cache=10 least-request=100" in explain, explain
                for _ in range(3):
                    assert (await request(port, "POST", "/v1/chat/completions", CHAT))[0] == 200
                _, _, text = await request(port, "GET", "/metrics")
                got = samples(text.decode())
                key = ("flexinfer_proxy_routing_decisions_total",
                       (("key_source", "best"), ("model", "m"), ("strategy", "scored")))
                assert got[key] == 5.0
                status, headers, body = await request(port, "GET", "/debug/endpoints")
                assert status == 200 and headers["content-type"] == "application/json"
                doc = json.loads(body)
                (m,) = doc["models"]
                assert m["routing"] == "scored" and m["scheduler_error"] is None
                assert m["last_pick"]["key"] == kb and m["last_pick"]["reason"].startswith("best total")
                eps = {e["key"]: e for e in m["endpoints"]}
                assert set(eps) == {ka, kb}
                assert eps[ka]["engine"]["kv_usage"] == 0.9 and eps[kb]["engine"]["kv_usage"] == 0.1
                for e in eps.values():
                    eng = e["engine"]
                    assert eng["engine"] == "vllm" and eng["fresh"] is True and eng["error"] is None
                    assert 0.0 <= eng["age_s"] <= 0.5  # PROXY_ENGINE_METRICS_MAX_AGE
                    assert e["ejection"]["ejected"] is False and e["in_flight"] == 0
                assert eps[kb]["last_scores"] == {"kv-cache": 90.0, "least-request": 100.0}
                assert eps[kb]["last_total"] == 280.0
                # an engine whose page fails: its figures are shown as stale, with the error
                a.metrics_status = 500
                hits = a.metrics_hits
                await _until(lambda: a.metrics_hits >= hits + 8, "no failing scrapes")  # > max age
                doc = json.loads((await request(port, "GET", "/debug/endpoints"))[2])
                eng = {e["key"]: e for e in doc["models"][0]["endpoints"]}[ka]["engine"]
                assert eng["error"] == "http_status" and eng["fresh"] is False

            asyncio.run(scenario())
    finally:
        stack.close()


def test_explain_always_and_off(tmp_path: Path) -> None:
    stack = Stack()
    try:
        a, b = stack.add_stub(), stack.add_stub()
        inv = _inventory(tmp_path, [a.port, b.port], "least-loaded")
        with proxy(inv, PROXY_ROUTE_EXPLAIN="always") as port:
            status, headers, _ = asyncio.run(request(port, "POST", "/v1/chat/completions", CHAT))
            assert status == 200 and headers["x-flexinfer-explain"].startswith("pick=127.0.0.1:")
            assert "reason=least-loaded (in-flight)" in headers["x-flexinfer-explain"]
        with proxy(inv, PROXY_DEBUG_ENDPOINTS="false") as port:  # explain is off by default
            status, headers, _ = asyncio.run(request(port, "POST", "/v1/chat/completions", CHAT,
                                                     {"X-Flexinfer-Explain": "1"}))
            assert status == 200 and "x-flexinfer-explain" not in headers
            status, _, body = asyncio.run(request(port, "GET", "/debug/endpoints"))
            assert status == 404 and json.loads(body)["error"]["type"] == "not_found_error"
    finally:
        stack.close()


def test_debug_endpoints_is_behind_the_api_keys(tmp_path: Path) -> None:
    stack = Stack()
    try:
        a = stack.add_stub()
        inv = _inventory(tmp_path, [a.port], "default")
        with proxy(inv, PROXY_AUTH_ENABLED="true", PROXY_AUTH_TOKEN="sekret") as port:
            status, _, body = asyncio.run(request(port, "GET", "/debug/endpoints"))
            assert status == 401 and json.loads(body)["error"]["code"] is not None
            status, _, body = asyncio.run(request(port, "GET", "/debug/endpoints",
                                                  headers={"Authorization": "Bearer sekret"}))
            assert status == 200 and json.loads(body)["models"][0]["endpoints"][0]["engine"] is None
    finally:
        stack.close()


def test_active_health_check_ejects_a_sick_static_endpoint_and_readmits_it(tmp_path: Path) -> None:
    stack = Stack()
    try:
        a, b = stack.add_stub(), stack.add_stub()
        ka = f"127.0.0.1:{a.port}"
        inv = _inventory(tmp_path, [a.port, b.port], "round-robin")
        a.health_status = 503
        settings = {"PROXY_HEALTH_CHECK_INTERVAL": "0.1", "PROXY_HEALTH_CHECK_TIMEOUT": "0.1",
                    "PROXY_EJECT_CONSECUTIVE": "3"}
        with proxy(inv, **settings) as port:

            async def scenario() -> None:
                await _until(lambda: a.health_hits >= 4, "a was never checked")
                def chats() -> int:
                    return sum(c.path.startswith("/v1/chat") for c in a.requests)

                served = chats()
                for _ in range(10):  # no request had to fail: the check alone took a out
                    status, headers, _ = await request(port, "POST", "/v1/chat/completions", CHAT)
                    assert status == 200 and not headers["x-flexinfer-route"].endswith(ka)
                assert chats() == served
                doc = json.loads((await request(port, "GET", "/debug/endpoints"))[2])
                ej = {e["key"]: e for e in doc["models"][0]["endpoints"]}[ka]["ejection"]
                assert ej["ejected"] is True and ej["last_error"] == "5xx"
                a.health_status = 200
                hits = a.health_hits
                await _until(lambda: a.health_hits >= hits + 2, "a was not checked again")
                routes = [(await request(port, "POST", "/v1/chat/completions", CHAT))[1]["x-flexinfer-route"]
                          for _ in range(4)]
                assert sum(r.endswith(ka) for r in routes) == 2, routes  # back in the rotation

            asyncio.run(scenario())
    finally:
        stack.close()
