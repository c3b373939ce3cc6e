"""OpenTelemetry tracing (flexinfer.proxy.tracing, docs/tracing.md): a real proxy over real sockets,
the official openai client, the stub engine recording the headers it got, and real SDK spans (an
InMemorySpanExporter; one test with the real OTLP/HTTP exporter posting to a receiver here)."""

from __future__ import annotations

import asyncio
import http.server
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from flexinfer import errors
from flexinfer.runtime.base import ModelView
from flexinfer.settings import SettingsError, load_proxy_settings
from tests.harness import reach
from tests.proxy import _procs
from tests.proxy.conftest import Stack, fast_settings, model

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
TRACESTATE = "vendor=abc,other=1"
ROOT = Path(__file__).resolve().parents[2]


def client(stack: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.base_url, api_key="k", max_retries=0)


def chat(stack: Stack, name: str = "m1", headers: dict[str, str] | None = None, **kw: Any) -> Any:
    with client(stack) as c:
        return c.chat.completions.create(model=name, messages=[{"role": "user", "content": "hi"}],
                                         extra_headers=headers, **kw)


def ids(traceparent: str) -> tuple[int, int, bool]:
    """(trace id, parent span id, sampled) of a W3C traceparent (flags may also carry the random bit)."""
    version, trace_id, span_id, flags = traceparent.split("-")
    assert version == "00"
    return int(trace_id, 16), int(span_id, 16), bool(int(flags, 16) & 1)


# -- tracing off -------------------------------------------------------------------------------------
def test_off_traceparent_and_tracestate_pass_unchanged(proxy: Stack) -> None:
    assert proxy.handler.tracer is None and proxy.handler.forwarder.tracer is None
    chat(proxy, headers={"traceparent": TRACEPARENT, "tracestate": TRACESTATE})
    got = proxy.stub.requests[-1].raw_headers
    assert [v for k, v in got if k == b"traceparent"] == [TRACEPARENT.encode()]
    assert [v for k, v in got if k == b"tracestate"] == [TRACESTATE.encode()]


_NO_IMPORT = r"""
import sys, urllib.request
from flexinfer.http.server import HTTPServer
from flexinfer.proxy.pipeline import ProxyHandler
from flexinfer.runtime.static import StaticInventory
from flexinfer.settings import load_proxy_settings
from tests.harness import LoopThread
from tests.proxy.conftest import model
from tests.stub_engine import StubEngine

assert not [m for m in sys.modules if m.startswith("opentelemetry")], "imported before the proxy ran"
lt = LoopThread()
stub = lt.run(StubEngine().start())
settings = load_proxy_settings(env={})
async def start():
    lt.handler = ProxyHandler(StaticInventory([model("m", stub)]), settings)
    lt.server = HTTPServer(lt.handler, settings.http, host="127.0.0.1", port=0)
    await lt.server.start()
lt.run(start())
req = urllib.request.Request(lt.url + "/v1/chat/completions", data=b'{"model":"m","messages":[]}',
                             headers={"content-type": "application/json", "traceparent": sys.argv[1]})
with urllib.request.urlopen(req) as r:
    assert r.status == 200, r.status
got = dict(stub.requests[-1].headers)
lt.run(stub.stop())
lt.close()
print(sorted(m for m in sys.modules if m.startswith("opentelemetry")), got["traceparent"])
"""


