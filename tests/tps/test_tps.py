"""bench runner: timing against a fake OpenAI streaming server, iteration/duration rules, outputs,
the non-stream path, readiness, errors, and the ConfigMap writer (pure retry logic and the emulator)."""

from __future__ import annotations

import asyncio
import csv
import hashlib
import importlib.util
import io
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from flexinfer import labels, tps
from flexinfer.cli import main
from flexinfer.settings import SettingsError
from flexinfer.tps import BenchConfig, BenchError, BenchResult, Sample
from flexinfer.tps import publish as tps_publish
from flexinfer.tps.client import request_body
from flexinfer.tps.config import HTTPStatusError
from flexinfer.tps.publish import Conflict
from flexinfer.tps.report import CSV_FIELDS

# ---- a fake OpenAI server ------------------------------------------------------------------------


@dataclass
class FakeOpenAI:
    """asyncio HTTP/1.1 server on 127.0.0.1 answering /v1/chat/completions with N SSE chunks.

    The first content chunk comes ``ttft`` seconds after the request, then one chunk every ``delay``
    seconds. ``usage``: send a final usage chunk (stream) with this completion_tokens, or the usage of a
    non-stream answer. ``fail_first``: answer the first K chat requests with ``fail_status``.
    """

    chunks: int = 10
    delay: float = 0.02
    ttft: float = 0.03
    usage: int | None = None
    fail_first: int = 0
    fail_status: int = 503
    models: list[dict[str, Any]] = field(default_factory=lambda: [{"id": "fake", "object": "model"}])
    error_mid_stream: bool = False
    bodies: list[dict[str, Any]] = field(default_factory=list)
    headers_seen: list[dict[str, str]] = field(default_factory=list)
    sent: list[tuple[float, float, float]] = field(default_factory=list)  # (received, first, last chunk)
    port: int = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode().split("\r\n")
            _method, path, _ = lines[0].split(" ", 2)
            headers = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:] if ":" in ln)}
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            t_recv = time.perf_counter()
            if path.endswith("/models"):
                await self._json(writer, 200, {"object": "list", "data": self.models})
                return
            req = json.loads(body)
            self.bodies.append(req)
            self.headers_seen.append(headers)
            if self.fail_first > 0:
                self.fail_first -= 1
                await self._json(writer, self.fail_status, {"error": {"message": "model is loading",
                                                                     "type": "server_error", "code": None}})
                return
            if not req.get("stream"):
                await asyncio.sleep(self.ttft + self.delay * (self.chunks - 1))
                out: dict[str, Any] = {"object": "chat.completion", "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": "x " * self.chunks},
                     "finish_reason": "length"}]}
                if self.usage is not None:
                    out["usage"] = {"prompt_tokens": 12, "completion_tokens": self.usage,
                                    "total_tokens": 12 + self.usage}
                await self._json(writer, 200, out)
                return
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
                         b"transfer-encoding: chunked\r\nconnection: close\r\n\r\n")
            await self._event(writer, {"choices": [{"index": 0, "delta": {"role": "assistant"}}]})
            sent: list[float] = []
            for i in range(self.chunks):  # on an absolute schedule: late wake-ups do not accumulate
                await asyncio.sleep(max(0.0, t_recv + self.ttft + i * self.delay - time.perf_counter()))
                if self.error_mid_stream and i == self.chunks // 2:
                    await self._event(writer, {"error": {"message": "engine crashed", "type": "server_error"}})
                    break
                await self._event(writer, {"choices": [{"index": 0, "delta": {"content": f"t{i} "}}]})
                sent.append(time.perf_counter())
            self.sent.append((t_recv, sent[0], sent[-1]))
            await self._event(writer, {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
            if self.usage is not None and (req.get("stream_options") or {}).get("include_usage"):
                await self._event(writer, {"choices": [], "usage": {"completion_tokens": self.usage}})
            self._chunk(writer, b"data: [DONE]\n\n")
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    @staticmethod
    def _chunk(writer: asyncio.StreamWriter, data: bytes) -> None:
        writer.write(b"%x\r\n%s\r\n" % (len(data), data))

    async def _event(self, writer: asyncio.StreamWriter, obj: dict[str, Any]) -> None:
        self._chunk(writer, b"data: " + json.dumps(obj).encode() + b"\n\n")
        await writer.drain()

    @staticmethod
    async def _json(writer: asyncio.StreamWriter, status: int, obj: Any) -> None:
        body = json.dumps(obj).encode()
        writer.write(b"HTTP/1.1 %d X\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
                     b"connection: close\r\n\r\n%s" % (status, len(body), body))
        await writer.drain()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def chat_requests(self) -> int:
        return len(self.bodies)


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    srv = FakeOpenAI()
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    server = asyncio.run_coroutine_threadsafe(asyncio.start_server(srv.handle, "127.0.0.1", 0), loop).result(5)
    srv.port = server.sockets[0].getsockname()[1]
    yield srv

    async def stop() -> None:
        server.close()
        await server.wait_closed()

    asyncio.run_coroutine_threadsafe(stop(), loop).result(5)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()


def bench_cfg(fake: FakeOpenAI, **kw: Any) -> BenchConfig:
    base: dict[str, Any] = {"base_url": fake.base_url, "model": "fake", "warmup": 0, "iterations": 3,
                            "min_duration": 0.0}
    base.update(kw)
    return tps.load_config({}, **base)


# ---- timing --------------------------------------------------------------------------------------


def server_rate(fake: FakeOpenAI, tokens_per_chunk: float = 1.0) -> float:
    """tokens/s as the server actually sent them (first to last content chunk)."""
    decode = sum(last - first for _, first, last in fake.sent)
    return sum(tokens_per_chunk * (fake.chunks - 1) for _ in fake.sent) / decode


def test_stream_tokens_per_second_and_ttft(fake: FakeOpenAI) -> None:
    fake.chunks, fake.delay, fake.ttft = 11, 0.02, 0.06
    res = tps.run_bench(bench_cfg(fake, backend="x"))
    assert res.iterations == 3 and fake.chat_requests == 3 and len(fake.sent) == 3
    # 11 chunks, 10 intervals of 20 ms: 50 tokens/s as scheduled; compare with what the server really
    # did (robust on a loaded machine) and loosely with the schedule
    assert res.tokens_per_second == pytest.approx(server_rate(fake), rel=0.12)
    assert 30 <= res.tokens_per_second <= 62, res.tokens_per_second
    for s, (recv, first, last) in zip(res.samples, fake.sent, strict=True):
        assert s.tokens == 11 and s.chunks == 11 and not s.usage
        assert s.decode_seconds is not None and s.decode_seconds == pytest.approx(last - first, abs=0.025)
        assert s.ttft is not None and first - recv - 0.002 <= s.ttft <= first - recv + 0.05
        assert s.latency >= s.ttft + s.decode_seconds
    assert res.ttft_p50 is not None and 0.058 <= res.ttft_p50 <= 0.2
    assert res.completion_tokens == 33
    assert res.e2e_tokens_per_second < res.tokens_per_second


def test_usage_chunk_counts_tokens(fake: FakeOpenAI) -> None:
    fake.chunks, fake.delay, fake.usage = 6, 0.02, 12  # 2 tokens per chunk
    res = tps.run_bench(bench_cfg(fake))
    assert all(s.tokens == 12 and s.usage for s in res.samples)
    assert fake.bodies[0]["stream_options"] == {"include_usage": True}
    # 12 tokens over 6 chunks, 5 intervals of 20 ms: 10 tokens in 0.1 s = 100 tokens/s
    assert res.tokens_per_second == pytest.approx(server_rate(fake, 2.0), rel=0.15)
    assert 60 <= res.tokens_per_second <= 125, res.tokens_per_second


def test_non_stream_uses_usage_and_wall_time(fake: FakeOpenAI) -> None:
    fake.chunks, fake.delay, fake.ttft, fake.usage = 6, 0.02, 0.1, 40  # ~0.2 s per request
    res = tps.run_bench(bench_cfg(fake, stream=False))
    assert fake.bodies[0]["stream"] is False and "stream_options" not in fake.bodies[0]
    assert all(s.tokens == 40 and s.ttft is None and s.decode_seconds is None for s in res.samples)
    assert 150 <= res.tokens_per_second <= 205, res.tokens_per_second  # 40 / 0.2 s
    assert res.ttft_p50 is None


def test_non_stream_without_usage_is_an_error(fake: FakeOpenAI) -> None:
    with pytest.raises(BenchError, match=r"usage\.completion_tokens"):
        tps.run_bench(bench_cfg(fake, stream=False))


def test_request_body_and_auth(fake: FakeOpenAI) -> None:
    tps.run_bench(bench_cfg(fake, iterations=1, api_key="sekret", max_tokens=64, prompt="hi"))
    body = fake.bodies[0]
    assert body["model"] == "fake" and body["max_tokens"] == 64 and body["stream"] is True
    assert body["messages"] == [{"role": "user", "content": "hi"}]
    assert fake.headers_seen[0]["authorization"] == "Bearer sekret"


def test_default_prompt_and_max_tokens() -> None:
    cfg = tps.load_config({"MODEL_NAME": "m"})
    body = json.loads(request_body(cfg, "m"))
    assert body["messages"][0]["content"] == "Write a long story about a space adventure to Mars."
    assert body["max_tokens"] == 128
    assert (cfg.warmup, cfg.iterations, cfg.min_duration) == (2, 5, 30.0)


# ---- iteration and duration rules ------------------------------------------------------------------


def test_iterations_and_warmup(fake: FakeOpenAI) -> None:
    fake.chunks, fake.delay = 3, 0.001
    res = tps.run_bench(bench_cfg(fake, warmup=2, iterations=4))
    assert res.iterations == 4 and fake.chat_requests == 6


def test_min_duration_extends_iterations(fake: FakeOpenAI) -> None:
    fake.chunks, fake.delay, fake.ttft = 5, 0.02, 0.01  # ~0.09 s per request
    res = tps.run_bench(bench_cfg(fake, iterations=2, min_duration=0.5))
    assert res.duration_seconds >= 0.5
    assert res.iterations >= 4
    assert res.duration_seconds >= sum(s.latency for s in res.samples) * 0.99


def test_readiness_wait_retries_503(fake: FakeOpenAI) -> None:
    fake.fail_first = 2
    res = tps.run_bench(replace_cfg(bench_cfg(fake, warmup=1, iterations=2), ready_poll=0.01))
    assert res.iterations == 2 and fake.chat_requests == 5  # 2 refused + 1 warm-up + 2 measured


def test_readiness_timeout(fake: FakeOpenAI) -> None:
    fake.fail_first = 100
    cfg = replace_cfg(bench_cfg(fake, warmup=1, ready_timeout=0.05), ready_poll=0.02)
    with pytest.raises(BenchError, match=r"not ready after 0.05 s: HTTP 503: model is loading"):
        tps.run_bench(cfg)


def test_non_retryable_status_fails_at_once(fake: FakeOpenAI) -> None:
    fake.fail_first, fake.fail_status = 5, 401
    with pytest.raises(HTTPStatusError, match="HTTP 401"):
        tps.run_bench(bench_cfg(fake, warmup=1))
    assert fake.chat_requests == 1


def replace_cfg(cfg: BenchConfig, **kw: Any) -> BenchConfig:
    import dataclasses

    return dataclasses.replace(cfg, **kw)


# ---- model discovery ---------------------------------------------------------------------------------


def test_model_and_backend_discovered(fake: FakeOpenAI) -> None:
    fake.models = [{"id": "smol", "object": "model", "metadata": {"backend": "llamacpp"}}]
    res = tps.run_bench(bench_cfg(fake, model="", iterations=1))
    assert res.model == "smol" and res.backend == "llamacpp" and fake.bodies[0]["model"] == "smol"


def test_model_required_when_ambiguous(fake: FakeOpenAI) -> None:
    fake.models = [{"id": "a"}, {"id": "b"}]
    with pytest.raises(BenchError, match="lists 2 models: a, b"):
        tps.run_bench(bench_cfg(fake, model=""))


# ---- config ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("env", "flags", "url"), [
    ({}, {}, "http://flexinfer-proxy.flexinfer-system.svc.cluster.local:80/v1"),
    ({"BENCHMARK_PROXY_NAMESPACE": "ops"}, {}, "http://flexinfer-proxy.ops.svc.cluster.local:80/v1"),
    ({"BENCHMARK_PROXY_URL": "http://b:8080"}, {}, "http://b:8080/v1"),
    ({"BENCHMARK_PROXY_URL": "http://b:8080", "PROXY_URL": "http://a/"}, {}, "http://a/v1"),
    ({"PROXY_URL": "http://a/v1"}, {}, "http://a/v1"),
    ({"PROXY_URL": "http://a"}, {"base_url": "https://api.example/v1/"}, "https://api.example/v1"),
])
def test_base_url_precedence(env: dict[str, str], flags: dict[str, Any], url: str) -> None:
    assert tps.load_config(env, **flags).base_url == url


