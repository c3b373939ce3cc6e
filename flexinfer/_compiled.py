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
* in a source checkout, any module of the list has a ``.py`` newer than its compiled build (an
  edited source after the last ``make ext``): stale compiled code never shadows the source you are
  reading, and the builds, which import each other's extension types, are used all together or not
  at all. ``make ext`` rebuilds them. (An installed package is trusted as installed.) Or
* some of the list is built but a build it needs is missing: a module of the list, or a primitive
  of :data:`CIMPORTED` (``setup.py`` skips an extension whose compile fails and builds the rest; the
  builds could not load without it). :func:`missing` names it, :func:`warning` says it.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import logging

__all__ = ["CIMPORTED", "MODULES", "NO_EXTENSIONS", "implementation", "install", "log_start", "missing", "stale",
           "warning"]

#: Dotted names of the compiled request path, in the order a request meets them.
MODULES: tuple[str, ...] = (
    "flexinfer.http.flow",
    "flexinfer.http.closing",
    "flexinfer.http.head",
    "flexinfer.http.responses",
    "flexinfer.http.request",
    "flexinfer.http.task",
    "flexinfer.http.protocol",
    "flexinfer.http.client",
    "flexinfer.http.upstream",
    "flexinfer.proxy.context",
    "flexinfer.proxy.metrics",
    "flexinfer.proxy.routing",
    "flexinfer.proxy.extract",
    "flexinfer.proxy.usage",
    "flexinfer.proxy.pipeline",
    "flexinfer.proxy.forward",
)

#: The primitives' builds whose types and functions the compiled request path cimports (client.pxd:
#: ``BodyFrame``; request.pxd: ``frame_chunk``; usage.pxd: ``SseClock``). A build checks what it
#: cimports when it loads, so without one of these the request path's builds cannot load at all.
CIMPORTED: tuple[str, ...] = ("flexinfer._speedups.bodyframe_c", "flexinfer._speedups.chunkframe_c",
                              "flexinfer._speedups.ssescan_c")

NO_EXTENSIONS: bool = os.environ.get("FLEXINFER_NO_EXTENSIONS", "") not in ("", "0")

#: Modules whose compiled build was older than the source when the request path was imported.
_stale: list[str] = []
#: Builds that were missing when the request path was imported, though some of it was built (a
#: compile that failed for one extension: setup.py skips it and builds the rest).
_missing: list[str] = []


def _compiled_path(directory: str, leaf: str) -> str | None:
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = os.path.join(directory, leaf + suffix)
        if os.path.exists(path):
            return path
    return None


def _package_dir() -> str:
    return os.path.dirname(os.path.abspath(__file__))


def _files(name: str, root: str) -> tuple[str, str | None]:
    """The source of ``name`` (a dotted name under the package at ``root``) and its build, if any."""
    parts = name.split(".")
    directory = os.path.join(root, *parts[1:-1])
    return os.path.join(directory, parts[-1] + ".py"), _compiled_path(directory, parts[-1])


def _in_checkout() -> bool:
    """A source checkout (``setup.py`` beside the package), where sources get edited after a build.
    An installed package is left alone: an installer writes its files in any order, so their
    times say nothing about which came from which."""
    return os.path.exists(os.path.join(os.path.dirname(_package_dir()), "setup.py"))


def _is_stale(source: str, built: str) -> bool:
    return (_CHECKOUT and os.path.exists(source)
            and os.stat(built).st_mtime < os.stat(source).st_mtime)


