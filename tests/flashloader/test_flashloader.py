"""flash-loader: planning tables, the copy on temp trees (faults, stale tmp files, preflight, verify)
and the command through ``flexinfer.cli.main``."""

from __future__ import annotations

import errno
import io
import os
from pathlib import Path

import pytest

from flexinfer.cli import main
from flexinfer.flashloader import command as fl
from flexinfer.flashloader import config as fconf
from flexinfer.flashloader import plan as fplan
from flexinfer.flashloader import transfer as ftransfer
from flexinfer.flashloader.config import FlashConfig, FlashError
from flexinfer.flashloader.plan import SourceFile
from flexinfer.settings import SettingsError

MiB = 1024 * 1024


def make_tree(root: Path, files: dict[str, bytes | int]) -> None:
    """``{rel: bytes or size}``; sizes get deterministic pseudo-random content."""
    for rel, content in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, int):
            content = (rel.encode() * (content // max(len(rel), 1) + 1))[:content]
        p.write_bytes(content)


def listing(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def cfg_for(src: Path, dst: Path, **kw: object) -> FlashConfig:
    return fconf.load_config({}, src=str(src), dst=str(dst), **kw)


def run_load(src: Path, dst: Path, **kw: object) -> fl.FlashReport:
    extra = {k: kw.pop(k) for k in ("free_bytes", "copier") if k in kw}
    return fl.flash_load(cfg_for(src, dst, **kw), out=io.StringIO(), **extra)  # type: ignore[arg-type]


# ---- configuration ---------------------------------------------------------------------------


def test_config_defaults_and_env() -> None:
    cfg = fconf.load_config({"FLASH_SRC": "/s", "FLASH_DST": "/d"})
    assert (cfg.concurrency, cfg.buffer_kb, cfg.verify, cfg.variant) == (4, 4096, "none", "")
    assert cfg.exclude == (".cache/", ".git/")
    env = {"FLASH_SRC": "/s", "FLASH_DST": "/d", "FLASH_CONCURRENCY": "8", "FLASH_BUFFER_KB": "1024",
           "FLASH_VERIFY": "sha256", "FLASH_EXCLUDE": "original/, ./logs/,,", "FLASH_VARIANT": "fp16"}
    cfg = fconf.load_config(env)
    assert (cfg.concurrency, cfg.buffer_kb, cfg.verify, cfg.variant) == (8, 1024, "sha256", "fp16")
    assert cfg.exclude == (".cache/", ".git/", "original/", "logs/")
    assert cfg.buffer_bytes == 1024 * 1024


@pytest.mark.parametrize(("raw", "mode"), [("false", "none"), ("", "none"), ("0", "none"), ("true", "size"),
                                           ("1", "size"), ("SIZE", "size"), ("sha256", "sha256")])
def test_verify_spellings(raw: str, mode: str) -> None:
    assert fconf.load_config({"FLASH_SRC": "/s", "FLASH_DST": "/d", "FLASH_VERIFY": raw}).verify == mode


def test_flags_override_env() -> None:
    env = {"FLASH_SRC": "/s", "FLASH_DST": "/d", "FLASH_CONCURRENCY": "8", "FLASH_EXCLUDE": "a/"}
    cfg = fconf.load_config(env, dst="/other", concurrency=2, exclude=("b/",), verify=None)
    assert (cfg.src, cfg.dst, cfg.concurrency) == ("/s", "/other", 2)
    assert cfg.exclude == (".cache/", ".git/", "b/")


@pytest.mark.parametrize(("env", "needle"), [
    ({"FLASH_DST": "/d"}, "FLASH_SRC"),
    ({"FLASH_SRC": "/s"}, "FLASH_DST"),
    ({"FLASH_SRC": "/s", "FLASH_DST": "/d", "FLASH_CONCURRENCY": "0"}, "FLASH_CONCURRENCY"),
    ({"FLASH_SRC": "/s", "FLASH_DST": "/d", "FLASH_CONCURRENCY": "four"}, "FLASH_CONCURRENCY"),
    ({"FLASH_SRC": "/s", "FLASH_DST": "/d", "FLASH_BUFFER_KB": "1"}, "FLASH_BUFFER_KB"),
    ({"FLASH_SRC": "/s", "FLASH_DST": "/d", "FLASH_VERIFY": "md5"}, "FLASH_VERIFY"),
    ({"FLASH_SRC": "/s", "FLASH_DST": "/d", "FLASH_VARIANT": "../x"}, "FLASH_VARIANT"),
])
def test_config_errors(env: dict[str, str], needle: str) -> None:
    with pytest.raises(SettingsError, match=needle):
        fconf.load_config(env)


# ---- pure planning ---------------------------------------------------------------------------


@pytest.mark.parametrize(("rel", "twin"), [
    ("model.safetensors", "model.fp16.safetensors"),
    ("unet/diffusion_pytorch_model.safetensors", "unet/diffusion_pytorch_model.fp16.safetensors"),
    ("unet/diffusion_pytorch_model-00001-of-00002.safetensors",
     "unet/diffusion_pytorch_model.fp16-00001-of-00002.safetensors"),
    ("text_encoder/pytorch_model.bin", "text_encoder/pytorch_model.fp16.bin"),
    ("model.fp16.safetensors", None),
    ("model.fp16-00001-of-00002.safetensors", None),
    ("config.json", None),
    ("model.safetensors.index.json", None),
])
def test_variant_name(rel: str, twin: str | None) -> None:
    assert fplan.variant_name(rel, "fp16") == twin
    assert fplan.variant_name(rel, "") is None


def test_select_files_exclusions_and_variant() -> None:
    files = [SourceFile(r, 1) for r in (
        ".cache/huggingface/x", ".git/HEAD", "logs/a.txt", "config.json", "a/.git/keep",
        "unet/m.safetensors", "unet/m.fp16.safetensors", "vae/m.safetensors",  # vae has no fp16 twin
        "te/m-00001-of-00002.safetensors", "te/m.fp16-00001-of-00002.safetensors", "stray.flash-tmp")]
    excludes = fconf.normalize_excludes(["logs/"])
    kept, excluded, skipped = fplan.select_files(files, excludes, "fp16")
    assert [f.rel for f in kept] == ["config.json", "a/.git/keep", "unet/m.fp16.safetensors",
                                     "vae/m.safetensors", "te/m.fp16-00001-of-00002.safetensors"]
    assert excluded == [".cache/huggingface/x", ".git/HEAD", "logs/a.txt", "stray.flash-tmp"]
    assert skipped == ["unet/m.safetensors", "te/m-00001-of-00002.safetensors"]
    kept_all, _, skipped_none = fplan.select_files(files, excludes, "")
    assert skipped_none == [] and "unet/m.safetensors" in {f.rel for f in kept_all}


def test_variant_twin_that_is_excluded_does_not_hide_the_original() -> None:
    files = [SourceFile("m.safetensors", 1), SourceFile("old/m.fp16.safetensors", 1),
             SourceFile("old/m.safetensors", 1)]
    kept, _, skipped = fplan.select_files(files, ("old/",), "fp16")
    assert [f.rel for f in kept] == ["m.safetensors"] and skipped == []


def test_plan_copies_skips_equal_sizes_and_orders_largest_first() -> None:
    files = [SourceFile("a", 10), SourceFile("b", 30), SourceFile("c", 20), SourceFile("d", 5)]
    plan = fplan.plan_copies(files, {"a": 10, "b": 29, "d": 5})
    assert [f.rel for f in plan.copy] == ["b", "c"]
    assert [f.rel for f in plan.unchanged] == ["a", "d"]
    assert plan.bytes_to_copy == 50
    forced = fplan.plan_copies(files, {"a": 10, "b": 29, "d": 5}, force=["a"])
    assert [f.rel for f in forced.copy] == ["b", "c", "a"]


@pytest.mark.parametrize(("size", "need"), [
    (0, 0),
    (1, 1 + 10 * MiB),
    (100 * MiB, 110 * MiB),  # 5 % = 5 MiB < 10 MiB
    (1000 * MiB, 1050 * MiB),  # 5 % = 50 MiB
])
def test_required_bytes(size: int, need: int) -> None:
    assert fplan.required_bytes(size) == need


# ---- walking ---------------------------------------------------------------------------------


def test_walk_skips_symlinks_and_prunes_excluded(tmp_path: Path) -> None:
    src = tmp_path / "src"
    make_tree(src, {"a.bin": 10, "sub/b.bin": 20, ".git/objects/x": 5, ".cache/hf/y": 5})
    (src / "link.bin").symlink_to(src / "a.bin")
    (src / "linkdir").symlink_to(src / "sub")
    os.mkfifo(src / "fifo")
    walk = fplan.walk_source(str(src), fconf.DEFAULT_EXCLUDES)
    assert [(f.rel, f.size) for f in walk.files] == [("a.bin", 10), ("sub/b.bin", 20)]
    assert sorted(walk.pruned) == [".cache/", ".git/"]
    assert walk.symlinks == 2


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


def test_stale_tmp_files_removed(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    make_tree(src, {"a.bin": 100})
    make_tree(dst, {"a.bin.flash-tmp": 50, "sub/b.bin.flash-tmp": 10, "keep.txt": b"k"})
    report = run_load(src, dst)
    assert listing(dst) == {"a.bin": (src / "a.bin").read_bytes(), "keep.txt": b"k"}
    assert report.stale_removed == 2


def test_no_space_preflight_fails_before_writing(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    make_tree(src, {"a.bin": MiB})
    asked: list[str] = []

    def tiny(path: str) -> int:
        asked.append(path)
        return 11 * MiB - 1  # < 1 MiB + 10 MiB headroom

    with pytest.raises(FlashError, match=r"not enough space on .*dst: need 11\.53 MB"):
        run_load(src, dst, free_bytes=tiny)
    assert asked == [str(dst)] and not dst.exists()
    run_load(src, dst, free_bytes=lambda p: 12 * MiB)  # enough
    assert (dst / "a.bin").stat().st_size == MiB


def test_preflight_counts_only_files_to_copy(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    make_tree(src, {"a.bin": MiB})
    make_tree(dst, {"a.bin": MiB})
    report = run_load(src, dst, free_bytes=lambda p: 0)  # nothing to copy: no preflight failure
    assert report.copied_files == 0


def test_statvfs_free_bytes_of_missing_path(tmp_path: Path) -> None:
    assert fplan.statvfs_free_bytes(str(tmp_path / "not" / "yet")) > 0


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


def test_destination_inside_source_is_refused(tmp_path: Path) -> None:
    make_tree(tmp_path / "src", {"a": 1})
    with pytest.raises(FlashError, match="must not be inside"):
        run_load(tmp_path / "src", tmp_path / "src" / "shm")


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