def test_env_names() -> None:
    cfg = tps.load_config({"MODEL_NAME": "m", "POD_NAMESPACE": "ns", "NODE_NAME": "n1",
                           "BENCHMARK_RESULTS_CONFIGMAP": "g", "OPENAI_API_KEY": "k"}, namespace=None)
    assert (cfg.model, cfg.namespace, cfg.node_name, cfg.global_configmap, cfg.bearer) == ("m", "ns", "n1", "g", "k")
    assert tps.load_config({"MODEL_NAME": "m"}, model="flag").model == "flag"


@pytest.mark.parametrize("flags", [{"iterations": 0}, {"warmup": -1}, {"min_duration": -1.0},
                                   {"base_url": "ftp://x"}, {"max_tokens": 0}])
def test_config_errors(flags: dict[str, Any]) -> None:
    with pytest.raises(SettingsError):
        tps.load_config({}, **flags)


def test_percentile() -> None:
    vals = [float(v) for v in range(1, 101)]
    assert tps.percentile(vals, 50) == pytest.approx(50.5)
    assert tps.percentile(vals, 90) == pytest.approx(90.1)
    assert tps.percentile(vals, 99) == pytest.approx(99.01)
    assert tps.percentile([3.0], 99) == 3.0


def test_sample_rate_formula() -> None:
    s = Sample(tokens=128, chunks=128, latency=2.0, ttft=0.1, decode_seconds=1.27)
    assert s.decode_tokens == 127 and s.tokens_per_second == pytest.approx(100.0)
    one = Sample(tokens=1, chunks=1, latency=0.5, ttft=0.4)
    assert one.tokens_per_second == pytest.approx(2.0)  # no decode window: tokens / wall time


