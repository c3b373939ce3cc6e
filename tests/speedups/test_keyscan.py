"""keyscan: the raw ``model`` key scan, compiled twin against the reference, and what it finds."""

from __future__ import annotations

from types import ModuleType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.speedups.conftest import load


@pytest.fixture
def keyscan(impl: str) -> ModuleType:
    return load("keyscan", impl)


@pytest.mark.parametrize(("body", "expected"), [
    (b"", (0, -1, False)),
    (b'{"model":"m"}', (1, 1, False)),
    (b'{"model":"a","model":"b"}', (2, 1, False)),
    (b'"model"model"', (1, 0, False)),  # like bytes.count: occurrences do not overlap
    (b'{"\\u006dodel":"m"}', (0, -1, True)),
    (b'{"x":"\\u00e9"}', (0, -1, False)),
    (b'\\u006', (0, -1, True)),
    (b'\\u00', (0, -1, False)),
    (b'"model', (0, -1, False)),
    (b'x"model"', (1, 1, False)),
    (b'{"content":"\\"model\\""}', (0, -1, False)),
])
def test_cases(keyscan: ModuleType, body: bytes, expected: tuple[int, int, bool]) -> None:
    assert keyscan.model_key_scan(body) == expected


_PIECES = st.sampled_from([b'"', b"model", b'"model"', b"\\", b"u006", b"\\u006", b"\\u00e9", b"m", b"x", b"\n",
                           b'\\"', b"\xff", b"\x00"])


@given(st.lists(_PIECES, max_size=40))
@settings(max_examples=500, deadline=None)
def test_twins_agree(pieces: list[bytes]) -> None:
    body = b"".join(pieces)
    py = load("keyscan", "py").model_key_scan(body)
    assert py == (body.count(b'"model"'), body.find(b'"model"'), b"\\u006" in body)
    try:
        c = load("keyscan", "c")
    except pytest.skip.Exception:
        return
    assert c.model_key_scan(body) == py


def test_rejects_non_bytes(keyscan: ModuleType) -> None:
    with pytest.raises(TypeError):
        keyscan.model_key_scan("model")
