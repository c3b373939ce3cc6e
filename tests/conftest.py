"""Suite-wide rules. Collection: the full-size ``reliability`` runs (minutes each) are left out
unless the mark expression names them (``make reliability`` passes ``-m reliability``), so a plain
``pytest tests/proxy`` is the quick suite, as ``make test`` (``-m "not reliability"``) is. Teardown:
every synchronous ``openai.OpenAI`` client a test makes is closed when the test ends."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "reliability" in (config.option.markexpr or ""):
        return  # the expression decides (make test, make reliability, -m "reliability and ...")
    keep: list[pytest.Item] = []
    left: list[pytest.Item] = []
    for item in items:
        (left if item.get_closest_marker("reliability") is not None else keep).append(item)
    if left:
        config.hook.pytest_deselected(items=left)
        items[:] = keep


@pytest.fixture(autouse=True)
def _close_openai_clients(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Close the test's ``openai.OpenAI`` clients at its end. A client left to the garbage collector
    inside a reference cycle (a raw response holds one) can be finalized after its pooled sockets:
    an "unclosed socket" ResourceWarning, an error under this suite's filterwarnings, raised in
    whichever later test the collector happens to run (seen with ``gc.collect()`` after every test:
    nine tests of tests/proxy left one)."""
    openai = sys.modules.get("openai")
    if openai is None:  # no test module of this process uses it
        yield
        return
    made: list[Any] = []
    init = openai.OpenAI.__init__

    def register(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(openai.OpenAI, "__init__", register)
    yield
    for client in made:
        client.close()
