"""The access log of a real ``flexinfer proxy`` process (``PROXY_ACCESS_LOG=1``, ``--log-format json``).

One scenario runs once per module against a stub engine process, with API keys, a rate limit and a
Redis URL with a password (nothing listens there: sharing degrades to local state) configured, and
the real ``openai`` client where a client answers: a JSON answer, a stream, an unknown model (body
and header), a missing key (401), a bad body (400), a client abort mid-stream, log-injection
probes (L1) and a flood into the rate limit (429). The tests then read everything the process wrote.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest

from tests.harness import free_port, wait_port
from tests.proxy._procs import ROOT, env, inventory, request, stub_engines

KEY = "sk-flexinfer-accesslog-0123456789abcdef"
REDIS_PASSWORD = "hunter2-redis-pw-9f8e7d"
CHAT = b'{"model":"m","messages":[{"role":"user","content":"hi"}]}'
STREAM = b'{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}'
ESC = "\x1b[31m"


class Proxy:
    """A ``flexinfer proxy`` process whose merged stdout/stderr is collected line by line."""

    def __init__(self, inv: Path, fmt: str, **settings: str) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "flexinfer.cli", "--log-level", "info", "--log-format", fmt, "proxy", "-c",
             str(inv), "--port", str(self.port)],
            cwd=ROOT, env=env(PROXY_ACCESS_LOG="1", **settings), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.raw: list[bytes] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        wait_port(self.port, timeout=30)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.raw.append(line)

    def access(self, rid: str) -> list[dict[str, Any]]:
        """The access records of request ``rid`` so far (JSON format)."""
        out = []
        for line in list(self.raw):
            try:
                obj = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if obj.get("logger") == "flexinfer.access" and obj.get("request_id") == rid:
                out.append(obj)
        return out

    def wait_for(self, rid: str, timeout: float = 10.0) -> None:
        end = time.monotonic() + timeout
        while not any(rid.encode() in line for line in list(self.raw)):
            assert time.monotonic() < end, f"no access record of {rid}"
            time.sleep(0.02)

    def stop(self) -> bytes:
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(20)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self._reader.join(10)
            if self.proc.stdout is not None:
                self.proc.stdout.close()
        assert rc == 0, f"proxy exited {rc}"
        return b"".join(self.raw)


def _abort_mid_stream(port: int, rid: str) -> None:
    """Start a slow stream, read its first event, and leave."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                  b"Authorization: Bearer %s\r\nX-Request-ID: %s\r\nx-stub-interval: 0.05\r\n"
                  b"x-stub-chunks: 200\r\nContent-Length: %d\r\n\r\n%s"
                  % (KEY.encode(), rid.encode(), len(STREAM), STREAM))
        got = b""
        while b"data:" not in got:
            piece = s.recv(65536)
            assert piece, "the stream ended before its first event"
            got += piece


