"""flash-loader planning: the pure selection and plan tables, the source walk, and the checks before
any byte moves (stale tmp files, the space preflight, the roots), those through a whole run."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from flexinfer.flashloader import config as fconf
from flexinfer.flashloader import plan as fplan
from flexinfer.flashloader.config import FlashError
from flexinfer.flashloader.plan import SourceFile
from tests.flashloader.helpers import MiB, listing, make_tree, run_load

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


# ---- before any byte moves, through a whole run ----------------------------------------------


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


def test_destination_inside_source_is_refused(tmp_path: Path) -> None:
    make_tree(tmp_path / "src", {"a": 1})
    with pytest.raises(FlashError, match="must not be inside"):
        run_load(tmp_path / "src", tmp_path / "src" / "shm")