def test_off_imports_no_opentelemetry() -> None:
    """A request through a proxy with tracing off (the default) loads no opentelemetry module."""
    out = subprocess.run([sys.executable, "-c", _NO_IMPORT, TRACEPARENT], cwd=ROOT, env=_procs.env(),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["[]", TRACEPARENT]


def test_on_without_the_extra_is_refused_at_startup(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)  # what find_spec sees when absent
    with pytest.raises(SettingsError, match=r"needs the otel extra .*flexinfer\[otel\]"):
        load_proxy_settings(env={"PROXY_TRACING_ENABLED": "true"})
    assert load_proxy_settings(env={}).tracing_enabled is False  # off by default: nothing checked


# -- tracing on, in-memory spans ---------------------------------------------------------------------
class Traced:
    def __init__(self, stack: Stack) -> None:
        pytest.importorskip("opentelemetry.sdk")
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        from flexinfer.proxy.tracing import Tracer

        self.stack = stack
        self.exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = Tracer(provider)

    def start(self, views: list[ModelView], **kw: Any) -> None:
        self.stack.start_proxy(views, fast_settings(), tracer=self.tracer, **kw)

    def spans(self, n: int) -> dict[str, Any]:
        """The finished spans of the one request, by name (once its ``n`` spans have ended)."""
        self.stack.run(reach(lambda: len(self.exporter.get_finished_spans()) >= n))
        spans = self.exporter.get_finished_spans()
        assert len(spans) == n, [s.name for s in spans]
        self.exporter.clear()
        return {s.name: s for s in spans}

    def close(self) -> None:
        self.tracer.shutdown()


@pytest.fixture
def traced(stack: Stack) -> Iterator[Traced]:
    t = Traced(stack)
    yield t
    t.close()


def test_spans_child_of_the_client_and_traceparent_upstream(stack: Stack, traced: Traced) -> None:
    from opentelemetry.trace import SpanKind, StatusCode

    traced.start([model("m1", stack.stub)])
    chat(stack, headers={"traceparent": TRACEPARENT, "tracestate": TRACESTATE})
    s = traced.spans(3)
    req, route, up = s["POST /v1/chat/completions"], s["flexinfer.route"], s["flexinfer.upstream"]
    assert req.kind == SpanKind.SERVER and up.kind == SpanKind.CLIENT
    # the client's trace is kept; the request span is the child of the client's span
    assert {format(x.context.trace_id, "032x") for x in (req, route, up)} == {CLIENT_TRACE}
    assert req.parent is not None and format(req.parent.span_id, "016x") == CLIENT_SPAN and req.parent.is_remote
    assert route.parent.span_id == req.context.span_id and up.parent.span_id == req.context.span_id
    assert req.start_time <= route.start_time <= route.end_time <= up.start_time <= up.end_time <= req.end_time
    # the engine got a traceparent naming the proxy's upstream span, and the client's tracestate
    got = stack.stub.requests[-1].raw_headers
    tp = [v.decode() for k, v in got if k == b"traceparent"]
    assert tp == [f"00-{CLIENT_TRACE}-{up.context.span_id:016x}-01"]
    assert [v for k, v in got if k == b"tracestate"] == [TRACESTATE.encode()]
    endpoint = f"127.0.0.1:{stack.stub.port}"
    assert req.attributes["http.response.status_code"] == 200 and req.attributes["flexinfer.model"] == "m1"
    assert req.attributes["flexinfer.stream"] is False and req.attributes["http.request.method"] == "POST"
    assert req.attributes["flexinfer.request_id"] == stack.stub.requests[-1].headers["x-request-id"]
    assert route.attributes["flexinfer.endpoint"] == endpoint and route.attributes["flexinfer.model"] == "m1"
    assert route.attributes["flexinfer.route.strategy"]
    assert up.attributes["flexinfer.endpoint"] == endpoint and up.attributes["server.port"] == stack.stub.port
    assert up.attributes["http.response.status_code"] == 200 and up.attributes["flexinfer.attempt"] == 1
    assert all(x.status.status_code == StatusCode.UNSET for x in (req, route, up))


def test_stream_without_client_context_starts_a_trace(stack: Stack, traced: Traced) -> None:
    traced.start([model("m1", stack.stub)])
    with client(stack) as c:
        chunks = list(c.chat.completions.create(model="m1", messages=[{"role": "user", "content": "hi"}],
                                                stream=True))
    assert len(chunks) > 3
    s = traced.spans(3)
    req, up = s["POST /v1/chat/completions"], s["flexinfer.upstream"]
    assert req.parent is None  # no traceparent from the client: the proxy's span is the root
    assert req.attributes["flexinfer.stream"] is True and up.attributes["flexinfer.stream"] is True
    assert ids(stack.stub.requests[-1].headers["traceparent"]) == (req.context.trace_id, up.context.span_id, True)
    assert up.end_time <= req.end_time  # the upstream span covers the whole relayed body


def test_retry_after_a_refused_connection_has_two_attempts(stack: Stack, traced: Traced) -> None:
    from opentelemetry.trace import StatusCode

    from tests.harness import free_port

    dead = free_port()  # nothing listens: the connection is refused, the proxy retries on the stub
    traced.start([model("m1", dead, stack.stub, routing="round-robin")])
    for _ in range(2):  # round robin: one of the two requests picks the dead endpoint first
        chat(stack, headers={"traceparent": TRACEPARENT})
        stack.run(reach(lambda: any(x.kind.name == "SERVER" for x in traced.exporter.get_finished_spans())))
        spans = traced.exporter.get_finished_spans()
        traced.exporter.clear()
        ups = sorted((x for x in spans if x.name == "flexinfer.upstream"), key=lambda x: x.start_time)
        if len(ups) == 2:
            break
    else:
        pytest.fail("no request tried the dead endpoint first")
    assert [x.attributes["flexinfer.endpoint"] for x in ups] == [f"127.0.0.1:{dead}", f"127.0.0.1:{stack.stub.port}"]
    assert ups[0].attributes["error.type"] == "connect_error" and ups[0].status.status_code == StatusCode.ERROR
    assert ups[1].attributes["flexinfer.attempt"] == 2 and "error.type" not in ups[1].attributes
    assert len([x for x in spans if x.name == "flexinfer.route"]) == 2
    assert stack.stub.requests[-1].headers["traceparent"] == f"00-{CLIENT_TRACE}-{ups[1].context.span_id:016x}-01"


def test_upstream_failure_marks_the_spans(stack: Stack, traced: Traced) -> None:
    from opentelemetry.trace import StatusCode

    from tests.harness import free_port

    traced.start([model("m1", free_port())])
    with pytest.raises(openai.APIStatusError) as ei:
        chat(stack)
    assert ei.value.status_code == 503
    s = traced.spans(3)
    req, up = s["POST /v1/chat/completions"], s["flexinfer.upstream"]
    assert req.attributes["http.response.status_code"] == 503
    assert req.attributes["error.type"] == "upstream_unavailable" and req.status.status_code == StatusCode.ERROR
    assert up.attributes["error.type"] == "upstream_unavailable" and up.status.status_code == StatusCode.ERROR
    assert "http.response.status_code" not in up.attributes


def test_engine_error_status_is_recorded(stack: Stack, traced: Traced) -> None:
    traced.start([model("m1", stack.stub)])
    with pytest.raises(openai.BadRequestError):
        chat(stack, headers={"x-stub-mode": "status:400"})
    s = traced.spans(3)
    assert s["POST /v1/chat/completions"].attributes["http.response.status_code"] == 400
    assert s["flexinfer.upstream"].attributes["http.response.status_code"] == 400


class WakeLater:
    """A Scaler whose wake puts the stub in the inventory once the test says so."""

    def __init__(self, stack: Stack, ready: ModelView) -> None:
        self.stack, self.ready, self.woken = stack, ready, asyncio.Event()

    async def wake(self, view: ModelView) -> None:
        self.woken.set()

    def record_demand(self, view: ModelView) -> None:
        pass


def test_queued_request_has_a_queue_wait_span(stack: Stack, traced: Traced) -> None:
    scaler = WakeLater(stack, model("m1", stack.stub))
    traced.start([ModelView(name="m1", endpoints=(), ready=False)], scaler=scaler)
    done: list[Any] = []
    t = threading.Thread(target=lambda: done.append(chat(stack, headers={"traceparent": TRACEPARENT})))
    t.start()
    stack.run(asyncio.wait_for(scaler.woken.wait(), 10))
    stack.run(reach(lambda: stack.handler.activator.queue_depth("m1") == 1))
    assert stack.inventory is not None
    stack.call(lambda: stack.inventory.update(scaler.ready))  # type: ignore[union-attr]
    t.join(30)
    assert done and done[0].choices[0].message.content
    s = traced.spans(4)
    req, wait = s["POST /v1/chat/completions"], s["flexinfer.queue_wait"]
    assert wait.parent.span_id == req.context.span_id and wait.context.trace_id == int(CLIENT_TRACE, 16)
    assert wait.attributes["flexinfer.model"] == "m1" and wait.attributes["flexinfer.queue.position"] == 1
    assert wait.attributes["flexinfer.queue.outcome"] == "ready"
    assert wait.end_time <= s["flexinfer.route"].start_time


def test_queue_full_is_an_error_on_the_queue_span(stack: Stack, traced: Traced) -> None:
    from opentelemetry.trace import StatusCode

    scaler = WakeLater(stack, model("m1", stack.stub))
    s0 = fast_settings(max_queue_size=0)
    stack.start_proxy([ModelView(name="m1", endpoints=(), ready=False)], s0, tracer=traced.tracer, scaler=scaler)
    with pytest.raises(openai.APIStatusError) as ei:
        chat(stack)
    assert ei.value.status_code == errors.QueueFull.status
    s = traced.spans(2)
    wait = s["flexinfer.queue_wait"]
    assert wait.attributes["error.type"] == "queue_full" and wait.status.status_code == StatusCode.ERROR
    assert s["POST /v1/chat/completions"].attributes["http.response.status_code"] == 503


def test_control_endpoints_are_not_traced(stack: Stack, traced: Traced) -> None:
    traced.start([model("m1", stack.stub)])
    with client(stack) as c:
        assert [m.id for m in c.models.list()] == ["m1"]
    chat(stack)
    names = [x.name for x in traced.spans(3).values()]
    assert "GET /v1/models" not in names


# -- the real OTLP/HTTP exporter -----------------------------------------------------------------------
class _Receiver(http.server.BaseHTTPRequestHandler):
    bodies: list[tuple[str, str, bytes]]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["content-length"]))
        self.bodies.append((self.path, self.headers["content-type"], body))
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.mark.parametrize("workers,delay_ms", [(1, "50"), (2, "600000")], ids=["batch", "flush-at-stop"])
def test_otlp_http_export_from_a_real_proxy_process(tmp_path: Path, workers: int, delay_ms: str) -> None:
    """The real exporter posts protobuf to /v1/traces: every 50 ms while serving, or (a batch delay of
    10 minutes, 2 forked workers) only when the proxy stops: the stop exports what is buffered."""
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http")
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    bodies: list[tuple[str, str, bytes]] = []
    handler = type("Receiver", (_Receiver,), {"bodies": bodies})
    recv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    th = threading.Thread(target=recv.serve_forever, daemon=True)
    th.start()
    spans: dict[str, Any] = {}
    resource: dict[str, str] = {}
    seen: list[str] = []

    def exported() -> bool:
        for path, ctype, body in bodies[len(seen):]:
            seen.append(path)
            assert path == "/v1/traces" and ctype == "application/x-protobuf"
            msg = ExportTraceServiceRequest.FromString(body)
            for rs in msg.resource_spans:
                resource.update({a.key: a.value.string_value for a in rs.resource.attributes})
                for ss in rs.scope_spans:
                    spans.update({sp.name: sp for sp in ss.spans})
        return len(spans) >= 3

    try:
        with _procs.stub_engines(1) as engines:
            inv = _procs.inventory(tmp_path, engines)
            with _procs.proxy(inv, workers=workers, PROXY_TRACING_ENABLED="true",
                              OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{recv.server_port}",
                              OTEL_BSP_SCHEDULE_DELAY=delay_ms, OTEL_SERVICE_NAME="") as port:
                with openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=0) as c:
                    c.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                              extra_headers={"traceparent": TRACEPARENT})
                if workers == 1:
                    asyncio.run(reach(exported, timeout=15))
                else:
                    assert not exported()  # buffered: the batch delay is 10 minutes
            # the proxy has stopped (exit 0 checked by _procs.proxy)
            assert exported()
    finally:
        recv.shutdown()
        recv.server_close()
        th.join(5)
    assert resource["service.name"] == "flexinfer-proxy"
    req, up = spans["POST /v1/chat/completions"], spans["flexinfer.upstream"]
    assert req.trace_id.hex() == CLIENT_TRACE and req.parent_span_id.hex() == CLIENT_SPAN
    assert up.parent_span_id == req.span_id and spans["flexinfer.route"].parent_span_id == req.span_id
    attrs = {a.key: a.value for a in req.attributes}
    assert attrs["http.response.status_code"].int_value == 200 and attrs["flexinfer.model"].string_value == "m"
