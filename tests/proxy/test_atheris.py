"""Row F3: atheris on the proxy's Python layers (targets in :mod:`tests.proxy._atheris_targets`).

Each target runs in its own process on the pure-Python modules (atheris instruments bytecode, not
the compiled twins). ``make test`` gives each target FLEXINFER_ATHERIS_CI_SECONDS (default 1 s); the
``reliability`` run gives each FLEXINFER_ATHERIS_SECONDS (default 600 s, the plan's 10 minutes).
Pass: the fuzzer exits 0 (no crash: only 4xx client errors, invariants held) after running.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("atheris")

ROOT = Path(__file__).resolve().parents[2]
TARGETS = ["model", "rewrite", "multipart", "routing", "chunked"]


def run(target: str, seconds: float, tmp: Path) -> subprocess.CompletedProcess[str]:
    # TMPDIR: the fuzzer's corpus and crash files go to the test's own directory (libFuzzer ends the
    # process without cleaning up; in the system's /tmp they piled up, two per run)
    env = {**os.environ, "FLEXINFER_NO_EXTENSIONS": "1", "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp)}
    p = subprocess.run([sys.executable, "-m", "tests.proxy._atheris_targets", target, str(seconds)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=seconds + 120)
    return p


def fuzz(target: str, seconds: float, tmp: Path) -> int:
    p = run(target, seconds, tmp)
    assert p.returncode == 0, p.stderr[-4000:]
    m = re.search(r"stat::number_of_executed_units: (\d+)", p.stderr)
    assert m is not None, p.stderr[-2000:]
    runs = int(m.group(1))
    print(f"\natheris {target}: {runs} inputs in {seconds:g} s, 0 crashes")
    return runs


def test_atheris_ci(tmp_path: Path) -> None:
    # the four targets in one process (one interpreter start), each input routed by its first byte
    assert fuzz("all", float(os.environ.get("FLEXINFER_ATHERIS_CI_SECONDS", "1")), tmp_path) > 1000
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("atheris-all-")]  # its corpus went here


@pytest.mark.reliability
@pytest.mark.timeout(0)
@pytest.mark.parametrize("target", TARGETS)
def test_atheris_full(target: str, tmp_path: Path) -> None:
    assert fuzz(target, float(os.environ.get("FLEXINFER_ATHERIS_SECONDS", "600")), tmp_path) > 0


def test_a_broken_target_is_reported(tmp_path: Path) -> None:
    p = run("broken", 20, tmp_path)
    assert p.returncode != 0 and "broken target" in p.stdout + p.stderr
