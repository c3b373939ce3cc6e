"""Prefill/decode disaggregation through the real proxy with the real ``openai`` client, against
test engines that play vLLM's prefill and decode roles and check what they receive
(:mod:`tests.proxy.disagg_engine`); and the ``role`` of endpoints in the config files."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from flexinfer.runtime.base import Endpoint, ModelView
from flexinfer.runtime.kuberemote import view_from_dict, view_to_dict
from flexinfer.runtime.localconfig import load_local_config
from flexinfer.runtime.static import InventoryConfigError, load_static
from flexinfer.settings import with_changes
from tests.harness import free_port
from tests.proxy._procs import proxy
from tests.proxy.conftest import Stack, fast_settings
from tests.proxy.disagg_engine import DisaggEngine

MSGS = [{"role": "user", "content": "tell me a story"}]


class Disagg(Stack):
    """The proxy with model ``m``: prefill engines, decode engines (added by the tests)."""

    def engine(self, role: str) -> DisaggEngine:
        prefills = [s for s in self.stubs if isinstance(s, DisaggEngine) and s.role == "prefill"]
        eng = self.run(DisaggEngine(role, prefills).start())
        self.stubs.append(eng)
        return eng

    def serve(self, prefill: list[DisaggEngine | int], decode: list[DisaggEngine | int],
              routing: str = "default", response_timeout: float = 5.0) -> openai.OpenAI:
        eps = [Endpoint("127.0.0.1", e if isinstance(e, int) else e.port, "prefill") for e in prefill]
        eps += [Endpoint("127.0.0.1", e if isinstance(e, int) else e.port, "decode") for e in decode]
        settings = fast_settings()
        settings = with_changes(settings, upstream=with_changes(settings.upstream, response_timeout=response_timeout))
        self.start_proxy([ModelView("m", tuple(eps), served_name="served-m", routing=routing)], settings)
        return openai.OpenAI(base_url=self.base_url, api_key="k", max_retries=0)

    def in_flight(self) -> dict[str, int]:
        return self.call(lambda: self.handler.router.in_flight)

    def counted(self, stage: str, outcome: str) -> float:
        c = self.handler.metrics.disagg_requests.labels("m", stage, outcome)
        return float(c.value)


@pytest.fixture
def st() -> Iterator[Disagg]:
    s = Disagg()
    try:
        yield s
    finally:
        s.close()


def _clean(*engines: DisaggEngine) -> None:
    for e in engines:
        assert e.problems == [], (e.role, e.problems)


def test_chat_goes_through_prefill_then_decode(st: Disagg) -> None:
    p = st.engine("prefill")
    d = st.engine("decode")
    c = st.serve([p], [d])
    r = c.chat.completions.with_raw_response.create(model="m", messages=MSGS, max_tokens=50, temperature=0.3)  # type: ignore[arg-type]
    out = r.parse()
    assert out.choices[0].message.content == "hello from stub"  # the decode engine's answer
    _clean(p, d)
    [pre], [dec] = p.generations(), d.generations()
    assert pre["max_tokens"] == 1 and pre["stream"] is False and pre["model"] == "served-m"
    assert pre["kv_transfer_params"]["do_remote_decode"] is True
    # the decode engine got the client's request untouched, plus what the prefill answered
    assert dec == {"model": "served-m", "messages": MSGS, "max_tokens": 50, "temperature": 0.3,
                   "kv_transfer_params": p.issued[0]}
    # one request id for both steps; the route names both replicas
    assert p.requests[-1].headers["x-request-id"] == d.requests[-1].headers["x-request-id"] == out._request_id
    assert r.headers["x-flexinfer-route"].endswith(f";127.0.0.1:{d.port}")
    assert r.headers["x-flexinfer-prefill"] == f"127.0.0.1:{p.port}"
    assert st.counted("prefill", "ok") == 1 and st.counted("decode", "ok") == 1
    assert st.in_flight() == {}


def test_streaming_chat_and_completions(st: Disagg) -> None:
    p = st.engine("prefill")
    d = st.engine("decode")
    c = st.serve([p], [d])
    stream = c.chat.completions.create(model="m", messages=MSGS, stream=True, max_completion_tokens=7,  # type: ignore[arg-type]
                                       stream_options={"include_usage": True}, extra_headers={"x-stub-chunks": "3"})
    deltas = [ch.choices[0].delta.content for ch in stream if ch.choices]
    assert deltas == ["", "tok0 ", "tok1 ", "tok2 ", None]
    assert c.completions.create(model="m", prompt="once upon").choices[0].text == "hello from stub"
    _clean(p, d)
    (pre, pre2), (dec, dec2) = p.generations(), d.generations()
    assert pre["stream"] is False and "stream_options" not in pre
    assert pre["max_tokens"] == 1 and pre["max_completion_tokens"] == 1
    assert dec["stream"] is True and dec["stream_options"] == {"include_usage": True}
    assert dec["max_completion_tokens"] == 7 and "max_tokens" not in dec
    assert dec2 == {"model": "served-m", "prompt": "once upon", "kv_transfer_params": p.issued[1]}
    assert pre2["prompt"] == "once upon" and pre2["max_tokens"] == 1
    assert st.in_flight() == {}


def test_requests_spread_over_decode_and_prefill_replicas(st: Disagg) -> None:
    p1, p2 = st.engine("prefill"), st.engine("prefill")
    d1, d2 = st.engine("decode"), st.engine("decode")
    c = st.serve([p1, p2], [d1, d2], routing="round-robin")
    for _ in range(4):
        c.chat.completions.create(model="m", messages=MSGS)
    _clean(p1, p2, d1, d2)
    assert [len(e.generations()) for e in (p1, p2, d1, d2)] == [2, 2, 2, 2]
    assert st.in_flight() == {}


def test_other_requests_go_to_a_decode_replica_as_they_are(st: Disagg) -> None:
    p = st.engine("prefill")
    d = st.engine("decode")
    c = st.serve([p], [d])
    assert c.embeddings.create(model="m", input="x").data[0].embedding == [0.1, 0.2, 0.3]
    assert p.requests == [] and json.loads(d.requests[-1].body) == {"model": "served-m", "input": "x",
                                                                      "encoding_format": "base64"}


def _error(exc: openai.APIStatusError) -> dict[str, Any]:
    body = exc.response.json()
    assert set(body) == {"error"}
    return body["error"]  # type: ignore[no-any-return]


def test_prefill_down_is_an_openai_error_and_decode_is_never_called(st: Disagg) -> None:
    d = st.engine("decode")
    c = st.serve([free_port()], [d])
    with pytest.raises(openai.InternalServerError) as ei:
        c.chat.completions.create(model="m", messages=MSGS)
    assert ei.value.status_code == 503
    err = _error(ei.value)
    assert err["code"] == "prefill_failed" and "decode step was not run" in err["message"]
    assert d.requests == []
    assert st.counted("prefill", "error") == 1
    assert st.in_flight() == {}


@pytest.mark.parametrize(("fault", "status"), [("status:500", 502), ("status:503", 502), ("not-json", 502),
                                               ("no-kv", 502), ("reset", 502)])
def test_a_failing_prefill_is_an_error_and_decode_is_never_called(st: Disagg, fault: str, status: int) -> None:
    p = st.engine("prefill")
    d = st.engine("decode")
    p.fault = fault
    c = st.serve([p], [d])
    for stream in (False, True):
        with pytest.raises(openai.APIStatusError) as ei:
            c.chat.completions.create(model="m", messages=MSGS, stream=stream)
        assert ei.value.status_code == status
        assert _error(ei.value)["code"] == "prefill_failed"
    assert len(p.requests) == 2  # once per client request: never sent twice
    assert d.requests == []
    assert st.in_flight() == {}


def test_a_prefill_without_an_answer_in_time_is_504_and_decode_is_never_called(st: Disagg) -> None:
    p = st.engine("prefill")
    d = st.engine("decode")
    p.fault = "delay:2"
    c = st.serve([p], [d], response_timeout=0.2)
    with pytest.raises(openai.InternalServerError) as ei:
        c.chat.completions.create(model="m", messages=MSGS)
    assert ei.value.status_code == 504 and _error(ei.value)["code"] == "prefill_failed"
    assert len(p.requests) == 1 and d.requests == []
    assert st.in_flight() == {}


def test_a_decode_without_an_answer_in_time_is_504_and_prefill_ran_once(st: Disagg) -> None:
    p = st.engine("prefill")
    d = st.engine("decode")
    d.fault = "delay:2"
    c = st.serve([p], [d], response_timeout=0.2)
    with pytest.raises(openai.InternalServerError) as ei:
        c.chat.completions.create(model="m", messages=MSGS)
    assert ei.value.status_code == 504 and _error(ei.value)["code"] == "upstream_timeout"
    assert len(p.requests) == 1 and len(d.requests) == 1
    assert st.in_flight() == {}


def test_a_prefill_refusing_the_request_answers_the_client_with_its_error(st: Disagg) -> None:
    p = st.engine("prefill")
    d = st.engine("decode")
    p.fault = "status:400"
    c = st.serve([p], [d])
    with pytest.raises(openai.BadRequestError) as ei:
        c.chat.completions.create(model="m", messages=MSGS)
    assert _error(ei.value)["code"] == "stub_400"  # the engine's own error object
    assert len(p.requests) == 1 and d.requests == []
    assert st.in_flight() == {}


@pytest.mark.parametrize(("fault", "status", "code"), [("status:500", 500, "stub_500"),
                                                       ("reset", 502, "upstream_error")])
def test_a_failing_decode_is_an_error_and_prefill_ran_once(st: Disagg, fault: str, status: int, code: str) -> None:
    p = st.engine("prefill")
    d = st.engine("decode")
    d.fault = fault
    c = st.serve([p], [d])
    with pytest.raises(openai.APIStatusError) as ei:
        c.chat.completions.create(model="m", messages=MSGS)
    assert ei.value.status_code == status and _error(ei.value)["code"] == code
    assert len(p.requests) == 1 and len(d.requests) == 1
    assert st.in_flight() == {}


def test_a_decode_stream_dying_midway_is_an_sse_error_and_prefill_ran_once(st: Disagg) -> None:
    p = st.engine("prefill")
    d = st.engine("decode")
    c = st.serve([p], [d])
    stream = c.chat.completions.create(model="m", messages=MSGS, stream=True,  # the prefill engine ignores x-stub-*
                                       extra_headers={"x-stub-fail-after": "3"})
    got: list[str | None] = []
    with pytest.raises(openai.APIError, match="mid-stream"):
        for ch in stream:
            got.append(ch.choices[0].delta.content)
    assert got == ["", "tok0 ", "tok1 "]
    assert len(p.requests) == 1 and len(d.requests) == 1
    assert st.in_flight() == {}


def test_a_refused_decode_replica_moves_on_without_a_second_prefill(st: Disagg) -> None:
    p = st.engine("prefill")
    d = st.engine("decode")
    c = st.serve([p], [free_port(), d], routing="round-robin")
    for _ in range(2):  # round-robin starts on each decode replica once
        assert c.chat.completions.create(model="m", messages=MSGS).choices[0].message.content == "hello from stub"
    _clean(p, d)
    assert len(p.requests) == 2 and len(d.requests) == 2  # one prefill per client request
    assert st.in_flight() == {}


def test_no_decode_replica_is_503_before_any_prefill(st: Disagg) -> None:
    p = st.engine("prefill")
    c = st.serve([p], [])
    with pytest.raises(openai.InternalServerError) as ei:
        c.chat.completions.create(model="m", messages=MSGS)
    assert ei.value.status_code == 503 and _error(ei.value)["code"] == "no_decode_replica"
    assert p.requests == []


def test_the_metric_is_exported(st: Disagg) -> None:
    p = st.engine("prefill")
    d = st.engine("decode")
    c = st.serve([p], [d])
    c.chat.completions.create(model="m", messages=MSGS)
    text = st.call(lambda: st.handler.metrics.render()).decode()
    assert 'flexinfer_proxy_disagg_requests_total{model="m",outcome="ok",stage="prefill"} 1.0' in text


def test_flexinfer_proxy_serves_a_static_inventory_with_roles(st: Disagg, tmp_path: Path) -> None:
    p = st.engine("prefill")
    d = st.engine("decode")
    inv = _write(tmp_path, f"""models:
  - name: m
    routing: least-loaded
    endpoints:
      - {{url: "http://127.0.0.1:{p.port}", role: prefill}}
      - {{url: "http://127.0.0.1:{d.port}", role: decode}}
