"""A test engine for prefill/decode disaggregation: one :class:`~tests.stub_engine.StubEngine` per
role, speaking the engine side of vLLM's NIXL protocol and checking what it receives.

No engine does disaggregated serving on CPU (vLLM's NixlConnector moves KV blocks between GPUs), so
this engine plays both roles of the protocol without any KV cache:

- ``role="prefill"`` expects ``max_tokens: 1``, ``stream: false``, no ``stream_options``, and
  ``kv_transfer_params`` with ``do_remote_decode: true``, ``do_remote_prefill: false`` and the remote
  fields null; it answers a one-token completion whose ``kv_transfer_params`` names its engine id,
  fresh block ids, host and port (each answer is remembered in :attr:`DisaggEngine.issued`).
- ``role="decode"`` expects ``kv_transfer_params`` equal to one its prefill peers issued (and not
  used before), then answers like the stub engine (JSON, or SSE with ``"stream": true``).

Every deviation is appended to :attr:`DisaggEngine.problems` (tests assert it stays empty); every
request is in :attr:`StubEngine.requests`. :attr:`DisaggEngine.fault` scripts one engine's failure
(headers would reach both engines): ``status:<code>`` (an OpenAI error), ``reset`` (RST before
answering), ``not-json`` (200 with a text body), ``no-kv`` (200 JSON without ``kv_transfer_params``),
``delay:<s>`` (wait s seconds, then answer).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from tests.stub_engine import Captured, StubEngine, _Conn


class _DisaggConn(_Conn):
    engine: DisaggEngine

    async def _answer(self, cap: Captured) -> None:
        eng = self.engine
        path = cap.path.split("?")[0]
        if cap.method != "POST" or not path.endswith("/completions"):
            await super()._answer(cap)
            return
        fault = eng.fault
        if fault.startswith("delay:"):
            await asyncio.sleep(float(fault[6:]))
        if fault == "reset":
            self._close(rst=True)
            return
        if fault.startswith("status:"):
            code = int(fault[7:])
            self._send(code, json.dumps({"error": {"message": f"{eng.role} error {code}", "type": "server_error",
                                                    "param": None, "code": f"stub_{code}"}}).encode())
            return
        try:
            data: dict[str, Any] = json.loads(cap.body)
        except ValueError:
            eng.problems.append("body is not JSON")
            data = {}
        if eng.role == "prefill":
            self._prefill(data, path)
        else:
            self._check_decode(data)
            await super()._answer(cap)

    def _prefill(self, data: dict[str, Any], path: str) -> None:
        eng = self.engine
        p = eng.problems
        if data.get("max_tokens") != 1:
            p.append(f"prefill: max_tokens {data.get('max_tokens')!r}, not 1")
        if "max_completion_tokens" in data and data["max_completion_tokens"] != 1:
            p.append("prefill: max_completion_tokens is not 1")
        if data.get("stream") is not False:
            p.append(f"prefill: stream {data.get('stream')!r}, not false")
        if "stream_options" in data:
            p.append("prefill: stream_options not removed")
        kv = data.get("kv_transfer_params")
        want = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                "remote_block_ids": None, "remote_host": None, "remote_port": None}
        if kv != want:
            p.append(f"prefill: kv_transfer_params {kv!r}")
        if self.engine.fault == "not-json":
            self._send(200, b"prefilled, but this is not JSON", b"text/plain")
            return
        n = len(eng.issued)
        params = {"do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": f"prefill-{eng.port}",
                  "remote_block_ids": [3 * n, 3 * n + 1, 3 * n + 2], "remote_host": "127.0.0.1",
                  "remote_port": eng.port, "tp_size": 1}
        eng.issued.append(params)
        model = data.get("model", "stub")
        if path.endswith("/chat/completions"):
            answer: dict[str, Any] = {"id": "chatcmpl-prefill", "object": "chat.completion", "created": 1700000000,
                                      "model": model, "choices": [{"index": 0, "message": {
                                          "role": "assistant", "content": "x"}, "finish_reason": "length"}]}
        else:
            answer = {"id": "cmpl-prefill", "object": "text_completion", "created": 1700000000, "model": model,
                      "choices": [{"index": 0, "text": "x", "finish_reason": "length"}]}
        answer["usage"] = {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}
        if self.engine.fault != "no-kv":
            answer["kv_transfer_params"] = params
        self._send(200, json.dumps(answer).encode())

    def _check_decode(self, data: dict[str, Any]) -> None:
        eng = self.engine
        kv = data.get("kv_transfer_params")
        issued = [k for peer in eng.prefills for k in peer.issued]
        if kv not in issued:
            eng.problems.append(f"decode: kv_transfer_params {kv!r} were not issued by a prefill engine")
        elif kv in eng.used:
            eng.problems.append(f"decode: kv_transfer_params {kv!r} used twice")
        else:
            eng.used.append(kv)


class DisaggEngine(StubEngine):
    """A stub engine with a disaggregation role (module doc)."""

    def __init__(self, role: str, prefills: list[DisaggEngine] | None = None) -> None:
        super().__init__()
        assert role in ("prefill", "decode")
        self.role = role
        self.prefills = prefills or []  # a decode engine accepts the params these issued
        self.fault = ""
        self.problems: list[str] = []
        self.issued: list[dict[str, Any]] = []
        self.used: list[dict[str, Any]] = []

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> DisaggEngine:
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(lambda: _DisaggConn(self), host, port, backlog=1024)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    def generations(self) -> list[dict[str, Any]]:
        """The JSON bodies of the completion requests this engine received."""
        return [json.loads(c.body) for c in self.requests if c.method == "POST" and c.path.endswith("completions")]
