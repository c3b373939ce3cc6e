"""flash-loader run and command: whole copies on temp trees (exclusions, variants, equal sizes, sha256
repair, one failing file, symlink-only sources, progress) and ``flexinfer flash-load`` through
``flexinfer.cli.main``."""

from __future__ import annotations

import errno
import io
import os
from pathlib import Path

import pytest

from flexinfer.cli import main
from flexinfer.flashloader import command as fl
from flexinfer.flashloader import transfer as ftransfer
from flexinfer.flashloader.config import FlashError
from tests.flashloader.helpers import MiB, cfg_for, listing, make_tree, run_load

# ---- the run ---------------------------------------------------------------------------------


def test_full_copy(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "deep" / "dst"
    make_tree(src, {"config.json": b"{}", "model-1.bin": 2 * MiB + 7, "sub/dir/tok.json": 300, "empty": b"",
                    ".git/HEAD": b"ref", ".cache/x": b"y"})
    os.chmod(src / "config.json", 0o640)
    os.utime(src / "model-1.bin", ns=(1_600_000_000_000_000_000, 1_600_000_000_000_000_000))
    report = run_load(src, dst, concurrency=3, verify="sha256")
    assert listing(dst) == {k: v for k, v in listing(src).items() if not k.startswith((".git/", ".cache/"))}
    assert report.copied_files == 4 and report.excluded == 2
    assert report.copied_bytes == 2 * MiB + 7 + 2 + 300
    assert (dst / "config.json").stat().st_mode & 0o777 == 0o640
    assert (dst / "model-1.bin").stat().st_mtime_ns == 1_600_000_000_000_000_000
    assert not list(dst.rglob("*.flash-tmp"))


def test_variant_fp16_on_tree(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    make_tree(src, {"unet/m.safetensors": 400, "unet/m.fp16.safetensors": 200, "vae/m.safetensors": 100})
    report = run_load(src, dst, variant="fp16")
    assert sorted(listing(dst)) == ["unet/m.fp16.safetensors", "vae/m.safetensors"]
    assert report.variant_skipped == 1


def test_skip_equal_size(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    make_tree(src, {"a": b"AAAA", "b": b"BBBB", "c": b"CCCC"})
    make_tree(dst, {"a": b"xxxx", "b": b"xx"})  # a: same size (kept as is), b: different size
    report = run_load(src, dst)
    assert listing(dst) == {"a": b"xxxx", "b": b"BBBB", "c": b"CCCC"}
    assert (report.copied_files, report.unchanged) == (2, 1)
    again = run_load(src, dst)
    assert (again.copied_files, again.unchanged) == (0, 3)


def test_sha256_mode_repairs_equal_size_corruption(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    make_tree(src, {"a": b"AAAA", "b": b"BBBB"})
    make_tree(dst, {"a": b"AAAA", "b": b"BxBB"})
    report = run_load(src, dst, verify="sha256")
    assert listing(dst) == listing(src)
    assert (report.copied_files, report.unchanged) == (1, 1)


def test_error_in_one_file_cancels_the_rest_and_cleans_up(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    make_tree(src, {f"f{i}.bin": 64 * 1024 + i for i in range(12)})

    def fail_on_f3(src_fd: int, dst_fd: int, size: int, buf: int, on_chunk: ftransfer.ChunkCallback) -> str:
        if size == 64 * 1024 + 3:
            raise OSError(errno.EIO, "bad sector")
        return ftransfer.copy_data(src_fd, dst_fd, size, buf, on_chunk)

    with pytest.raises(FlashError, match=r"f3\.bin"):
        run_load(src, dst, copier=fail_on_f3, concurrency=4)
    left = listing(dst)
    assert "f3.bin" not in left and not any(k.endswith(".flash-tmp") for k in left)
    for k, v in left.items():  # whatever finished is complete
        assert v == (src / k).read_bytes()


def test_only_symlinks_warns(tmp_path: Path) -> None:
    src = tmp_path / "src"
    make_tree(tmp_path / "blobs", {"x": 10})
    src.mkdir()
    (src / "config.json").symlink_to(tmp_path / "blobs" / "x")
    out = io.StringIO()
    fl.flash_load(cfg_for(src, tmp_path / "dst"), out=out)
    assert "only symlinks" in out.getvalue()


# ---- the command -------------------------------------------------------------------------------


def test_cli_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    make_tree(src, {"m.safetensors": 300, "m.fp16.safetensors": 100, "logs/x": 5, "notes/y": 5})
    monkeypatch.delenv("FLASH_SRC", raising=False)
    assert main(["flash-load", "--src", str(src), "--dst", str(dst), "--variant", "fp16",
                 "--exclude", "logs/", "--exclude", "notes/,other/", "--concurrency", "2", "--verify", "true"]) == 0
    assert sorted(listing(dst)) == ["m.fp16.safetensors"]
    err = capsys.readouterr().err
    assert "copied 1 files" in err and "MB/s" in err


def test_cli_env_and_flag_override(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    make_tree(src, {"a": 10, "skip/b": 10})
    monkeypatch.setenv("FLASH_SRC", str(src))
    monkeypatch.setenv("FLASH_DST", str(tmp_path / "wrong"))
    monkeypatch.setenv("FLASH_EXCLUDE", "skip/")
    assert main(["flash-load", "--dst", str(dst)]) == 0
    assert sorted(listing(dst)) == ["a"] and not (tmp_path / "wrong").exists()


@pytest.mark.parametrize(("argv", "env", "needle"), [
    (["flash-load"], {}, "FLASH_SRC (or --src) is required"),
    (["flash-load", "--src", "{tmp}/nope", "--dst", "{tmp}/dst"], {}, "is not a directory"),
    (["flash-load", "--src", "{tmp}/src", "--dst", "{tmp}/dst", "--verify", "md5"], {}, "FLASH_VERIFY"),
    (["flash-load", "--src", "{tmp}/src", "--dst", "{tmp}/dst"], {"FLASH_CONCURRENCY": "x"}, "FLASH_CONCURRENCY"),
])
def test_cli_errors_exit_1_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         monkeypatch: pytest.MonkeyPatch, argv: list[str],
                                         env: dict[str, str], needle: str) -> None:
    make_tree(tmp_path / "src", {"a": 1})
    for k in ("FLASH_SRC", "FLASH_DST", "FLASH_CONCURRENCY"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert main([a.replace("{tmp}", str(tmp_path)) for a in argv]) == 1
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and err.startswith("flash-load: error: ")


def test_cli_no_space_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                              monkeypatch: pytest.MonkeyPatch) -> None:
    make_tree(tmp_path / "src", {"a": 1000})
    monkeypatch.setattr(fl, "statvfs_free_bytes", lambda path: 5)
    assert main(["flash-load", "--src", str(tmp_path / "src"), "--dst", str(tmp_path / "dst")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("flash-load: error: not enough space on") and "5 B free" in err
    assert len(err.strip().splitlines()) == 1


def test_cli_unexpected_error_has_no_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    make_tree(tmp_path / "src", {"a": 10})

    def boom(*a: object) -> str:
        raise RuntimeError("something odd")

    monkeypatch.setattr(fl, "copy_data", boom)
    assert main(["flash-load", "--src", str(tmp_path / "src"), "--dst", str(tmp_path / "dst")]) == 1
    err = capsys.readouterr().err
    assert "something odd" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert listing(tmp_path / "dst") == {}


def test_progress_lines_on_non_tty(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    make_tree(src, {f"f{i}": 300_000 for i in range(4)})

    def slow(src_fd: int, dst_fd: int, size: int, buf: int, on_chunk: ftransfer.ChunkCallback) -> str:
        import time
        time.sleep(0.05)
        return ftransfer.copy_data(src_fd, dst_fd, size, buf, on_chunk)

    out = io.StringIO()
    fl.flash_load(cfg_for(src, dst, concurrency=1), out=out, copier=slow, progress_interval=0.01)
    lines = out.getvalue().splitlines()
    assert any("%)" in line and "MB/s" in line for line in lines[:-1])
    assert lines[-1].startswith("flash-load: copied 4 files (1.20 MB)")
