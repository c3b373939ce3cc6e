"""Build script: compiles the optional Cython speedups when Cython and a compiler are present.

Two kinds: the primitives (``flexinfer/_speedups/<name>_c.pyx``, each beside its ``_py.py`` twin)
and the request path (``flexinfer._compiled.MODULES``, each compiled from its own ``.py``, which
stays its pure twin).

Set FLEXINFER_NO_EXTENSIONS=1 to install the pure-Python package only. A failed compile never
fails the install: the package falls back to the pure-Python twins at import time.
"""

from __future__ import annotations

import os
import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    """build_ext that degrades to pure Python when a compiler is missing or fails."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:
            print(f"flexinfer: building extensions failed ({exc}); using pure Python", file=sys.stderr)

    def build_extension(self, ext) -> None:  # type: ignore[no-untyped-def]
        try:
            super().build_extension(ext)
        except Exception as exc:
            print(f"flexinfer: skipping {ext.name} ({exc})", file=sys.stderr)


def compiled_request_path(here: str) -> tuple[str, ...]:
    """flexinfer._compiled.MODULES, read without importing the package (it may not be importable yet)."""
    import runpy

    return tuple(runpy.run_path(os.path.join(here, "flexinfer", "_compiled.py"))["MODULES"])


def extensions() -> list:
    if os.environ.get("FLEXINFER_NO_EXTENSIONS", "") not in ("", "0"):
        return []
    try:
        from Cython.Build import cythonize
    except ImportError:
        return []
    from setuptools import Extension

    here = os.path.dirname(os.path.abspath(__file__))
    pyx_dir = os.path.join(here, "flexinfer", "_speedups")
    sources = sorted(f for f in os.listdir(pyx_dir) if f.endswith("_c.pyx")) if os.path.isdir(pyx_dir) else []
    # the primitives: <name>_c.pyx beside its <name>_py.py twin
    primitives = [
        Extension(f"flexinfer._speedups.{src[:-4]}", [os.path.join("flexinfer", "_speedups", src)],
                  extra_compile_args=["-O3"])
        for src in sources
    ]
    # the request path: each module compiled from its own .py (the source is the pure twin)
    request_path = [
        Extension(name, [os.path.join(*name.split(".")) + ".py"], extra_compile_args=["-O2", "-g0"])
        for name in compiled_request_path(here)
    ]
    exts = cythonize(primitives, compiler_directives={"language_level": "3", "boundscheck": False,
                                                      "wraparound": False, "cdivision": True},
                     quiet=True)
    # Python semantics kept whole (bounds checks, negative indexes, Python division, tracebacks
    # with line numbers): these modules must behave exactly as their source does.
    exts += cythonize(request_path, compiler_directives={"language_level": "3", "binding": True},
                      quiet=True, nthreads=os.cpu_count() or 1)
    return exts


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})
