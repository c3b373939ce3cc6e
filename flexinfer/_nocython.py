"""The few ``cython`` pure-mode decorators the compiled request path's sources use, as no-ops.

Owns: the stand-in that a source imports as ``cython`` where Cython is not installed (an image or a
pure install: Cython is a build requirement, not a runtime one). In a build, Cython reads the real
decorators at compile time (``import cython`` is compile-time only there); in a pure run with
Cython installed, Cython's own shadow module plays the same no-op part.
Must not: import anything, or grow decorators the sources do not use.

Used as::

    try:
        import cython
    except ImportError:  # no Cython here: its decorators do nothing in pure Python
        from flexinfer import _nocython as cython
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

#: ``cython.compiled``: False outside a build (a source branches on it where the build calls C).
compiled = False


def annotation_typing(enabled: bool) -> Callable[[F], F]:
    """``@cython.annotation_typing(False)``: the build ignores the function's annotations, so that
    a ``cpdef`` declared in the ``.pxd`` with untyped arguments matches it (Cython refuses a
    declaration whose argument types differ from what it reads in ``int`` or ``list[...]``
    annotations). The annotations stay for mypy and the reader."""

    def keep(func: F) -> F:
        return func

    return keep