# ---- the command --------------------------------------------------------------------------------------


def test_cli_json(fake: FakeOpenAI, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["bench", "--base-url", fake.base_url, "--model", "fake", "--warmup", "1", "--iterations", "3",
               "--min-duration", "0", "--json"])
    assert rc == 0
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert doc["model"] == "fake" and doc["iterations"] == 3 and doc["warmup"] == 1
    assert set(doc["latency_seconds"]) == {"p50", "p90", "p99"}
    assert doc["tokens_per_second"] > 0 and doc["ttft_p50_seconds"] > 0 and len(doc["samples"]) == 3
    assert "tokens/s" in err  # the text summary moves to stderr when stdout carries JSON
    assert "bench [" in err  # progress


def test_cli_csv_and_json_files(fake: FakeOpenAI, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["bench", "--base-url", fake.base_url, "--model", "fake", "--warmup", "0", "--iterations", "2",
               "--min-duration", "0", "--csv", str(tmp_path / "r.csv"), "--json", str(tmp_path / "r.json"),
               "--no-progress"])
    assert rc == 0
    rows = list(csv.DictReader(io.StringIO((tmp_path / "r.csv").read_text())))
    assert [r["iteration"] for r in rows] == ["1", "2"]
    assert tuple(rows[0]) == CSV_FIELDS and float(rows[0]["tokens_per_second"]) > 0
    assert json.loads((tmp_path / "r.json").read_text())["iterations"] == 2
    out, err = capsys.readouterr()
    assert "TTFT p50" in out and err == ""


