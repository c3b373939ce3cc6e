"""The request path compiled from its own source: which modules, and whether the build is used.

Owns: :data:`MODULES`, the modules of one request's path (the HTTP core and the proxy's
per-request steps) that ``setup.py`` also compiles with Cython *from the same ``.py`` file*, so
the Python source is the pure twin of the compiled module by construction; the import hook that
chooses between the two; and :func:`implementation`, which says what was loaded.
Must not: import anything from flexinfer (it runs first, from ``flexinfer/__init__.py``), or cost
more at import than a few ``stat`` calls.

A compiled module ``name.cpython-*.so`` sits next to ``name.py``; Python's own finder prefers it.
The hook installed by :func:`install` puts the ``.py`` first instead when

* ``FLEXINFER_NO_EXTENSIONS`` is set (anything but ``""``/``"0"``, the rule of ``setup.py`` and
  ``flexinfer._speedups``): the pure-Python test run and pure installs; or
* the ``.py`` is newer than its compiled module (an edited source after the last ``make ext``):
  stale compiled code never shadows the source you are reading. ``make ext`` rebuilds it.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

__all__ = ["MODULES", "NO_EXTENSIONS", "implementation", "install", "stale"]

#: Dotted names of the compiled request path, in the order a request meets them.
MODULES: tuple[str, ...] = (
    "flexinfer.http.flow",
    "flexinfer.http.closing",
    "flexinfer.http.head",
    "flexinfer.http.responses",
    "flexinfer.http.request",
    "flexinfer.http.protocol",
    "flexinfer.http.client",
    "flexinfer.http.upstream",
    "flexinfer.proxy.context",
    "flexinfer.proxy.extract",
    "flexinfer.proxy.pipeline",
    "flexinfer.proxy.forward",
)

NO_EXTENSIONS: bool = os.environ.get("FLEXINFER_NO_EXTENSIONS", "") not in ("", "0")

_NAMES = frozenset(MODULES)
#: Modules whose compiled build was older than the source when they were imported.
_stale: list[str] = []


def _compiled_path(directory: str, leaf: str) -> str | None:
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = os.path.join(directory, leaf + suffix)
        if os.path.exists(path):
            return path
    return None


class _SourceFirst:
    """A meta-path finder for :data:`MODULES` only: the ``.py`` when the compiled build must not
    be used (see the module docstring), else nothing (Python's own finder loads the build)."""

    @classmethod
    def find_spec(cls, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        if fullname not in _NAMES or not path:
            return None
        leaf = fullname.rpartition(".")[2]
        for directory in path:
            source = os.path.join(directory, leaf + ".py")
            if not os.path.exists(source):
                continue
            built = _compiled_path(directory, leaf)
            if built is None:
                return None  # nothing compiled here: Python's own finder loads the source
            if not NO_EXTENSIONS:
                if os.stat(built).st_mtime >= os.stat(source).st_mtime:
                    return None
                _stale.append(fullname)
            loader = importlib.machinery.SourceFileLoader(fullname, source)
            return importlib.util.spec_from_file_location(fullname, source, loader=loader)
        return None


def install() -> None:
    """Put the hook in front of Python's finders (once)."""
    if _SourceFirst not in sys.meta_path:
        sys.meta_path.insert(0, _SourceFirst)


def _uses_build(name: str) -> bool:
    """Whether importing ``name`` loads its compiled build (by the files, without importing it)."""
    if NO_EXTENSIONS:
        return False
    parts = name.split(".")
    directory = os.path.join(os.path.dirname(os.path.abspath(__file__)), *parts[1:-1])
    source = os.path.join(directory, parts[-1] + ".py")
    built = _compiled_path(directory, parts[-1])
    if built is None:
        return False
    return not os.path.exists(source) or os.stat(built).st_mtime >= os.stat(source).st_mtime


def implementation() -> dict[str, str]:
    """``"c"`` (its compiled build) or ``"py"`` (its source) for each module of :data:`MODULES`."""
    return {name: "c" if _uses_build(name) else "py" for name in MODULES}


def stale() -> list[str]:
    """The modules loaded from source because their compiled build was older than it."""
    return list(_stale)
