"""Fixture ``fake``: a :class:`~tests.tps.fake_openai.FakeOpenAI` on 127.0.0.1, served from its own thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest

from tests.tps.fake_openai import FakeOpenAI


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
