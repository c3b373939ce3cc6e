"""Fixtures that run every speedups test on both twins (compiled ``c`` and reference ``py``).

A ``c`` case skips, saying why, when the extension is not built or when
FLEXINFER_NO_EXTENSIONS is set (the pure-Python CI run). Run ``make ext`` to build.
"""

from __future__ import annotations

from types import ModuleType

import pytest

from flexinfer import _speedups

IMPLS = ("py", "c")


class BodySink:
    """httptools callbacks (the oracle of the body framing tests): the body pieces it read, and
    whether the body ended."""

    def __init__(self) -> None:
        self.body: list[bytes] = []
        self.done = False

    def on_body(self, piece: bytes) -> None:
        self.body.append(piece)

    def on_message_complete(self) -> None:
        self.done = True


def split_reads(wire: bytes, cuts: list[int]) -> list[bytes]:
    """``wire`` cut into reads at ``cuts`` (each taken modulo ``len(wire) + 1``; no empty reads)."""
    points = sorted({c % (len(wire) + 1) for c in cuts})
    reads, last = [], 0
    for p in [*points, len(wire)]:
        reads.append(wire[last:p])
        last = p
    return [r for r in reads if r]


def chunked_reads(mod: ModuleType, reads: list[bytes], max_line: int = 4096) -> tuple[str, bytes, bool, int]:
    """("ok" | "error", the payload so far, whether the body ended, bytes after the end) of
    ``mod.ChunkedBody`` (a bodyframe twin) fed ``reads`` one by one."""
    dec = mod.ChunkedBody(max_line)
    got = []
    for r in reads:
        try:
            got.append(dec.feed(r))
        except mod.FramingError:
            return "error", b"".join(got), dec.done, dec.extra
        if dec.done:
            break
    return "ok", b"".join(got), dec.done, dec.extra


def load(name: str, impl: str) -> ModuleType:
    """The ``impl`` twin of primitive ``name``, or skip the test with the reason."""
    if impl == "c" and _speedups.NO_EXTENSIONS:
        pytest.skip("FLEXINFER_NO_EXTENSIONS is set: compiled twins are off")
    try:
        return _speedups.load(name, impl)
    except ImportError as exc:
        pytest.skip(f"{name}_c is not built ({exc}); run `make ext`")


@pytest.fixture(params=IMPLS)
def impl(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def hashring(impl: str) -> ModuleType:
    return load("hashring", impl)


@pytest.fixture
def tokenbucket(impl: str) -> ModuleType:
    return load("tokenbucket", impl)


@pytest.fixture
def prefixhash(impl: str) -> ModuleType:
    return load("prefixhash", impl)


@pytest.fixture
def twins() -> dict[str, tuple[ModuleType, ModuleType]]:
    """(py, c) module pairs for the agreement tests; skips when the c side is missing."""
    return {name: (load(name, "py"), load(name, "c")) for name in _speedups.PRIMITIVES}


@pytest.fixture
def schedkern(impl: str) -> ModuleType:
    return load("schedkern", impl)
