"""Shared test harness: servers in a background event loop thread, and small socket helpers.

Tests (and ``bench/``) talk to the servers over real sockets on 127.0.0.1 from the main thread, with
blocking clients (the sync ``openai`` client, raw sockets) or their own event loop.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, timeout: float = 15) -> None:
    """Return once something accepts connections on 127.0.0.1:port."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port}")


class LoopThread:
    """An event loop running in a daemon thread, with an HTTP server (``self.server``) on it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server: Any = None
        self.handler: Any = None

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def call(self, fn: Callable[[], T]) -> T:
        async def wrap() -> T:
            return fn()
        return self.run(wrap())

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.port)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    async def stop_extra(self) -> None:
        """Subclasses stop what else they started (runtimes, stub engines)."""

    def close(self) -> None:
        async def stop() -> None:
            if self.server is not None:
                await self.server.drain_and_close(0.5)
            await self.stop_extra()
            if self.handler is not None:
                await self.handler.pools.close_all()
            me = asyncio.current_task()
            rest = [t for t in asyncio.all_tasks() if t is not me]
            for t in rest:
                t.cancel()
            await asyncio.gather(*rest, return_exceptions=True)
        try:
            self.run(stop(), timeout=30)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(5)
            self.loop.close()


async def reach(cond: Callable[[], object], timeout: float = 5.0, step: float = 0.02) -> None:
    """Wait until ``cond()`` is true, or fail the test with AssertionError after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not cond():
        if loop.time() > end:
            raise AssertionError("condition not reached")
        await asyncio.sleep(step)
