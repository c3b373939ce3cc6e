"""``flexinfer.logs``: the two formats, secret redaction and control-character escaping, then the
commands that run as processes honouring ``--log-format json`` (agent, operator with kopf, extender)."""

from __future__ import annotations

import asyncio
import io
import logging
import os
import socket
import subprocess
import sys
import threading
from typing import Any, cast

import orjson
import pytest

from flexinfer import logs
from tests.kube_emulator import kube_fixture  # noqa: F401

SECRETS = [
    ("Authorization: Bearer sk-live-abcdef0123456789", "sk-live-abcdef0123456789"),
    ("authorization: basic Zm9vOmJhcg==", "Zm9vOmJhcg=="),
    ("headers [(b'authorization', b'Bearer tok.en-123'), (b'host', b'x')]", "tok.en-123"),
    ("{'Authorization': 'Bearer abc123xyz'}", "abc123xyz"),
    ('{"x-api-key": "k3y-value"}', "k3y-value"),
    ("redis unavailable at redis://:hunter2pw@redis:6379/0", "hunter2pw"),
    ("rediss://user:p4ssw0rd@h:6380/1", "p4ssw0rd"),
    ("GET /v1/models?api_key=QWERTY123&x=1", "QWERTY123"),
    ("env HF_TOKEN=hf_abcdefghijklmnopqrstu", "hf_abcdefghijklmnopqrstu"),
    ("downloading https://huggingface.co/m?token=hf_abcdefghijklmnop", "abcdefghijklmnop"),
    ('{"password": "s3cret!"}', "s3cret!"),
    ("the key sk-proj-ABCDEFGHIJKL leaked", "ABCDEFGHIJKL"),
]
BENIGN = ["POST /v1/chat/completions 200", '{"prompt_tokens":5,"completion_tokens":4,"max_tokens":10}',
          "PROXY_TOKEN_COUNT must be 'estimate' or 'tokenizer'", "model m ready on 10.0.0.1:8000"]


@pytest.mark.parametrize(("text", "secret"), SECRETS)
def test_redact_masks_known_shapes(text: str, secret: str) -> None:
    out = logs.redact(text)
    assert secret not in out and logs.MASK in out


@pytest.mark.parametrize("text", BENIGN)
def test_redact_keeps_other_text(text: str) -> None:
    assert logs.redact(text) == text


def test_escape() -> None:
    assert logs.escape("a\x1b[31mb\r\nc\x00\x7f") == "a\\x1b[31mb\\r\\nc\\x00\\x7f"
    assert logs.escape("line1\nline2\x1b", keep_newlines=True) == "line1\nline2\\x1b"
    assert logs.escape("plain") == "plain"


def _emit(fmt: str, msg: str, *args: Any, exc: bool = False, **extra: Any) -> str:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logs.formatter(fmt))
    logger = logging.getLogger(f"tests.logging.{fmt}")
    logger.propagate = False
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        if exc:
            try:
                raise ValueError("bad header Authorization: Bearer sk-exc-0123456789\r\nforged")
            except ValueError:
                logger.exception(msg, *args, extra=extra)
        else:
            logger.warning(msg, *args, extra=extra)
    finally:
        logger.removeHandler(handler)
        handler.close()
    return stream.getvalue()


def test_json_lines() -> None:
    out = _emit("json", "got %s from %s", "Bearer sk-aaaa0123456789", f"evil{chr(27)}[31m\r\nforged", exc=True,
                fields={"status": 200, "user_agent": "x Bearer sk-bbbb0123456789", "ttft": None},
                k8s_ref={"kind": "Model", "name": "m", "namespace": "default"})
    assert out.count("\n") == 1 and "\x1b" not in out and "\r" not in out  # one line; escapes by orjson
    rec = orjson.loads(out)
    assert rec["level"] == "error" and rec["logger"] == "tests.logging.json" and rec["time"].endswith("Z")
    assert rec["message"] == "got Bearer *** from evil\x1b[31m\r\nforged"
    assert "ValueError" in rec["exception"] and "sk-exc" not in rec["exception"]
    assert rec["status"] == 200 and rec["user_agent"] == "x Bearer ***" and rec["ttft"] is None
    assert rec["object"] == {"kind": "Model", "name": "m", "namespace": "default"}
    assert "sk-" not in out.replace("sk-***", "")


def test_text_lines() -> None:
    out = _emit("text", "path %s", f"/v1/x{chr(27)}[31m\r\nforged", exc=True, fields={"user_agent": "Bearer zzz123"})
    first, *trace = out.rstrip("\n").split("\n")
    assert " ERROR tests.logging.text: path /v1/x\\x1b[31m\\r\\nforged " in first
    assert first.endswith('{"user_agent":"Bearer ***"}')
    assert trace[0] == "  Traceback (most recent call last):" and all(ln.startswith("  ") for ln in trace)
    assert "\x1b" not in out and "\r" not in out and "sk-exc" not in out


class _Unraisable:
    err_msg = None
    object = "finalizer"
    exc_type, exc_value, exc_traceback = BufferError, BufferError("memoryview has 1 exported buffer"), None


