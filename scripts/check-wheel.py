"""Fail unless a FlexInfer wheel holds a compiled module for every Cython speedup.

Usage: python3 scripts/check-wheel.py WHEEL [SOURCE_DIR]. setup.py never fails a build whose
compile failed (it falls back to pure Python), so the image build checks the wheel with this.
"""

from __future__ import annotations

import pathlib
import re
import sys
import zipfile


def main(argv: list[str]) -> int:
    wheel = pathlib.Path(argv[1])
    src = pathlib.Path(argv[2] if len(argv) > 2 else ".") / "flexinfer" / "_speedups"
    wanted = sorted(p.stem for p in src.glob("*_c.pyx"))
    if not wanted:
        print(f"check-wheel: no *_c.pyx under {src}", file=sys.stderr)
        return 1
    names = zipfile.ZipFile(wheel).namelist()
    missing = []
    for stem in wanted:
        pattern = re.compile(rf"^flexinfer/_speedups/{re.escape(stem)}\.cpython-[^/]+\.so$")
        found = [n for n in names if pattern.match(n)]
        print(f"check-wheel: {stem}: {found[0] if found else 'MISSING'}")
        if not found:
            missing.append(stem)
    if missing:
        print(f"check-wheel: {wheel.name} lacks compiled {', '.join(missing)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