""")
    with proxy(Path(inv), workers=2) as port:
        c = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=0)
        for _ in range(3):
            assert c.chat.completions.create(model="m", messages=MSGS).choices[0].message.content == "hello from stub"
    _clean(p, d)
    assert len(p.generations()) == 3 and len(d.generations()) == 3
    assert [g["kv_transfer_params"] for g in d.generations()] == p.issued


# ---- the model: roles, and what is disaggregated ------------------------------------------------------


def test_roles_and_the_disaggregated_flag() -> None:
    assert Endpoint("h", 1).role == "both" and Endpoint.parse("http://h:1", "decode").role == "decode"
    assert Endpoint("h", 1, "prefill").key == "h:1"
    with pytest.raises(ValueError, match="role"):
        Endpoint("h", 1, "prefil")
    assert not ModelView("m", (Endpoint("h", 1), Endpoint("h", 2))).disaggregated
    v = ModelView("m", (Endpoint("h", 1, "prefill"), Endpoint("h", 2)))
    assert v.disaggregated and not ModelView("m").disaggregated
    back = view_from_dict(json.loads(json.dumps(view_to_dict(v))))  # the owner -> worker inventory codec
    assert back == v and back.disaggregated and [e.role for e in back.endpoints] == ["prefill", "both"]
    assert view_to_dict(v)["endpoints"][1] == ["h", 2]  # role "both": the old two-element form


def _write(tmp: Path, text: str) -> str:
    path = tmp / "inv.yaml"
    path.write_text(text)
    return str(path)


def test_static_config_with_roles(tmp_path: Path) -> None:
    [v] = load_static(_write(tmp_path, """models:
  - name: big
    endpoints:
      - {url: "http://10.0.0.1:8000", role: prefill}
      - {url: "http://10.0.0.2:8000", role: decode}
      - http://10.0.0.3:8000
      - {url: "10.0.0.4:8000"}