def _raw(port: int, head: bytes, body: bytes = b"") -> bytes:
    """One request as raw bytes on a fresh connection (``Connection: close``); the raw answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(head + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
        out = b""
        while piece := s.recv(65536):
            out += piece
    return out


def _dechunk(answer: bytes) -> bytes:
    """The body of a chunked HTTP/1.1 answer (head, sizes and CRLFs removed)."""
    head, _, rest = answer.partition(b"\r\n\r\n")
    assert b"transfer-encoding: chunked" in head.lower()
    body = b""
    while True:
        size, _, rest = rest.partition(b"\r\n")
        n = int(size.split(b";")[0], 16)
        if n == 0:
            return body
        body, rest = body + rest[:n], rest[n + 2:]


def _status(port: int, path: str, body: bytes, headers: dict[str, str]) -> int:
    return asyncio.run(request(port, "POST", path, body, headers))[0]


def _auth(rid: str, **more: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEY}", "X-Request-ID": rid, **more}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The scenario, once: what each step saw, the proxy's whole output, and its access records."""
    tmp = tmp_path_factory.mktemp("accesslog")
    seen: dict[str, Any] = {}
    with stub_engines(1) as engines:
        inv = inventory(tmp, engines)
        redis_port = free_port()  # nothing listens there
        px = Proxy(inv, "json", PROXY_AUTH_ENABLED="1", PROXY_AUTH_TOKEN=KEY, PROXY_RATE_LIMIT_ENABLED="1",
                   PROXY_RATE_LIMIT_PER_MODEL="0.01", PROXY_RATE_LIMIT_BURST="9",
                   PROXY_REDIS_URL=f"redis://:{REDIS_PASSWORD}@127.0.0.1:{redis_port}/0")
        try:
            client = openai.OpenAI(base_url=f"http://127.0.0.1:{px.port}/v1", api_key=KEY, max_retries=0)
            with client:
                raw = client.chat.completions.with_raw_response.create(
                    model="m", messages=[{"role": "user", "content": "hi"}], extra_headers={"X-Request-ID": "al-json"})
                seen["json_bytes"] = len(raw.http_response.content)
                stream = client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "hi"}], stream=True,
                    extra_headers={"X-Request-ID": "al-stream", "x-stub-chunks": "8"})
                with stream:
                    seen["stream_chunks"] = sum(1 for _ in stream)
            p = px.port
            seen["stream_raw"] = _dechunk(_raw(p, b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer "
                                                  + KEY.encode() + b"\r\nX-Request-ID: al-stream-raw\r\n"
                                                  b"Content-Type: application/json\r\nx-stub-chunks: 5\r\n", STREAM))
            seen["404"] = _status(p, "/v1/chat/completions", b'{"model":"nope","messages":[]}', _auth("al-404"))
            seen["404h"] = _status(p, "/v1/chat/completions", CHAT, _auth("al-404h", **{"X-Model-ID": "nope"}))
            seen["401"] = _status(p, "/v1/chat/completions", CHAT, {"X-Request-ID": "al-401"})
            seen["400"] = _status(p, "/v1/chat/completions", b'{"model": "m", ', _auth("al-400"))
            _abort_mid_stream(p, "al-abort")
            px.wait_for("al-abort")
            # L1: an ANSI escape and CR/LF, percent-encoded in the path, raw in the User-Agent
            seen["l1"] = _raw(p, b"POST /v1/chat/completions%1b[31m%0d%0aforged HTTP/1.1\r\nHost: t\r\n"
                                 b"Authorization: Bearer " + KEY.encode() + b"\r\nX-Request-ID: al-l1\r\n"
                                 b"Content-Type: application/json\r\n", CHAT)
            seen["l1ua"] = _raw(p, b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer "
                                   + KEY.encode() + b"\r\nX-Request-ID: al-l1ua\r\nContent-Type: application/json\r\n"
                                   b"User-Agent: evil\x1b[31m/1.0\r\n", CHAT)
            # a client that puts its key where the access log looks (the User-Agent): redacted
            seen["ua"] = _status(p, "/v1/chat/completions", CHAT, _auth("al-ua", **{"User-Agent": f"probe/1 Bearer {KEY}"}))
            codes = []
            for i in range(20):  # into the rate limit (burst 9 per model)
                codes.append(_status(p, "/v1/chat/completions", CHAT, _auth(f"al-429-{i}")))
                if codes[-1] == 429:
                    break
            seen["429"] = codes
            for rid in ("al-json", "al-stream", "al-stream-raw", "al-404", "al-404h", "al-401", "al-400", "al-l1", "al-ua",
                        f"al-429-{len(codes) - 1}"):
                px.wait_for(rid)
        finally:
            output = px.stop()
    lines = [ln for ln in output.split(b"\n") if ln.strip()]
    records = []
    for ln in lines:
        try:
            records.append(orjson.loads(ln))
        except orjson.JSONDecodeError:
            raise AssertionError(f"not a JSON line: {ln!r}") from None
    yield {"seen": seen, "output": output, "records": records}


def _one(run: dict[str, Any], rid: str) -> dict[str, Any]:
    mine = [r for r in run["records"] if r.get("logger") == "flexinfer.access" and r.get("request_id") == rid]
    assert len(mine) == 1, f"{rid}: {len(mine)} access records"
    return mine[0]


def test_every_line_is_one_json_object(run: dict[str, Any]) -> None:
    assert len(run["records"]) > 10
    for rec in run["records"]:
        assert isinstance(rec, dict) and {"time", "level", "logger", "message"} <= rec.keys(), rec
        assert rec["time"].endswith("Z") and rec["level"] in ("debug", "info", "warning", "error", "critical")


def test_json_answer(run: dict[str, Any]) -> None:
    rec = _one(run, "al-json")
    assert rec["status"] == 200 and rec["model"] == "m" and rec["method"] == "POST"
    assert rec["path"] == "/v1/chat/completions"
    assert rec["bytes_sent"] == run["seen"]["json_bytes"] > 0
    assert rec["client_abort"] is False and rec["user_agent"].startswith("OpenAI/Python")
    assert 0 < rec["duration"] < 10
    for name in ("queue_wait", "ttft"):  # filled by the request path (None until it measures them)
        assert rec[name] is None or 0 <= rec[name] <= rec["duration"]
    for name in ("prompt_tokens", "completion_tokens"):
        assert name in rec and (rec[name] is None or rec[name] >= 0)
    assert "endpoint" in rec and rec["client"].startswith("127.0.0.1:")


