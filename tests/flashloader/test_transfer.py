"""flash-loader copy engine: each copy path and its fallbacks, and a final name never holding a partial
or unverified file (faults injected through a whole run)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from flexinfer.flashloader import transfer as ftransfer
from flexinfer.flashloader.config import FlashError
from tests.flashloader.helpers import MiB, listing, make_tree, run_load

# ---- copying ---------------------------------------------------------------------------------


@pytest.mark.parametrize("methods", [("copy_file_range",), ("sendfile",), ("buffered",), ftransfer.COPY_METHODS])
def test_copy_data_each_method(tmp_path: Path, methods: tuple[str, ...]) -> None:
    data = os.urandom(3 * MiB + 123)
    (tmp_path / "s").write_bytes(data)
    seen: list[int] = []
    with open(tmp_path / "s", "rb") as s, open(tmp_path / "d", "wb") as d:
        used = ftransfer.copy_data(s.fileno(), d.fileno(), len(data), 64 * 1024, seen.append, methods)
    assert (tmp_path / "d").read_bytes() == data
    assert sum(seen) == len(data)
    assert used == methods[0]


def test_copy_data_falls_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = os.urandom(MiB)
    (tmp_path / "s").write_bytes(data)

    def no_cfr(*a: object) -> int:
        raise OSError(errno.EXDEV, "cross-device")

    def no_sendfile(*a: object) -> int:
        raise OSError(errno.EINVAL, "invalid")

    monkeypatch.setattr(os, "copy_file_range", no_cfr)
    with open(tmp_path / "s", "rb") as s, open(tmp_path / "d", "wb") as d:
        assert ftransfer.copy_data(s.fileno(), d.fileno(), len(data), 4096, lambda n: None) == "sendfile"
    assert (tmp_path / "d").read_bytes() == data
    monkeypatch.setattr(os, "sendfile", no_sendfile)
    with open(tmp_path / "s", "rb") as s, open(tmp_path / "d2", "wb") as d:
        assert ftransfer.copy_data(s.fileno(), d.fileno(), len(data), 4096, lambda n: None) == "buffered"
    assert (tmp_path / "d2").read_bytes() == data


def test_copy_data_short_kernel_copy_continues_with_next_method(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """copy_file_range returning 0 before EOF (seen on some filesystems) hands over at the same offset."""
    data = os.urandom(MiB)
    (tmp_path / "s").write_bytes(data)
    real = os.copy_file_range
    calls = {"n": 0}

    def short(src: int, dst: int, count: int, offset_src: int | None = None, offset_dst: int | None = None) -> int:
        calls["n"] += 1
        return real(src, dst, min(count, 1000), offset_src, offset_dst) if calls["n"] == 1 else 0

    monkeypatch.setattr(os, "copy_file_range", short)
    with open(tmp_path / "s", "rb") as s, open(tmp_path / "d", "wb") as d:
        used = ftransfer.copy_data(s.fileno(), d.fileno(), len(data), 4096, lambda n: None)
    assert used == "copy_file_range+sendfile"
    assert (tmp_path / "d").read_bytes() == data


# ---- no partial or unverified file under a final name, through a whole run -------------------


def _half_then_fail(src_fd: int, dst_fd: int, size: int, buf: int, on_chunk: ftransfer.ChunkCallback) -> str:
    half = os.pread(src_fd, size // 2, 0)
    os.write(dst_fd, half)
    on_chunk(len(half))
    raise OSError(errno.EIO, "injected I/O error")


def test_interrupted_copy_leaves_no_partial_file(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    make_tree(src, {"big.bin": MiB, "old.bin": 1000})
    make_tree(dst, {"old.bin": b"previous"})  # a different size: will be replaced... or not
    with pytest.raises(FlashError, match="injected I/O error"):
        run_load(src, dst, copier=_half_then_fail, concurrency=1)
    assert listing(dst) == {"old.bin": b"previous"}  # old content intact, no partial big.bin, no tmp


def test_fault_inside_kernel_copy_mid_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real copy path, failing after the first chunk: no fallback (bytes moved), no partial file."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    make_tree(src, {"big.bin": 4 * MiB})
    monkeypatch.setattr(ftransfer, "KERNEL_CHUNK", MiB)
    real = os.copy_file_range
    calls = {"n": 0}

    def flaky(*args: int) -> int:
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(errno.EIO, "disk went away")
        return real(*args)

    monkeypatch.setattr(os, "copy_file_range", flaky)
    with pytest.raises(FlashError, match=r"big\.bin.*disk went away"):
        run_load(src, dst, buffer_kb=1024)
    assert listing(dst) == {}


def test_verify_sha256_catches_corrupted_copy(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    make_tree(src, {"w.bin": 200_000})

    def corrupting(src_fd: int, dst_fd: int, size: int, buf: int, on_chunk: ftransfer.ChunkCallback) -> str:
        used = ftransfer.copy_data(src_fd, dst_fd, size, buf, on_chunk)
        os.pwrite(dst_fd, b"\xff", 1234)
        return used

    with pytest.raises(FlashError, match=r"sha256 mismatch after copying w\.bin"):
        run_load(src, dst, copier=corrupting, verify="sha256")
    assert listing(dst) == {}
    run_load(src, dst, copier=corrupting, verify="size")  # size cannot see it (that is the point)
    assert (dst / "w.bin").read_bytes() != (src / "w.bin").read_bytes()


def test_truncated_copy_is_always_caught(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    make_tree(src, {"w.bin": 5000})

    def truncating(src_fd: int, dst_fd: int, size: int, buf: int, on_chunk: ftransfer.ChunkCallback) -> str:
        os.write(dst_fd, os.pread(src_fd, size - 1, 0))
        return "buffered"

    with pytest.raises(FlashError, match="size mismatch"):
        run_load(src, dst, copier=truncating)
    assert listing(dst) == {}
