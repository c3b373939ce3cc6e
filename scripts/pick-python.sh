#!/bin/sh
# Print the interpreter `make` builds the venv from (override: `make PYTHON=/path/to/python3 ...`).
#
# The distribution's /usr/bin/python3 comes first when it is 3.11 or newer, can make a venv (ensurepip)
# and has its headers (Python.h, for the Cython speedups): it is the interpreter the image ships
# (Containerfile: Debian's python3), so the benchmarks measure what users run, and Debian links it
# statically, where a `--enable-shared` build such as pyenv's default calls through libpython's PLT: the
# proxy costs about 12 % more instructions per request on the latter (docs/benchmarks.md, "The
# interpreter"). Otherwise `python3` on PATH, as before.
for cand in /usr/bin/python3 python3; do
  command -v "$cand" >/dev/null 2>&1 || continue
  if "$cand" -c 'import sys, sysconfig, os, ensurepip
sys.exit(0 if sys.version_info >= (3, 11) and os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")) else 1)' \
      >/dev/null 2>&1; then
    echo "$cand"
    exit 0
  fi
done
echo python3
