"""Fixtures: a stub engine and a proxy running in a background event loop on 127.0.0.1.

Tests talk to them over real sockets with the official ``openai`` client (sync or async) or raw
sockets. ``stack.run(coro)`` runs a coroutine in the servers' loop (to inspect or reconfigure).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from flexinfer.http.server import HTTPServer
from flexinfer.proxy.pipeline import ProxyHandler
from flexinfer.runtime.base import Endpoint, ModelView
from flexinfer.runtime.static import StaticInventory
from flexinfer.settings import ProxySettings, with_changes
from tests.harness import LoopThread
from tests.stub_engine import StubEngine


class Stack(LoopThread):
    """Stub engines + one proxy, served from a private event loop thread."""

    def __init__(self) -> None:
        super().__init__()
        self.stubs: list[StubEngine] = []
        self.inventory: StaticInventory | None = None

    def add_stub(self) -> StubEngine:
        stub = self.run(StubEngine().start())
        self.stubs.append(stub)
        return stub

    @property
    def stub(self) -> StubEngine:
        return self.stubs[0]

    def start_proxy(self, views: list[ModelView], settings: ProxySettings | None = None,
                    **handler_kw: Any) -> str:
        settings = settings or ProxySettings()
        self.inventory = StaticInventory(views)

        async def start() -> None:
            self.handler = ProxyHandler(self.inventory, settings, **handler_kw)  # type: ignore[arg-type]
            self.server = HTTPServer(self.handler, settings.http, host="127.0.0.1", port=0)
            await self.server.start()

        self.run(start())
        return self.url

    async def stop_extra(self) -> None:
        for s in self.stubs:
            await s.stop()


def model(name: str, *stubs: StubEngine | int, **kw: Any) -> ModelView:
    eps = tuple(Endpoint("127.0.0.1", s if isinstance(s, int) else s.port) for s in stubs)
    return ModelView(name=name, endpoints=eps, **kw)


def fast_settings(**changes: Any) -> ProxySettings:
    """Proxy settings with timeouts scaled down for tests."""
    s = ProxySettings()
    http = with_changes(s.http, header_timeout=2.0, body_timeout=2.0, keepalive_timeout=5.0)
    up = with_changes(s.upstream, connect_timeout=1.0, response_timeout=5.0, stream_idle_timeout=5.0)
    return with_changes(s, http=http, upstream=up, **changes)


@pytest.fixture
def stack() -> Iterator[Stack]:
    st = Stack()
    st.add_stub()
    try:
        yield st
    finally:
        st.close()


@pytest.fixture
def proxy(stack: Stack) -> Stack:
    """A proxy with one model ``m1`` (alias ``alias1``, served as ``served-m1``) on the stub."""
    stack.start_proxy([model("m1", stack.stub, served_name="served-m1", aliases=("alias1",)),
                       model("m2", stack.stub)], fast_settings())
    return stack
