"""The request path compiled from its own source (flexinfer._compiled): which file each module
loads from, the env switch, stale builds, and the modules the build covers."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flexinfer import _compiled

ROOT = Path(__file__).resolve().parents[1]
REPORT = (
    "import json, importlib, flexinfer; from flexinfer import _compiled; "
    "mods = [importlib.import_module(n) for n in _compiled.MODULES]; "
    "print(json.dumps([{m.__name__: m.__file__ for m in mods}, _compiled.implementation(), "
    "flexinfer.__speedups__]))"
)


def report(no_ext: str | None) -> list:
    env = {k: v for k, v in os.environ.items() if k != "FLEXINFER_NO_EXTENSIONS"}
    if no_ext is not None:
        env["FLEXINFER_NO_EXTENSIONS"] = no_ext
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run([sys.executable, "-c", REPORT], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=60, check=True)
    return json.loads(out.stdout)


def built() -> bool:
    return all(_compiled._compiled_path(str(ROOT.joinpath(*n.split(".")[:-1])), n.rpartition(".")[2])
               for n in _compiled.MODULES)


def test_every_module_exists_as_source() -> None:
    for name in _compiled.MODULES:
        assert ROOT.joinpath(*name.split(".")).with_suffix(".py").is_file(), name


def test_switch_loads_every_module_from_its_source() -> None:
    files, impl, top = report("1")
    assert set(files) == set(_compiled.MODULES)
    assert all(path.endswith(".py") for path in files.values()), files
    assert set(impl.values()) == {"py"} and top == "py"


@pytest.mark.skipif(not built(), reason="request path not compiled; run `make ext`")
def test_the_build_is_the_default_when_built() -> None:
    for value in (None, "", "0"):
        files, impl, top = report(value)
        assert not [p for p in files.values() if p.endswith(".py")], files
        assert set(impl.values()) == {"c"} and top == "c"


def _fake_package(tmp_path: Path, source_newer: bool) -> tuple[str, Path]:
    """A package with ``mod.py`` and a (bogus) compiled ``mod`` beside it: loading the bogus file
    would fail, so a successful import proves the source was chosen."""
    pkg = tmp_path / "fakepkg_compiled"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    source = pkg / "mod.py"
    source.write_text("WHERE = 'source'\n")
    build = pkg / ("mod" + importlib.machinery.EXTENSION_SUFFIXES[0])
    build.write_bytes(b"not an extension module")
    now = time.time()
    os.utime(source, (now, now + (10 if source_newer else -10)))
    os.utime(build, (now, now))
    return "fakepkg_compiled.mod", source


@pytest.fixture
def fake_names(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):  # type: ignore[no-untyped-def]
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(_compiled, "_stale", [])
    yield
    for name in [n for n in sys.modules if n.startswith("fakepkg_compiled")]:
        del sys.modules[name]


def test_a_source_newer_than_its_build_is_loaded_and_reported(fake_names: None, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    name, source = _fake_package(tmp_path, source_newer=True)
    monkeypatch.setattr(_compiled, "_NAMES", frozenset({name}))
    monkeypatch.setattr(_compiled, "NO_EXTENSIONS", False)
    module = importlib.import_module(name)
    assert module.WHERE == "source" and module.__file__ == str(source)
    assert _compiled.stale() == [name]


def test_the_switch_loads_the_source_of_a_fresh_build(fake_names: None, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    name, source = _fake_package(tmp_path, source_newer=False)
    monkeypatch.setattr(_compiled, "_NAMES", frozenset({name}))
    monkeypatch.setattr(_compiled, "NO_EXTENSIONS", True)
    assert importlib.import_module(name).__file__ == str(source)
    assert _compiled.stale() == []


def test_a_fresh_build_is_left_to_pythons_finder(fake_names: None, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    name, _ = _fake_package(tmp_path, source_newer=False)
    monkeypatch.setattr(_compiled, "_NAMES", frozenset({name}))
    monkeypatch.setattr(_compiled, "NO_EXTENSIONS", False)
    importlib.import_module("fakepkg_compiled")
    pkg_path = sys.modules["fakepkg_compiled"].__path__
    assert _compiled._SourceFirst.find_spec(name, pkg_path) is None
    with pytest.raises(ImportError):  # Python's own finder takes the (bogus) build
        importlib.import_module(name)


def test_names_outside_the_list_are_not_touched(tmp_path: Path) -> None:
    assert _compiled._SourceFirst.find_spec("json.decoder", [str(tmp_path)]) is None
