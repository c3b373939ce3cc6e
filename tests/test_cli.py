"""The console script's own options (the subcommands are tested with their components)."""

from __future__ import annotations

import pytest

import flexinfer
from flexinfer import cli


def test_version_names_release_and_speedups(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["--version"])
    assert exc.value.code == 0
    out = capsys.readouterr().out.strip()
    assert out == f"flexinfer {flexinfer.__version__} (speedups: {flexinfer.__speedups__})"
    assert flexinfer.__speedups__ in ("c", "py", "mixed")


def test_no_command_prints_help() -> None:
    assert cli.main([]) == 2