def test_configure_replaces_nothing_it_does_not_own() -> None:
    root = logging.getLogger()
    saved, level = root.handlers[:], root.level
    hooks = sys.unraisablehook, sys.excepthook, threading.excepthook
    stream = io.StringIO()
    try:
        sentinel = logging.NullHandler()
        root.addHandler(sentinel)
        assert logs.configure("info", "json", stream) is None  # configured already: left alone
        handler = logs.configure("warning", "json", stream, force=True)
        assert root.handlers == [handler] and root.level == logging.WARNING
        logging.getLogger("flexinfer.x").warning("hello %s", "Bearer sk-ccc0123456789")
        assert orjson.loads(stream.getvalue())["message"] == "hello Bearer ***"
        sys.unraisablehook(cast(Any, _Unraisable()))  # what Python would print itself: one of our lines
        last = orjson.loads(stream.getvalue().splitlines()[-1])
        assert last["message"] == "Exception ignored in: 'finalizer'" and "BufferError" in last["exception"]
        with pytest.raises(ValueError, match="log format"):
            logs.configure("info", "yaml", stream, force=True)
    finally:
        sys.unraisablehook, sys.excepthook, threading.excepthook = hooks
        for h in root.handlers[:]:
            root.removeHandler(h)
        for h in saved:
            root.addHandler(h)
        root.setLevel(level)


def _json_lines(out: bytes) -> list[dict[str, Any]]:
    lines = [ln for ln in out.decode().splitlines() if ln.strip()]
    assert lines, "no output"
    recs = [orjson.loads(ln) for ln in lines]  # every line parses
    for rec in recs:
        assert {"time", "level", "logger", "message"} <= rec.keys()
    return recs


def test_agent_process_json() -> None:
    env = {k: v for k, v in os.environ.items() if k != "NODE_NAME"}
    p = subprocess.run([sys.executable, "-m", "flexinfer.cli", "--log-format", "json", "agent"], env=env,
                       capture_output=True, timeout=60)
    assert p.returncode == 2
    recs = _json_lines(p.stderr)
    assert any(r["level"] == "error" and "NODE_NAME" in r["message"] for r in recs)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _collect(proc: asyncio.subprocess.Process, until: Any, timeout: float = 30) -> bytes:
    """Read the process's output until ``until(output)`` holds, then stop it; the whole output."""
    assert proc.stdout is not None
    out = b""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    try:
        while not until(out):
            assert loop.time() < end, f"never seen; output:\n{out[-3000:].decode(errors='replace')}"
            try:
                out += await asyncio.wait_for(proc.stdout.readline(), max(0.1, end - loop.time()))
            except TimeoutError:
                continue
        proc.terminate()
        out += await asyncio.wait_for(proc.stdout.read(), 20)
        assert await asyncio.wait_for(proc.wait(), 20) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    return out


def test_kopf_object_records_are_ours() -> None:
    """kopf (which ``kopf.run`` leaves the logging setup of) logs through the root handler: its
    per-object records carry the object's reference as ``"object"``."""
    pytest.importorskip("kopf")
    import kopf
    from kopf._cogs.structs import bodies
    from kopf._core.actions import loggers

    root = logging.getLogger()
    saved, level = root.handlers[:], root.level
    hooks = sys.unraisablehook, sys.excepthook, threading.excepthook
    stream = io.StringIO()
    try:
        logs.configure("info", "json", stream, force=True)
        body = bodies.Body({"apiVersion": "ai.flexinfer/v1alpha2", "kind": "Model",
                            "metadata": {"name": "jm", "namespace": "default", "uid": "u1"}})
        log = loggers.LocalObjectLogger(body=body, settings=kopf.OperatorSettings())
        log.warning("Handler 'x' failed: Authorization: Bearer sk-kopf-0123456789")
    finally:
        for h in root.handlers[:]:
            root.removeHandler(h)
        for h in saved:
            root.addHandler(h)
        root.setLevel(level)
        sys.unraisablehook, sys.excepthook, threading.excepthook = hooks
    rec = orjson.loads(stream.getvalue())
    assert rec["logger"] == "kopf.objects" and rec["level"] == "warning"
    assert rec["message"] == "Handler 'x' failed: Authorization: ***"
    assert rec["object"]["name"] == "jm" and rec["object"]["kind"] == "Model"


@pytest.mark.reliability  # a whole operator start (kopf, the emulator): seconds; make reliability
async def test_operator_process_json(kube: Any) -> None:
    """kopf's own records (its per-object logger included) come out as our JSON lines."""
    from tests.operator.harness import model, register_crds

    register_crds(kube)
    kube.seed("ai.flexinfer/v1alpha2/models", model("jm"))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "flexinfer.cli", "--log-format", "json", "operator", "--kubeconfig",
        str(kube.kubeconfig_path), "--liveness", "", env={**os.environ, "FLEXINFER_OPERATOR_RESYNC": "1"},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out = await _collect(proc, lambda o: b'"object":{' in o)
    recs = _json_lines(out)
    assert any(r["logger"].startswith("kopf") for r in recs)
    assert any(r.get("object", {}).get("name") == "jm" for r in recs)


@pytest.mark.reliability  # the same cli path as the agent's and the proxy's; make reliability
async def test_extender_process_json(kube: Any) -> None:
    port = _port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "flexinfer.cli", "--log-format", "json", "extender", "--host", "127.0.0.1",
        "--port", str(port), "--kubeconfig", str(kube.kubeconfig_path),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out = await _collect(proc, lambda o: b"extender listening" in o)
    recs = _json_lines(out)
    assert any(r["logger"].startswith("flexinfer.scheduler") and "listening" in r["message"] for r in recs)
