"""The dispatcher: env switch, fallback, reporting, layering, and a pure-Python install."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import flexinfer
from flexinfer import _speedups

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "flexinfer" / "_speedups"
REPORT = (
    "import json, flexinfer, flexinfer._speedups as s; "
    "print(json.dumps([s.IMPLEMENTATION, s.IMPLEMENTATIONS, flexinfer.__speedups__, "
    "s.HashRing.__module__, s.TokenBucket.__module__, s.chained_block_hashes.__module__, flexinfer.__file__]))"
)


def run_report(env_value: str | None, cwd: Path = ROOT, pythonpath: Path = ROOT) -> list:
    env = {k: v for k, v in os.environ.items() if k != "FLEXINFER_NO_EXTENSIONS"}
    if env_value is not None:
        env["FLEXINFER_NO_EXTENSIONS"] = env_value
    env["PYTHONPATH"] = str(pythonpath)
    out = subprocess.run(
        [sys.executable, "-c", REPORT],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(out.stdout)


def c_built() -> bool:
    return all(
        any(PKG.glob(f"{name}_c.*.so")) or any(PKG.glob(f"{name}_c.*.pyd")) for name in _speedups.PRIMITIVES
    )


def test_reports_the_active_implementation() -> None:
    assert _speedups.IMPLEMENTATION in ("c", "py", "mixed")
    assert set(_speedups.IMPLEMENTATIONS) == set(_speedups.PRIMITIVES)
    assert flexinfer.__speedups__ == _speedups.IMPLEMENTATION  # type: ignore[attr-defined]
    impl = _speedups.IMPLEMENTATIONS["hashring"]
    assert _speedups.HashRing.__module__ == f"flexinfer._speedups.hashring_{impl}"
    with pytest.raises(AttributeError):
        _ = flexinfer.__no_such_thing__  # type: ignore[attr-defined]


def test_env_switch_forces_python() -> None:
    impl, per, top, ring_mod, bucket_mod, prefix_mod, _ = run_report("1")
    assert impl == top == "py"
    assert set(per.values()) == {"py"}
    assert ring_mod.endswith("hashring_py") and bucket_mod.endswith("tokenbucket_py")
    assert prefix_mod.endswith("prefixhash_py")


@pytest.mark.skipif(not c_built(), reason="compiled twins not built; run `make ext`")
def test_compiled_is_the_default_when_built() -> None:
    for value in (None, "", "0"):
        impl, per, top, ring_mod, *_ = run_report(value)
        assert impl == top == "c" and set(per.values()) == {"c"}
        assert ring_mod.endswith("hashring_c")


def test_load_rejects_unknown_names() -> None:
    with pytest.raises(ValueError):
        _speedups.load("nope", "py")
    with pytest.raises(ValueError):
        _speedups.load("hashring", "rust")


def test_speedups_import_nothing_from_flexinfer() -> None:
    for path in sorted(PKG.glob("*.py")) + sorted(PKG.glob("*.pyx")) + sorted(PKG.glob("*.pxd")):
        text = path.read_text()
        if path.suffix == ".py":
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, ast.ImportFrom):
                    assert node.level > 0 or not (node.module or "").startswith("flexinfer"), path
                elif isinstance(node, ast.Import):
                    assert not any(a.name.startswith("flexinfer") for a in node.names), path
        else:
            for line in text.splitlines():
                stripped = line.strip()
                if stripped.startswith(("import ", "from ", "cimport ")):
                    assert "flexinfer" not in stripped, (path, line)


@pytest.mark.slow
def test_pure_install_has_no_extensions_and_works(tmp_path: Path) -> None:
    """pip-install a copy of the project with FLEXINFER_NO_EXTENSIONS=1: no .so, twins = py."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        if (ROOT / name).exists():
            shutil.copy(ROOT / name, src / name)
    # the copy carries any in-place builds too: the install must still leave them out
    shutil.copytree(ROOT / "flexinfer", src / "flexinfer", ignore=shutil.ignore_patterns("__pycache__"))
    target = tmp_path / "target"
    env = dict(os.environ, FLEXINFER_NO_EXTENSIONS="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    started = time.monotonic()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-build-isolation",
            "--no-deps",
            "--no-index",
            "--no-compile",
            "-t",
            str(target),
            str(src),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    assert time.monotonic() - started < 120
    installed = target / "flexinfer" / "_speedups"
    assert (installed / "hashring_py.py").exists()
    assert not [p.name for p in target.rglob("*") if p.suffix in (".so", ".pyd")]
    # import it from elsewhere, switch NOT set: the missing extensions fall back to Python
    impl, per, top, ring_mod, *_, origin = run_report(None, cwd=tmp_path, pythonpath=target)
    assert Path(origin).resolve().is_relative_to(target.resolve())
    assert impl == top == "py" and set(per.values()) == {"py"}
    assert ring_mod.endswith("hashring_py")
