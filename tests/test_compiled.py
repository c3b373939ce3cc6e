"""The request path compiled from its own source (flexinfer._compiled): which file each module
loads from, the env switch, stale builds, and the modules the build covers."""

from __future__ import annotations

import ast
import importlib
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from flexinfer import _compiled

ROOT = Path(__file__).resolve().parents[1]
REPORT = (
    "import json, importlib, flexinfer; from flexinfer import _compiled; "
    "mods = [importlib.import_module(n) for n in _compiled.MODULES]; "
    "print(json.dumps([{m.__name__: m.__file__ for m in mods}, _compiled.implementation(), "
    "flexinfer.__speedups__]))"
)


def run_json(code: str, no_ext: str | None) -> Any:
    """What ``code`` prints as JSON, run in a fresh interpreter with ``FLEXINFER_NO_EXTENSIONS``
    set to ``no_ext`` (unset: None)."""
    env = {k: v for k, v in os.environ.items() if k != "FLEXINFER_NO_EXTENSIONS"}
    if no_ext is not None:
        env["FLEXINFER_NO_EXTENSIONS"] = no_ext
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=60, check=True)
    return json.loads(out.stdout)


def report(no_ext: str | None) -> list:
    return run_json(REPORT, no_ext)  # type: ignore[no-any-return]


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


def _fake_package(tmp_path: Path, newer: tuple[str, ...], leaves: tuple[str, ...] = ("mod",)) -> Path:
    """A package whose modules each have a ``.py`` and a bogus compiled file beside it (loading the
    bogus file fails, so a successful import proves the source was chosen); the sources in ``newer``
    are newer than their builds."""
    pkg = tmp_path / "fakepkg_compiled"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    now = time.time()
    for leaf in leaves:
        source = pkg / f"{leaf}.py"
        source.write_text("WHERE = 'source'\n")
        build = pkg / (leaf + importlib.machinery.EXTENSION_SUFFIXES[0])
        build.write_bytes(b"not an extension module")
        os.utime(source, (now, now + (10 if leaf in newer else -10)))
        os.utime(build, (now, now))
    return pkg


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):  # type: ignore[no-untyped-def]
    """The hook, pointed at the fake package's modules only."""
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(_compiled, "_stale", [])
    monkeypatch.setattr(_compiled, "_missing", [])
    monkeypatch.setattr(_compiled._SourceFirst, "_all_source", None)
    monkeypatch.setattr(_compiled._SourceFirst, "needs", frozenset())
    monkeypatch.setattr(_compiled, "NO_EXTENSIONS", False)
    monkeypatch.setattr(_compiled, "_CHECKOUT", True)

    def names(*leaves: str) -> None:
        monkeypatch.setattr(_compiled._SourceFirst, "names", frozenset(f"fakepkg_compiled.{n}" for n in leaves))

    yield names
    for name in [n for n in sys.modules if n.startswith("fakepkg_compiled")]:
        del sys.modules[name]


