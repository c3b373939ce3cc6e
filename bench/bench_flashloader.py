"""Benchmark of the flash-loader against ``cp -a`` on the same tree, in the same run.

Builds a temporary model-like tree (default 8 files × 64 MB of random bytes = 512 MB, never more
than 512 MB) under ``--src-dir`` (default /tmp), then copies it into a fresh directory under
``--dst-dir`` (default /dev/shm, i.e. tmpfs, the flash-loader's real target) with:

- ``cp -a SRC DST`` (GNU coreutils),
- ``flexinfer flash-load --src SRC --dst DST`` as a process (default concurrency 4),
- the same with ``--concurrency 1``.

Each tool runs ``--repeats`` times (default 3); the order of the tools rotates every round, so no
tool always runs first or last. Every run starts from an empty destination, which is removed after
it. Times are wall-clock around the whole process (interpreter start included for flash-load).

Page cache: nothing is dropped (that needs root and a writable /proc/sys/vm/drop_caches, which this
machine does not give us), and the source was just written, so every tool reads the source from the
page cache. The figures therefore compare copy paths into tmpfs from cached data, not disk reads.

Reports the median MB/s (10^6 bytes/s) of each tool and the ratio flash-load ÷ cp -a, and writes
``bench/results/flashloader.json``. Usage: ``python bench/bench_flashloader.py [--files 8] [--file-mb 64]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
MAX_TOTAL_MB = 512
MB = 1_000_000


def fs_type(path: str) -> str:
    """The filesystem type of ``path`` from /proc/mounts (longest matching mount point)."""
    best, kind = "", "unknown"
    real = os.path.realpath(path)
    try:
        with open("/proc/mounts", encoding="utf-8") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) >= 3:
                    mnt = parts[1]
                    if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                        best, kind = mnt, parts[2]
    except OSError:
        pass
    return kind


def build_tree(root: Path, files: int, file_mb: int) -> int:
    """``files`` files of random bytes (not sparse: no tool can skip holes) in a model-like layout."""
    total = 0
    chunk = 4 * 1024 * 1024
    for i in range(files):
        sub = root / ("unet" if i % 2 else "text_encoder")
        sub.mkdir(parents=True, exist_ok=True)
        path = sub / f"model-{i + 1:05d}-of-{files:05d}.safetensors"
        with open(path, "wb") as fh:
            left = file_mb * MB
            while left > 0:
                n = min(chunk, left)
                fh.write(os.urandom(n))
                left -= n
        total += file_mb * MB
    (root / "config.json").write_text('{"model_type": "bench"}\n')
    total += (root / "config.json").stat().st_size
    return total


def tools(src: Path, dst: Path) -> dict[str, list[str]]:
    flash = [sys.executable, "-m", "flexinfer.cli", "flash-load", "--src", str(src), "--dst", str(dst)]
    return {
        "cp -a": ["cp", "-a", f"{src}/.", str(dst)],
        "flash-load": flash,
        "flash-load --concurrency 1": [*flash, "--concurrency", "1"],
    }


def timed_run(cmd: list[str], dst: Path) -> tuple[float, float | None]:
    """Wall seconds of the process, and the copy-phase MB/s flash-load reports itself (else None)."""
    dst.mkdir(parents=True)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=False)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[0]} failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
    m = re.search(r"in [\d.]+ s, (\d+) MB/s", proc.stderr)
    return seconds, float(m.group(1)) if m else None


def tree_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--file-mb", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--src-dir", default="/tmp")
    ap.add_argument("--dst-dir", default="/dev/shm" if os.path.isdir("/dev/shm") else "/tmp")
    ap.add_argument("--out", default=str(RESULTS / "flashloader.json"))
    args = ap.parse_args()
    if args.files * args.file_mb > MAX_TOTAL_MB:
        ap.error(f"--files × --file-mb must stay ≤ {MAX_TOTAL_MB} MB")

    src_parent = Path(tempfile.mkdtemp(prefix="flashbench-src-", dir=args.src_dir))
    dst_parent = Path(tempfile.mkdtemp(prefix="flashbench-dst-", dir=args.dst_dir))
    try:
        src = src_parent / "model"
        t0 = time.perf_counter()
        total = build_tree(src, args.files, args.file_mb)
        print(f"built {args.files} files, {total / MB:.0f} MB in {src} ({fs_type(str(src))}) in "
              f"{time.perf_counter() - t0:.1f} s; destination {dst_parent} ({fs_type(str(dst_parent))})",
              file=sys.stderr)
        names = list(tools(src, dst_parent / "x"))
        runs: list[dict[str, object]] = []
        for r in range(args.repeats):
            order = names[r % len(names):] + names[: r % len(names)]  # rotate the order every round
            for name in order:
                dst = dst_parent / f"{r}-{names.index(name)}"
                seconds, own = timed_run(tools(src, dst)[name], dst)
                copied = tree_bytes(dst)
                if copied != total:
                    raise RuntimeError(f"{name} copied {copied} bytes, expected {total}")
                shutil.rmtree(dst)
                run: dict[str, object] = {"tool": name, "round": r + 1, "seconds": round(seconds, 4),
                                          "mb_per_s": round(total / MB / seconds, 1)}
                if own is not None:
                    run["self_reported_copy_mb_per_s"] = own
                runs.append(run)
                print(f"round {r + 1}: {name:28s} {seconds:7.3f} s {total / MB / seconds:8.0f} MB/s",
                      file=sys.stderr)
        median = {n: statistics.median(float(str(x["mb_per_s"])) for x in runs if x["tool"] == n) for n in names}
        own_median = {n: statistics.median(float(str(x["self_reported_copy_mb_per_s"])) for x in runs
                                           if x["tool"] == n and "self_reported_copy_mb_per_s" in x)
                      for n in names if n.startswith("flash-load")}
        result = {
            "benchmark": "flash-loader vs cp -a, same tree, same run",
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "host": {"kernel": platform.release(), "python": platform.python_version(), "cpus": os.cpu_count(),
                     "src_fs": fs_type(str(src)), "dst_fs": fs_type(str(dst_parent)),
                     "cp": subprocess.run(["cp", "--version"], capture_output=True, text=True,
                                          check=False).stdout.splitlines()[0]},
            "tree": {"files": args.files + 1, "bytes": total, "file_mb": args.file_mb},
            "repeats": args.repeats,
            "order": "rotated every round",
            "page_cache": "not dropped (needs root and a writable /proc/sys/vm/drop_caches); the source was just "
                          "written, so all tools read it from the page cache",
            "timing": "wall clock around the whole process (flash-load includes Python start-up, about 0.1 s); "
                      "self_reported_copy_mb_per_s is flash-load's own figure for its copy phase only",
            "median_mb_per_s": {n: round(v, 1) for n, v in median.items()},
            "median_self_reported_copy_mb_per_s": {n: round(v, 1) for n, v in own_median.items()},
            "ratio_flash_load_vs_cp": round(median["flash-load"] / median["cp -a"], 3),
            "ratio_flash_load_c1_vs_cp": round(median["flash-load --concurrency 1"] / median["cp -a"], 3),
            "runs": runs,
        }
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        for n, v in median.items():
            print(f"median {n:28s} {v:8.0f} MB/s", file=sys.stderr)
        print(f"flash-load / cp -a = {result['ratio_flash_load_vs_cp']:.2f}; wrote {args.out}", file=sys.stderr)
    finally:
        shutil.rmtree(src_parent, ignore_errors=True)
        shutil.rmtree(dst_parent, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