def _blockers(names: frozenset[str], needs: frozenset[str], root: str) -> tuple[bool, list[str], list[str]]:
    """Whether any of ``names`` (under the package at ``root``) is built, and why those builds must
    not be used: ``(built, stale, missing)``, the modules whose build is older than their source, and
    the builds they cannot go without that are absent (a module of ``names``, or one of ``needs``:
    the primitives they cimport). Nothing to block when nothing is built (a pure install: the
    source, as it should); when nothing blocks, every module of ``names`` is built."""
    files = [(name, *_files(name, root)) for name in sorted(names)]
    if all(built is None for _, _, built in files):
        return False, [], []
    stale = [name for name, source, built in files if built is not None and _is_stale(source, built)]
    missing = [name for name, _, built in files if built is None]
    missing += [name for name in sorted(needs) if _files(name, root)[1] is None]
    return True, stale, missing


class _SourceFirst:
    """A meta-path finder for :data:`MODULES` only: the ``.py`` when the compiled build must not
    be used (see the module docstring), else nothing (Python's own finder loads the build).

    The builds go together (one extension type derives from another's, and a build checks the
    types it imports), so when one module's build is stale or missing, or a primitive they
    cimport has no build, every module of the list loads from its source."""

    names: frozenset[str] = frozenset(MODULES)
    needs: frozenset[str] = frozenset(CIMPORTED)
    _all_source: bool | None = None  # decided once, at the first module of the list

    @classmethod
    def find_spec(cls, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        if fullname not in cls.names or not path:
            return None
        leaf = fullname.rpartition(".")[2]
        for directory in path:
            source = os.path.join(directory, leaf + ".py")
            if not os.path.exists(source):
                continue
            if _compiled_path(directory, leaf) is None:
                return None  # nothing compiled here: Python's own finder loads the source
            if not cls._source_wanted(fullname, directory):
                return None
            loader = importlib.machinery.SourceFileLoader(fullname, source)
            return importlib.util.spec_from_file_location(fullname, source, loader=loader)
        return None

    @classmethod
    def _source_wanted(cls, fullname: str, directory: str) -> bool:
        if NO_EXTENSIONS:
            return True
        if cls._all_source is None:
            root = directory
            for _ in range(fullname.count(".") - 1):
                root = os.path.dirname(root)
            _, stale, missing = _blockers(cls.names, cls.needs, root)
            _stale.extend(stale)
            _missing.extend(missing)
            cls._all_source = bool(stale or missing)
        return cls._all_source


#: Whether the stale check applies (a source checkout, see _in_checkout).
_CHECKOUT: bool = _in_checkout()


def install() -> None:
    """Put the hook in front of Python's finders (once)."""
    if _SourceFirst not in sys.meta_path:
        sys.meta_path.insert(0, _SourceFirst)


def implementation() -> dict[str, str]:
    """``"c"`` (its compiled build) or ``"py"`` (its source) for each module of :data:`MODULES`, by
    the files, without importing them: the builds go together (see :class:`_SourceFirst`)."""
    built, stale_, missing_ = _blockers(frozenset(MODULES), _SourceFirst.needs, _package_dir())
    kind = "c" if built and not NO_EXTENSIONS and not stale_ and not missing_ else "py"
    return dict.fromkeys(MODULES, kind)


def stale() -> list[str]:
    """The modules loaded from source because their compiled build was older than it."""
    return list(_stale)


def missing() -> list[str]:
    """The builds that were missing though the request path was built (so it loaded from source)."""
    return list(_missing)


def warning() -> str | None:
    """What a serving command logs when the request path, built, was loaded from its source (None:
    nothing to say)."""
    if _stale:
        return ("compiled request path older than its source, using the source of "
                f"{', '.join(_stale)}; run `make ext`")
    if _missing:
        return f"compiled request path incomplete (no build of {', '.join(_missing)}), using its source; run `make ext`"
    return None


def log_start(logger: logging.Logger) -> None:
    """What a serving command (``proxy``, ``serve``) logs at start: the primitives' implementation,
    then :func:`warning` when the built request path was loaded from its source."""
    from flexinfer import _speedups

    logger.info("speedups: %s", _speedups.IMPLEMENTATION)
    unused = warning()
    if unused is not None:
        logger.warning("%s", unused)
