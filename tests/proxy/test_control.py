"""Health, readiness, metrics and the model list."""

from __future__ import annotations

import json
import urllib.request

import openai

from tests.proxy.conftest import Stack


def get(url: str) -> tuple[int, dict[str, str], bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def test_health_ready_metrics(proxy: Stack) -> None:
    assert get(proxy.url + "/healthz")[0] == 200
    assert get(proxy.url + "/readyz")[0] == 200
    c = openai.OpenAI(base_url=proxy.base_url, api_key="k", max_retries=0)
    c.chat.completions.create(model="m1", messages=[{"role": "user", "content": "x"}])
    status, headers, body = get(proxy.url + "/metrics")
    assert status == 200 and headers.get("Content-Type", headers.get("content-type", "")).startswith("text/plain")
    text = body.decode()
    assert 'flexinfer_proxy_requests_total{code="200",model="m1"} 1.0' in text
    for name in ("flexinfer_proxy_request_duration_seconds_bucket", "flexinfer_proxy_time_to_first_byte_seconds",
                 "flexinfer_proxy_active_connections", "flexinfer_proxy_upstream_errors_total",
                 "flexinfer_proxy_requests_in_flight"):
        assert name in text, name


def test_models_list_shape(proxy: Stack) -> None:
    status, _, body = get(proxy.url + "/v1/models")
    assert status == 200
    doc = json.loads(body)
    assert doc["object"] == "list"
    m1 = doc["data"][0]
    assert m1["id"] == "m1" and m1["object"] == "model" and m1["aliases"] == ["alias1"]
    assert m1["served_name"] == "served-m1"


def test_control_paths_refuse_other_methods(proxy: Stack) -> None:
    req = urllib.request.Request(proxy.url + "/healthz", method="POST", data=b"")
    try:
        urllib.request.urlopen(req, timeout=5)
        raise AssertionError("expected 405")
    except urllib.error.HTTPError as e:
        assert e.code == 405
        with e:
            assert json.loads(e.read())["error"]["code"] == "method_not_allowed"