"""))
    assert [(e.key, e.role) for e in v.endpoints] == [("10.0.0.1:8000", "prefill"), ("10.0.0.2:8000", "decode"),
                                                      ("10.0.0.3:8000", "both"), ("10.0.0.4:8000", "both")]
    assert v.disaggregated
    [plain] = load_static(_write(tmp_path, "models:\n  - name: p\n    endpoints: [http://h:1, http://h:2]\n"))
    assert not plain.disaggregated


@pytest.mark.parametrize(("endpoints", "message"), [
    ('[{url: "http://h:1", role: prefil}, "http://h:2"]', r"inv.yaml:3: models\[0\]\.endpoints\[0\]\.role: must be one of prefill, decode, both, not 'prefil'; did you mean 'prefill'"),
    ('[{url: "http://h:1", role: 3}]', r"inv.yaml:3: models\[0\]\.endpoints\[0\]\.role: Expected str, got int 3"),
    ('[{url: "http://h:1", weight: 2}]', r"inv.yaml:3: models\[0\]\.endpoints\[0\]\.weight: unknown key 'weight' \(known: url, role, ca_file, insecure_skip_verify, api_key\)"),
    ('[{role: decode}]', r"models\[0\]\.endpoints\[0\]: missing required key 'url'"),
    ('[{url: "http://h:1", role: prefill}]', r"models\[0\]\.endpoints: a disaggregated model needs"),
    ('[{url: "http://h:1", role: decode}, {url: "http://h:2", role: decode}]', r"models\[0\]\.endpoints: a disagg"),
    ('[{url: "ftp://h:1", role: decode}]', r"models\[0\]\.endpoints\[0\]: unsupported endpoint scheme"),
    ("7", r"models\[0\]\.endpoints: Expected str \| object \| array \| null, got int 7"),
])
def test_static_config_bad_roles_name_the_model(tmp_path: Path, endpoints: str, message: str) -> None:
    with pytest.raises(InventoryConfigError, match=message):
        load_static(_write(tmp_path, f"models:\n  - name: big\n    endpoints: {endpoints}\n"))


def test_local_config_refuses_disaggregation(tmp_path: Path) -> None:
    base = "models:\n  - name: loc\n    command: [x, '${PORT}']\n"
    assert load_local_config(_write(tmp_path, base))[0].name == "loc"
    for extra in ("    role: prefill\n", "    endpoints: [http://h:1]\n"):
        with pytest.raises(InventoryConfigError, match=r"inv.yaml:4: models\[0\]\.(role|endpoints): the local runtime"):
            load_local_config(_write(tmp_path, base + extra))