def test_stream(run: dict[str, Any]) -> None:
    rec = _one(run, "al-stream")
    assert run["seen"]["stream_chunks"] >= 8
    assert rec["status"] == 200 and rec["model"] == "m" and rec["client_abort"] is False
    assert rec["bytes_sent"] > 8 * len(b'data: {"choices":[]}\n\n')
    raw = _one(run, "al-stream-raw")  # the body bytes exactly: no head, no chunk framing
    assert raw["bytes_sent"] == len(run["seen"]["stream_raw"]) and run["seen"]["stream_raw"].endswith(b"[DONE]\n\n")


def test_refusals_are_logged(run: dict[str, Any]) -> None:
    seen = run["seen"]
    assert (seen["404"], seen["404h"], seen["401"], seen["400"]) == (404, 404, 401, 400)
    assert _one(run, "al-404")["status"] == 404  # found by the body: answered by the pipeline
    header = _one(run, "al-404h")  # by the header: refused in on_headers
    assert header["status"] == 404 and header["model"] is None and header["bytes_sent"] > 0
    assert _one(run, "al-401")["status"] == 401
    assert _one(run, "al-400")["status"] == 400


def test_rate_limited(run: dict[str, Any]) -> None:
    codes = run["seen"]["429"]
    assert codes[-1] == 429 and set(codes[:-1]) <= {200}
    rec = _one(run, f"al-429-{len(codes) - 1}")
    assert rec["status"] == 429 and rec["model"] == "m" and rec["bytes_sent"] > 0
    assert [_one(run, f"al-429-{i}")["status"] for i in range(len(codes) - 1)] == codes[:-1]


def test_client_abort(run: dict[str, Any]) -> None:
    rec = _one(run, "al-abort")
    assert rec["client_abort"] is True and rec["status"] == 200 and rec["bytes_sent"] > 0


def test_no_secret_in_any_line(run: dict[str, Any]) -> None:
    out = run["output"]
    assert KEY.encode() not in out and KEY[3:].encode() not in out
    assert REDIS_PASSWORD.encode() not in out
    assert _one(run, "al-ua")["user_agent"] == "probe/1 Bearer ***"


def test_log_injection_is_escaped(run: dict[str, Any]) -> None:
    out = run["output"]
    assert b"\x1b" not in out and b"\r" not in out
    assert not any(ln.startswith(b"forged") for ln in out.split(b"\n"))
    assert "%1b[31m%0d%0aforged" in _one(run, "al-l1")["path"]
    if run["seen"]["l1ua"].startswith(b"HTTP/1.1 400"):  # the HTTP core refuses a raw ESC in a header:
        assert not [r for r in run["records"] if r.get("request_id") == "al-l1ua"]  # never reaches the log
        return
    assert _one(run, "al-l1ua")["user_agent"] == f"evil{ESC}/1.0"  # the JSON string holds it, the line escapes it


def test_text_format_escapes_too(tmp_path: Path) -> None:
    """L1 in ``--log-format text``: the same probes leave no raw control character in any line."""
    with stub_engines(1) as engines:
        px = Proxy(inventory(tmp_path, engines), "text")
        try:
            _raw(px.port, b"POST /v1/chat/completions%1b[31m%0d%0aforged HTTP/1.1\r\nHost: t\r\nX-Request-ID: t-l1\r\n"
                          b"Content-Type: application/json\r\n", CHAT)
            _raw(px.port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nX-Request-ID: t-l1ua\r\n"
                          b"Content-Type: application/json\r\nUser-Agent: evil\x1b[31m/1.0\r\n", CHAT)
            _status(px.port, "/v1/chat/completions", CHAT, {"X-Request-ID": "t-ua", "User-Agent": f"x Bearer {KEY}"})
            px.wait_for("t-l1")
            px.wait_for("t-ua")
        finally:
            out = px.stop()
    assert b"\x1b" not in out and b"\r" not in out and KEY.encode() not in out
    lines = out.decode().splitlines()
    access = [ln for ln in lines if " flexinfer.access: " in ln]
    assert len([ln for ln in access if "t-l1ua" not in ln]) == 2 and not any(ln.startswith("forged") for ln in lines)
    fields = orjson.loads(next(ln for ln in access if "t-ua" in ln).split(" 200 ", 1)[1])
    assert fields["user_agent"] == "x Bearer ***" and fields["status"] == 200

