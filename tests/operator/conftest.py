"""Fixtures of the operator tests: the Kubernetes emulator (``kube``, with a bounded request history)
and quiet kopf logs."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from tests.kube_emulator import KubeEnv
from tests.operator.harness import start_bounded_kube


@pytest_asyncio.fixture(name="kube")
async def kube_fixture(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[KubeEnv]:
    async with start_bounded_kube(tmp_path) as env:
        monkeypatch.setenv("KUBECONFIG", str(env.kubeconfig_path))
        yield env


@pytest.fixture(autouse=True)
def _quiet_kopf() -> None:
    logging.getLogger("kopf").setLevel(logging.WARNING)
