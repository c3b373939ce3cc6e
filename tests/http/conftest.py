"""Run the HTTP core's async tests on uvloop (production) and on plain asyncio (the fallback)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

import pytest

try:
    import uvloop
except ImportError:  # pragma: no cover - uvloop is a dependency
    uvloop = None  # type: ignore[assignment]


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item,
                                  ) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]] | None:
    factories: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {}
    if uvloop is not None:
        factories["uvloop"] = uvloop.new_event_loop
    factories["asyncio"] = asyncio.new_event_loop
    return factories
