"""``flexinfer bench`` through ``flexinfer.cli.main``: JSON, CSV and plot outputs, one-line errors."""

from __future__ import annotations

import csv
import importlib.util
import io
import json
from pathlib import Path
from typing import Any

import pytest

from flexinfer.cli import main
from flexinfer.tps.report import CSV_FIELDS
from tests.tps.fake_openai import FakeOpenAI

# ---- the command --------------------------------------------------------------------------------------


def test_cli_json(fake: FakeOpenAI, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["bench", "--base-url", fake.base_url, "--model", "fake", "--warmup", "1", "--iterations", "3",
               "--min-duration", "0", "--json"])
    assert rc == 0
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert doc["model"] == "fake" and doc["iterations"] == 3 and doc["warmup"] == 1
    assert set(doc["latency_seconds"]) == {"p50", "p90", "p99"}
    assert doc["tokens_per_second"] > 0 and doc["ttft_p50_seconds"] > 0 and len(doc["samples"]) == 3
    assert "tokens/s" in err  # the text summary moves to stderr when stdout carries JSON
    assert "bench [" in err  # progress


def test_cli_csv_and_json_files(fake: FakeOpenAI, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["bench", "--base-url", fake.base_url, "--model", "fake", "--warmup", "0", "--iterations", "2",
               "--min-duration", "0", "--csv", str(tmp_path / "r.csv"), "--json", str(tmp_path / "r.json"),
               "--no-progress"])
    assert rc == 0
    rows = list(csv.DictReader(io.StringIO((tmp_path / "r.csv").read_text())))
    assert [r["iteration"] for r in rows] == ["1", "2"]
    assert tuple(rows[0]) == CSV_FIELDS and float(rows[0]["tokens_per_second"]) > 0
    assert json.loads((tmp_path / "r.json").read_text())["iterations"] == 2
    out, err = capsys.readouterr()
    assert "TTFT p50" in out and err == ""


def test_cli_csv_stdout(fake: FakeOpenAI, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--base-url", fake.base_url, "--model", "fake", "--warmup", "0", "--iterations", "2",
                 "--min-duration", "0", "--csv", "--no-stream", "--no-progress"]) == 1  # no usage: error
    fake.usage = 10
    assert main(["bench", "--base-url", fake.base_url, "--model", "fake", "--warmup", "0", "--iterations", "2",
                 "--min-duration", "0", "--csv", "--no-stream", "--no-progress"]) == 0
    out = capsys.readouterr().out
    rows = list(csv.DictReader(io.StringIO(out)))
    assert len(rows) == 2 and rows[0]["ttft_seconds"] == "" and rows[0]["tokens"] == "10"


@pytest.mark.parametrize(("setup", "needle"), [
    ({"fail_first": 9, "fail_status": 500}, "HTTP 500: model is loading"),
    ({"error_mid_stream": True}, "error in stream: engine crashed"),
])
def test_cli_errors_one_line(fake: FakeOpenAI, capsys: pytest.CaptureFixture[str], setup: dict[str, Any],
                             needle: str) -> None:
    for k, v in setup.items():
        setattr(fake, k, v)
    assert main(["bench", "--base-url", fake.base_url, "--model", "fake", "--warmup", "0",
                 "--min-duration", "0", "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_cli_connection_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--base-url", "http://127.0.0.1:9/v1", "--model", "m", "--ready-timeout", "0",
                 "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "cannot connect to 127.0.0.1:9" in err and len(err.strip().splitlines()) == 1


def test_cli_plot_without_matplotlib(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    assert main(["bench", "--base-url", "http://127.0.0.1:9/v1", "--model", "m", "--plot", "x.png"]) == 1
    assert "pip install matplotlib" in capsys.readouterr().err


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="matplotlib not installed")
def test_cli_plot(fake: FakeOpenAI, tmp_path: Path) -> None:
    out = tmp_path / "bench.png"
    assert main(["bench", "--base-url", fake.base_url, "--model", "fake", "--warmup", "0", "--iterations", "4",
                 "--min-duration", "0", "--plot", str(out), "--no-progress"]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
