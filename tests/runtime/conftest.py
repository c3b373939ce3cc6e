"""Fixtures: ``flexinfer serve`` (proxy + local runtime) in a background loop, models = stub engines."""

from __future__ import annotations

import asyncio
import os
import sys
import textwrap
import threading
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from flexinfer.http.server import HTTPServer
from flexinfer.operator.sharing import Windows
from flexinfer.proxy.pipeline import ProxyHandler
from flexinfer.runtime.local import LocalRuntime
from flexinfer.runtime.serve import build
from flexinfer.settings import ProxySettings, with_changes

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[2]


def stub_cmd(*extra: str) -> str:
    """A YAML flow list running the stub engine as a local model."""
    parts = [sys.executable, "-m", "tests.stub_engine", "--port", "${PORT}", *extra]
    return "[" + ", ".join(repr(p) for p in parts) + "]"


class LocalStack:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server: HTTPServer | None = None
        self.handler: ProxyHandler | None = None
        self.runtime: LocalRuntime | None = None

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def call(self, fn: Callable[[], T]) -> T:
        async def wrap() -> T:
            return fn()
        return self.run(wrap())

    def start(self, yaml_text: str, settings: ProxySettings | None = None, windows: Windows | None = None,
              reap_interval: float = 0.1) -> str:
        cfg = self.tmp / "local.yaml"
        cfg.write_text(textwrap.dedent(yaml_text))
        settings = settings or fast_local_settings()
        os.environ.setdefault("PYTHONPATH", str(ROOT))

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

    @property
    def port(self) -> int:
        assert self.server is not None
        return self.server.port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def close(self) -> None:
        async def stop() -> None:
            if self.server is not None:
                await self.server.drain_and_close(0.5)
            if self.runtime is not None:
                await self.runtime.stop_all()
            if self.handler is not None:
                await self.handler.pools.close_all()
        try:
            self.run(stop(), timeout=30)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(5)
            self.loop.close()


def fast_local_settings(**changes: Any) -> ProxySettings:
    s = ProxySettings()
    http = with_changes(s.http, drain_timeout=5.0)
    up = with_changes(s.upstream, connect_timeout=1.0, response_timeout=20.0, stream_idle_timeout=20.0)
    base = dict(queue_timeout=20.0, queue_keepalive_after=0.2, queue_keepalive_interval=0.3)
    base.update(changes)
    return with_changes(s, http=http, upstream=up, **base)


@pytest.fixture
def local(tmp_path: Path) -> Iterator[LocalStack]:
    os.environ["PYTHONPATH"] = str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")
    st = LocalStack(tmp_path)
    try:
        yield st
    finally:
        st.close()
