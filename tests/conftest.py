"""Suite-wide collection rule: the full-size ``reliability`` runs (minutes each) are left out unless
the mark expression names them (``make reliability`` passes ``-m reliability``), so a plain
``pytest tests/proxy`` is the quick suite, as ``make test`` (``-m "not reliability"``) is."""

from __future__ import annotations

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