def test_a_source_newer_than_its_build_is_loaded_and_reported(fake, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    pkg = _fake_package(tmp_path, newer=("mod",))
    fake("mod")
    module = importlib.import_module("fakepkg_compiled.mod")
    assert module.WHERE == "source" and module.__file__ == str(pkg / "mod.py")
    assert _compiled.stale() == ["fakepkg_compiled.mod"]


def test_one_stale_build_sends_the_whole_list_to_source(fake, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    pkg = _fake_package(tmp_path, newer=("b",), leaves=("a", "b"))
    fake("a", "b")
    # "a"'s build is fresh, but it goes with "b"'s stale one: both load from source
    assert importlib.import_module("fakepkg_compiled.a").__file__ == str(pkg / "a.py")
    assert importlib.import_module("fakepkg_compiled.b").__file__ == str(pkg / "b.py")
    assert _compiled.stale() == ["fakepkg_compiled.b"]


def test_a_missing_build_sends_the_whole_list_to_source(fake, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A compile that failed for one module (setup.py skips it and builds the rest): the builds that
    exist would import its types from its source and fail, so all of the list loads from source."""
    pkg = _fake_package(tmp_path, newer=(), leaves=("a", "b"))
    (pkg / ("b" + importlib.machinery.EXTENSION_SUFFIXES[0])).unlink()  # b's build
    fake("a", "b")
    assert importlib.import_module("fakepkg_compiled.a").__file__ == str(pkg / "a.py")
    assert importlib.import_module("fakepkg_compiled.b").__file__ == str(pkg / "b.py")
    assert _compiled.missing() == ["fakepkg_compiled.b"] and _compiled.stale() == []
    assert "no build of fakepkg_compiled.b" in (_compiled.warning() or "")


def test_a_serving_command_logs_why_the_build_is_unused(fake, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                        caplog: pytest.LogCaptureFixture) -> None:
    """log_start (flexinfer proxy and serve at start): the primitives' implementation always, and
    the warning only when the built request path was loaded from its source."""
    from flexinfer import _speedups

    log = logging.getLogger("test.compiled")
    with caplog.at_level(logging.INFO, logger="test.compiled"):
        _compiled.log_start(log)
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("INFO", f"speedups: {_speedups.IMPLEMENTATION}")]
    caplog.clear()
    pkg = _fake_package(tmp_path, newer=(), leaves=("a", "b"))
    (pkg / ("b" + importlib.machinery.EXTENSION_SUFFIXES[0])).unlink()
    fake("a", "b")
    importlib.import_module("fakepkg_compiled.a")
    with caplog.at_level(logging.INFO, logger="test.compiled"):
        _compiled.log_start(log)
    assert [r.levelname for r in caplog.records] == ["INFO", "WARNING"]
    assert caplog.records[1].getMessage() == _compiled.warning() and "fakepkg_compiled.b" in caplog.records[1].getMessage()


def test_a_missing_cimported_primitive_sends_the_list_to_source(fake, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The request path's builds cimport primitives' builds (CIMPORTED): without one, they load
    from source; with it, they are left to Python's finder."""
    pkg = _fake_package(tmp_path, newer=(), leaves=("a", "prim"))
    fake("a")
    monkeypatch.setattr(_compiled._SourceFirst, "needs", frozenset({"fakepkg_compiled.prim", "fakepkg_compiled.gone"}))
    assert importlib.import_module("fakepkg_compiled.a").__file__ == str(pkg / "a.py")
    assert _compiled.missing() == ["fakepkg_compiled.gone"]


def test_every_cimported_primitive_is_one_the_pxds_cimport() -> None:
    """CIMPORTED names exactly the primitives' builds that the request path's .pxd files cimport."""
    cimported = set()
    for pxd in ROOT.joinpath("flexinfer").rglob("*.pxd"):
        if "_speedups" in pxd.parts:
            continue
        for line in pxd.read_text().splitlines():
            words = line.split()
            if len(words) > 2 and words[0] == "from" and words[1].startswith("flexinfer._speedups."):
                cimported.add(words[1])
    assert cimported == set(_compiled.CIMPORTED)


def test_an_installed_package_is_trusted_as_installed(fake, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # an installer writes files in any order: outside a checkout, times are not compared
    _fake_package(tmp_path, newer=("mod",))
    fake("mod")
    monkeypatch.setattr(_compiled, "_CHECKOUT", False)
    with pytest.raises(ImportError):  # the (bogus) build is what Python's finder loads
        importlib.import_module("fakepkg_compiled.mod")
    assert _compiled.stale() == []


def test_this_checkout_is_one() -> None:
    assert _compiled._in_checkout()


def test_the_switch_loads_the_source_of_a_fresh_build(fake, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = _fake_package(tmp_path, newer=())
    fake("mod")
    monkeypatch.setattr(_compiled, "NO_EXTENSIONS", True)
    assert importlib.import_module("fakepkg_compiled.mod").__file__ == str(pkg / "mod.py")
    assert _compiled.stale() == []


def test_fresh_builds_are_left_to_pythons_finder(fake, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    _fake_package(tmp_path, newer=(), leaves=("a", "b"))
    fake("a", "b")
    importlib.import_module("fakepkg_compiled")
    pkg_path = sys.modules["fakepkg_compiled"].__path__
    assert _compiled._SourceFirst.find_spec("fakepkg_compiled.a", pkg_path) is None
    with pytest.raises(ImportError):  # Python's own finder takes the (bogus) build
        importlib.import_module("fakepkg_compiled.a")
    assert _compiled.stale() == []


def test_names_outside_the_list_are_not_touched(tmp_path: Path) -> None:
    assert _compiled._SourceFirst.find_spec("json.decoder", [str(tmp_path)]) is None


def _pxd_classes(path: Path) -> dict[str, tuple[str | None, set[str]]]:
    """Each ``cdef class`` of a .pxd: its declared base (or None) and its declared attributes."""
    out: dict[str, tuple[str | None, set[str]]] = {}
    current = ""
    for raw in path.read_text().splitlines():
        line = raw.partition("#")[0].rstrip()  # a comment after a declaration is not a name
        if line.startswith("cdef class "):
            head = line.removeprefix("cdef class ").rstrip(":")
            current, _, base = head.partition("(")
            out[current] = (base.rstrip(")") or None, set())
        elif line.strip() == "cdef dict __dict__":  # the source's "__dict__" slot
            out[current][1].add("__dict__")
        elif line.strip().startswith("cdef public "):  # "object" or an extension type (a typed slot)
            _type, _, names = line.strip().removeprefix("cdef public ").partition(" ")
            out[current][1].update(n.strip() for n in names.split(","))
    return out


def _source_attrs(path: Path) -> dict[str, set[str]]:
    """Per class of a source file, read from its AST (a build may keep neither): ``__slots__`` and
    the class-level annotations (a mixin's attributes that its subclass owns)."""
    out: dict[str, set[str]] = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef):
            names: set[str] = set()
            for item in node.body:
                if (isinstance(item, ast.Assign) and len(item.targets) == 1
                        and isinstance(item.targets[0], ast.Name) and item.targets[0].id == "__slots__"):
                    names.update(ast.literal_eval(item.value))
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    names.add(item.target.id)
            out[node.name] = names
    return out


def test_every_pxd_declares_exactly_the_attributes_of_its_classes() -> None:
    """A .pxd's class holds its source's slots and annotated attributes, less those its declared
    base holds: a slot added to the source and not to the .pxd fails here, not at run time."""
    pxds = [p for p in sorted(ROOT.joinpath("flexinfer").rglob("*.pxd")) if "_speedups" not in p.parts]
    assert pxds, "no .pxd of the request path"
    declared: dict[str, set[str]] = {}
    classes: list[tuple[Path, str, str | None, set[str]]] = []
    for pxd in pxds:
        name = ".".join(pxd.relative_to(ROOT).with_suffix("").parts)
        assert name in _compiled.MODULES, f"{pxd}: a .pxd for a module that is not compiled"
        attrs = _source_attrs(pxd.with_suffix(".py"))
        for cls_name, (base, names) in _pxd_classes(pxd).items():
            declared[cls_name] = names
            classes.append((pxd, cls_name, base, attrs[cls_name]))
    for pxd, cls_name, base, source in classes:
        inherited = declared[base] if base else set()
        assert not (declared[cls_name] & inherited), (pxd, cls_name, "declared twice")
        assert declared[cls_name] == source - inherited, (pxd, cls_name)


TYPED = (
    "import json\n"
    "from flexinfer.http.client import UpstreamPool\n"
    "from flexinfer.proxy import forward\n"
    "from flexinfer.settings import UpstreamSettings\n"
    "class StandIn:\n"
    "    headers: list = []\n"
    "    peer = '10.0.0.1:1'\n"
    "out = {}\n"
    "try:\n"
    "    forward.upstream_headers(StandIn(), b'rid', False)\n"
    "    out['argument'] = 'taken'\n"
    "except TypeError:\n"
    "    out['argument'] = 'refused'\n"
    "pool = UpstreamPool('127.0.0.1', 1, UpstreamSettings())\n"
    "try:\n"
    "    pool._idle = ()\n"
    "    out['slot'] = 'taken'\n"
    "except TypeError:\n"
    "    out['slot'] = 'refused'\n"
    "import asyncio\n"
    "from flexinfer.http.client import _Conn\n"
    "from flexinfer.proxy.usage import UsageTap\n"
    "loop = asyncio.new_event_loop()\n"
    "for key, obj, attr in (('framing', _Conn(pool, loop), 'framing'), ('clock', UsageTap(), 'clock')):\n"
    "    try:\n"
    "        setattr(obj, attr, StandIn())\n"
    "        out[key] = 'taken'\n"
    "    except TypeError:\n"
    "        out[key] = 'refused'\n"
    "loop.close()\n"
    "print(json.dumps(out))\n"
)


def test_the_source_takes_any_object_where_it_annotates_a_class() -> None:
    assert run_json(TYPED, "1") == {"argument": "taken", "slot": "taken", "framing": "taken", "clock": "taken"}


@pytest.mark.skipif(not built(), reason="request path not compiled; run `make ext`")
def test_the_build_types_what_the_pxd_types() -> None:
    """The .pxd's cimports type the annotated arguments (forward.pxd) and its typed slots their
    values (client.pxd; the body reader and the SSE clock, cimported from the primitives' .pxd):
    the build refuses a stand-in there. A cimport lost from a .pxd (the build then reads such an
    argument's attributes by name again, silently slower) fails here."""
    assert run_json(TYPED, None) == {"argument": "refused", "slot": "refused", "framing": "refused",
                                     "clock": "refused"}



NO_CYTHON = (
    "import importlib, json, sys\n"
    "sys.modules['cython'] = None  # import cython raises ImportError: an install without Cython\n"
    "from flexinfer import _compiled\n"
    "mods = [importlib.import_module(n) for n in _compiled.MODULES]\n"
    "from flexinfer.http.head import request_line\n"
    "from flexinfer.proxy.metrics import ProxyMetrics\n"
    "m = ProxyMetrics()\n"
    "m.count('a', 200)\n"
    "m.count('a', 200)\n"
    "print(json.dumps({'loaded': sorted({m.__file__.rpartition('.')[2] for m in mods}),\n"
    "                  'stand_in': 'flexinfer._nocython' in sys.modules,\n"
    "                  'method': request_line('1.1', b'GET', b'/'), 'count': m.totals('a')[0][200]}))\n"
)


def test_the_source_runs_without_cython() -> None:
    """Cython is a build requirement, not a runtime one (the image has none): the sources that say
    ``@cython.annotation_typing(False)`` import flexinfer._nocython's no-op instead, and work."""
    assert run_json(NO_CYTHON, "1") == {"loaded": ["py"], "stand_in": True, "method": "GET", "count": 2}
