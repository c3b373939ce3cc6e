"""chained_block_hashes contract, run on both twins, against the xxhash package."""

from __future__ import annotations

from types import ModuleType

import pytest
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

SETTINGS = settings(
    deadline=None, max_examples=80, suppress_health_check=[HealthCheck.function_scoped_fixture]
)

texts = st.text(st.characters(codec="utf-8") | st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF))


def spec(data: bytes, block_size: int = 64, max_blocks: int = 128) -> list[int]:
    """The chain written plainly with the xxhash package."""
    data = data[: block_size * max_blocks]
    out: list[int] = []
    seed = 0
    for start in range(0, len(data), block_size):
        seed = xxhash.xxh3_64_intdigest(data[start : start + block_size], seed)
        out.append(seed)
    return out


def test_empty_and_zero_blocks(prefixhash: ModuleType) -> None:
    assert prefixhash.chained_block_hashes("") == []
    assert prefixhash.chained_block_hashes(b"") == []
    assert prefixhash.chained_block_hashes("abc", max_blocks=0) == []


def test_defaults_and_partial_block(prefixhash: ModuleType) -> None:
    data = bytes(range(256)) * 3  # 768 bytes = 12 full blocks
    hashes = prefixhash.chained_block_hashes(data)
    assert len(hashes) == 12 and hashes == spec(data)
    assert len(prefixhash.chained_block_hashes(data + b"x")) == 13  # trailing partial block counts
    assert prefixhash.chained_block_hashes(b"hi") == [xxhash.xxh3_64_intdigest(b"hi", 0)]
    assert prefixhash.DEFAULT_BLOCK_SIZE == 64 and prefixhash.DEFAULT_MAX_BLOCKS == 128


def test_long_prompt_is_capped(prefixhash: ModuleType) -> None:
    prompt = ("You are a helpful assistant. " * 8000)[:220_000]
    hashes = prefixhash.chained_block_hashes(prompt)
    assert len(hashes) == 128
    assert hashes == spec(prompt.encode()[:8192])
    wide = "中文" * 110_000
    assert prefixhash.chained_block_hashes(wide) == spec(wide.encode()[:8192])


@SETTINGS
@given(text=texts, block_size=st.integers(1, 80), max_blocks=st.integers(0, 12))
def test_str_matches_spec(prefixhash: ModuleType, text: str, block_size: int, max_blocks: int) -> None:
    raw = text.encode("utf-8", "surrogatepass")
    expected = spec(raw, block_size, max_blocks)
    assert prefixhash.chained_block_hashes(text, block_size, max_blocks) == expected
    assert prefixhash.chained_block_hashes(raw, block_size, max_blocks) == expected


@SETTINGS
@given(data=st.binary(max_size=700), block_size=st.integers(1, 300), max_blocks=st.integers(0, 10))
def test_bytes_like_matches_spec(
    prefixhash: ModuleType, data: bytes, block_size: int, max_blocks: int
) -> None:
    expected = spec(data, block_size, max_blocks)
    assert prefixhash.chained_block_hashes(data, block_size, max_blocks) == expected
    assert prefixhash.chained_block_hashes(bytearray(data), block_size, max_blocks) == expected
    assert prefixhash.chained_block_hashes(memoryview(data), block_size, max_blocks) == expected


def test_shared_prefix_gives_shared_hashes(prefixhash: ModuleType) -> None:
    system = "S" * 64 * 5
    a = prefixhash.chained_block_hashes(system + "question one" * 20)
    b = prefixhash.chained_block_hashes(system + "question two" * 20)
    common = 0
    while common < min(len(a), len(b)) and a[common] == b[common]:
        common += 1
    assert common == 5  # the five system blocks; block 5 differs at its 10th byte


def test_a_changed_early_byte_changes_every_later_hash(prefixhash: ModuleType) -> None:
    base = bytes(64 * 10)
    changed = b"\x01" + base[1:]
    ha = prefixhash.chained_block_hashes(base)
    hb = prefixhash.chained_block_hashes(changed)
    assert all(x != y for x, y in zip(ha, hb, strict=True))


def test_argument_errors(prefixhash: ModuleType) -> None:
    with pytest.raises(ValueError):
        prefixhash.chained_block_hashes("x", block_size=0)
    with pytest.raises(ValueError):
        prefixhash.chained_block_hashes("x", max_blocks=-1)
    with pytest.raises(TypeError):
        prefixhash.chained_block_hashes("x", block_size=1.5)
    with pytest.raises(TypeError):
        prefixhash.chained_block_hashes(12345)
    with pytest.raises(TypeError):
        prefixhash.chained_block_hashes(memoryview(b"abcdef")[::2])  # not contiguous
    huge = prefixhash.chained_block_hashes(b"abc", block_size=2**70, max_blocks=2**70)
    assert huge == spec(b"abc", 10, 1)


@pytest.mark.parametrize("text", ["", "short", "You are a helpful assistant. " * 300, "naïve 🙂 " * 500])
def test_packed_is_the_list_as_machine_words(prefixhash: ModuleType, text: str) -> None:
    packed = prefixhash.chained_block_hashes(text, 64, 128, packed=True)
    assert packed.typecode == "Q" and list(packed) == prefixhash.chained_block_hashes(text, 64, 128)