def test_cli_csv_stdout(fake: FakeOpenAI, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--base-url", fake.base_url, "--model", "fake", "--warmup", "0", "--iterations", "2",
                 "--min-duration", "0", "--csv", "--no-stream", "--no-progress"]) == 1  # no usage: error
    fake.usage = 10
    assert main(["bench", "--base-url", fake.base_url, "--model", "fake", "--warmup", "0", "--iterations", "2",
                 "--min-duration", "0", "--csv", "--no-stream", "--no-progress"]) == 0
    out = capsys.readouterr().out
    rows = list(csv.DictReader(io.StringIO(out)))
    assert len(rows) == 2 and rows[0]["ttft_seconds"] == "" and rows[0]["tokens"] == "10"


@pytest.mark.parametrize(("setup", "needle"), [
    ({"fail_first": 9, "fail_status": 500}, "HTTP 500: model is loading"),
    ({"error_mid_stream": True}, "error in stream: engine crashed"),
])
def test_cli_errors_one_line(fake: FakeOpenAI, capsys: pytest.CaptureFixture[str], setup: dict[str, Any],
                             needle: str) -> None:
    for k, v in setup.items():
        setattr(fake, k, v)
    assert main(["bench", "--base-url", fake.base_url, "--model", "fake", "--warmup", "0",
                 "--min-duration", "0", "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_cli_connection_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--base-url", "http://127.0.0.1:9/v1", "--model", "m", "--ready-timeout", "0",
                 "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "cannot connect to 127.0.0.1:9" in err and len(err.strip().splitlines()) == 1


def test_cli_plot_without_matplotlib(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    assert main(["bench", "--base-url", "http://127.0.0.1:9/v1", "--model", "m", "--plot", "x.png"]) == 1
    assert "pip install matplotlib" in capsys.readouterr().err


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="matplotlib not installed")
def test_cli_plot(fake: FakeOpenAI, tmp_path: Path) -> None:
    out = tmp_path / "bench.png"
    assert main(["bench", "--base-url", fake.base_url, "--model", "fake", "--warmup", "0", "--iterations", "4",
                 "--min-duration", "0", "--plot", str(out), "--no-progress"]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---- ConfigMaps: pure logic with an injected API ------------------------------------------------------


def a_result(**kw: Any) -> BenchResult:
    samples = (Sample(10, 10, 1.0, 0.1, 0.9), Sample(10, 10, 1.2, 0.1, 0.9))
    base: dict[str, Any] = {"model": "smol", "base_url": "http://x/v1", "stream": True, "warmup": 2, "samples": samples,
            "duration_seconds": 2.2, "backend": "llamacpp", "timestamp": "2026-01-01T00:00:00Z"}
    base.update(kw)
    return BenchResult(**base)


@dataclass
class FakeAPI:
    """In-memory ConfigMaps; ``conflicts`` makes the next N writes fail with 409 after a concurrent change."""

    maps: dict[tuple[str, str], tuple[dict[str, str], int]] = field(default_factory=dict)
    conflicts: int = 0
    calls: list[str] = field(default_factory=list)

    async def read(self, namespace: str, name: str) -> tuple[dict[str, str], str] | None:
        self.calls.append("read")
        cur = self.maps.get((namespace, name))
        return None if cur is None else (dict(cur[0]), str(cur[1]))

    def _interfere(self, namespace: str, name: str) -> None:
        self.conflicts -= 1
        data, rv = self.maps.get((namespace, name), ({}, 0))
        self.maps[(namespace, name)] = ({**data, f"other{self.conflicts}": "x"}, rv + 1)
        raise Conflict("changed")

    async def create(self, namespace: str, name: str, data: dict[str, str]) -> None:
        self.calls.append("create")
        if self.conflicts:
            self._interfere(namespace, name)
        if (namespace, name) in self.maps:
            raise Conflict("exists")
        self.maps[(namespace, name)] = (dict(data), 1)

    async def update(self, namespace: str, name: str, data: dict[str, str], resource_version: str) -> None:
        self.calls.append("update")
        if self.conflicts:
            self._interfere(namespace, name)
        cur = self.maps[(namespace, name)]
        if str(cur[1]) != resource_version:
            raise Conflict("stale")
        self.maps[(namespace, name)] = (dict(data), cur[1] + 1)


async def test_upsert_creates_then_merges() -> None:
    api = FakeAPI()
    assert await tps_publish.upsert_configmap(api, "ns", "g", {"a": "1"}) == 1
    api.maps[("ns", "g")] = ({"a": "1", "keep": "k"}, 5)
    assert await tps_publish.upsert_configmap(api, "ns", "g", {"a": "2"}) == 1
    assert api.maps[("ns", "g")][0] == {"a": "2", "keep": "k"}


async def test_upsert_retries_conflicts_and_keeps_concurrent_keys() -> None:
    api = FakeAPI(maps={("ns", "g"): ({"x": "1"}, 1)}, conflicts=2)
    assert await tps_publish.upsert_configmap(api, "ns", "g", {"bench_1": "9"}) == 3
    data = api.maps[("ns", "g")][0]
    assert data == {"x": "1", "other1": "x", "other0": "x", "bench_1": "9"}
    assert api.calls == ["read", "update"] * 3


async def test_upsert_create_race_then_update() -> None:
    api = FakeAPI(conflicts=1)
    assert await tps_publish.upsert_configmap(api, "ns", "g", {"k": "v"}) == 2
    assert api.calls == ["read", "create", "read", "update"]
    assert api.maps[("ns", "g")][0] == {"other0": "x", "k": "v"}


async def test_upsert_gives_up_after_three_conflicts() -> None:
    api = FakeAPI(maps={("ns", "g"): ({}, 1)}, conflicts=3)
    with pytest.raises(BenchError, match="conflict on each of 3 attempts"):
        await tps_publish.upsert_configmap(api, "ns", "g", {"k": "v"})


async def test_publish_writes_both_configmaps() -> None:
    api = FakeAPI()
    node = {"flexinfer.ai/gpu.vendor": "NVIDIA", "flexinfer.ai/gpu.arch": "sm_86", "flexinfer.ai/gpu.vram": "24Gi",
            "flexinfer.ai/gpu.count": "1", "flexinfer.ai/gpu.int4": "true", "other": "x"}
    cfg = tps.load_config({}, configmap="smol-benchmark-results", namespace="ns")
    res = a_result()
    entries = await tps_publish.publish(res, cfg, api, node_labels=node)
    dc = "vendor=NVIDIA,arch=sm_86,vram=24Gi,count=1,int4=true"
    h = hashlib.sha256(f"llamacpp|smol|{dc}".encode()).hexdigest()[:16]
    assert set(entries) == {f"bench_{h}", f"meta_{h}"}
    glob = api.maps[("ns", "flexinfer-benchmark-results")][0]
    assert glob[f"bench_{h}"] == f"{res.tokens_per_second:.2f}"
    meta = json.loads(glob[f"meta_{h}"])
    assert meta["deviceClass"] == dc and meta["model"] == "smol" and meta["backend"] == "llamacpp"
    per = api.maps[("ns", "smol-benchmark-results")][0]
    assert set(per) == {"tokensPerSecond", "model", "backend", "iterations", "batchSize", "completionTokens",
                        "durationSeconds", "samples", "timestamp"}
    assert per["iterations"] == "2" and per["completionTokens"] == "20" and per["model"] == "smol"
    assert json.loads(per["samples"]) == [round(s.tokens_per_second, 2) for s in res.samples]


def test_bench_keys() -> None:
    dc = labels.device_class("AMD", "gfx1100", "24Gi", 1, True)
    assert dc == "vendor=AMD,arch=gfx1100,vram=24Gi,count=1,int4=true"
    assert labels.device_class_from_labels({"flexinfer.ai/gpu.vendor": "AMD", "flexinfer.ai/gpu.arch": "gfx1100",
                                              "flexinfer.ai/gpu.vram": "24Gi", "flexinfer.ai/gpu.count": "1",
                                              "flexinfer.ai/gpu.int4": "true"}) == dc
    assert labels.device_class_from_labels({"x.io/gpu.vendor": "AMD"}, prefix="x.io/").startswith("vendor=AMD,")
    h = labels.bench_hash("vllm", "llama3", dc)
    assert h == hashlib.sha256(f"vllm|llama3|{dc}".encode()).hexdigest()[:16] and len(h) == 16
    assert labels.bench_key("vllm", "llama3", dc) == "bench_" + h
    assert labels.meta_key("vllm", "llama3", dc) == "meta_" + h
    assert labels.deployment_configmap_name("m") == "m-benchmark-results"
    assert labels.BENCHMARK_CONFIGMAP == "flexinfer-benchmark-results"


# ---- ConfigMaps against the Kubernetes emulator ---------------------------------------------------------

try:
    from tests.kube_emulator import KubeEnv, kube_fixture  # noqa: F401  (the fixture)

    HAVE_KUBE = True
except ImportError:  # pragma: no cover - the emulator needs the kube and test extras
    HAVE_KUBE = False


@pytest.mark.skipif(not HAVE_KUBE, reason="tests/kube_emulator.py (kmock) not available")
async def test_publish_against_emulator_with_conflicts(kube: KubeEnv) -> None:
    kube.seed("v1/configmaps", {"metadata": {"name": "flexinfer-benchmark-results", "namespace": "ns"},
                                "data": {"bench_other": "12.5"}})
    kube.seed("v1/nodes", {"metadata": {"name": "n1", "labels": {
        "flexinfer.ai/gpu.vendor": "NVIDIA", "flexinfer.ai/gpu.arch": "sm_89", "flexinfer.ai/gpu.vram": "24Gi",
        "flexinfer.ai/gpu.count": "2", "flexinfer.ai/gpu.int4": "true"}}})
    kube.inject("PATCH", r"/configmaps/flexinfer-benchmark-results$", status=409, times=2)
    cfg = tps.load_config({}, configmap="smol-benchmark-results", namespace="ns", node_name="n1",
                          kubeconfig=str(kube.kubeconfig_path))
    entries = await tps_publish.publish(a_result(), cfg)
    dc = "vendor=NVIDIA,arch=sm_89,vram=24Gi,count=2,int4=true"
    key = labels.bench_key("llamacpp", "smol", dc)
    glob = kube.get("v1/configmaps", "ns", "flexinfer-benchmark-results")
    assert glob is not None and key in entries
    assert glob["data"]["bench_other"] == "12.5" and glob["data"][key] == entries[key]
    per = kube.get("v1/configmaps", "ns", "smol-benchmark-results")
    assert per is not None and per["data"]["model"] == "smol"
    assert per["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "flexinfer"
    assert kube.write_count("configmaps", "PATCH") == 3  # 2 injected conflicts + the one that landed
    # a second run replaces our keys in place, keeping the others
    await tps_publish.publish(a_result(backend="llamacpp", duration_seconds=9.0), cfg)
    per2 = kube.get("v1/configmaps", "ns", "smol-benchmark-results")
    assert per2 is not None and per2["data"]["durationSeconds"] == "9.00"


@pytest.mark.skipif(not HAVE_KUBE, reason="tests/kube_emulator.py (kmock) not available")
async def test_stale_resource_version_is_a_conflict(kube: KubeEnv) -> None:
    kube.seed("v1/configmaps", {"metadata": {"name": "g", "namespace": "ns"}, "data": {"a": "1"}})
    async with kube.api_client() as client:
        from kubernetes_asyncio.client import CoreV1Api

        api = tps_publish.KubeConfigMaps(CoreV1Api(client))
        got = await api.read("ns", "g")
        assert got is not None and got[0] == {"a": "1"}
        await api.update("ns", "g", {"a": "2"}, got[1])
        with pytest.raises(Conflict):
            await api.update("ns", "g", {"a": "3"}, got[1])  # stale now
        with pytest.raises(Conflict):
            await api.create("ns", "g", {"a": "4"})
        assert await api.read("ns", "missing") is None
