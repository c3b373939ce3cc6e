# FlexInfer: the two commands a new user needs are `make run` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
HOST ?= 127.0.0.1
PORT ?= 8080
PYTEST_ARGS ?=

.PHONY: run test bench lint ext clean venv wrk llama

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -U pip setuptools wheel

# Re-install when the package metadata changes; the stamp keeps repeated runs fast.
$(VENV)/.installed: pyproject.toml setup.py | $(PY)
	$(PIP) install "Cython>=3.0" setuptools wheel
	$(PIP) install -e '.[test,kube,dev]'
	touch $@

venv: $(VENV)/.installed

# Compile the Cython speedups in place (a no-op that keeps pure Python when no compiler exists).
ext: venv
	$(PY) setup.py -q build_ext --inplace 2>&1 | grep -v '^copying' || true

# llama.cpp's server and the SmolLM2 model: the wheel is built once per machine into a cache.
$(VENV)/.llama: scripts/ensure-llama.sh | $(VENV)/.installed
	scripts/ensure-llama.sh $(PY)
	touch $@

llama: $(VENV)/.llama

wrk:
	@command -v wrk >/dev/null || { apt-get update -qq && apt-get install -y -qq wrk >/dev/null; }

run: ext llama
	@echo
	@echo "FlexInfer is starting on http://$(HOST):$(PORT) (models from examples/local.yaml, started on first use)"
	@echo "  curl -s http://$(HOST):$(PORT)/v1/chat/completions -H 'Content-Type: application/json' \\"
	@echo "    -d '{\"model\": \"smollm2\", \"messages\": [{\"role\": \"user\", \"content\": \"Hello\"}]}'"
	@echo "  status page: http://$(HOST):$(PORT)/   models: http://$(HOST):$(PORT)/v1/models"
	@echo
	$(VENV)/bin/flexinfer serve -c examples/local.yaml --host $(HOST) --port $(PORT)

test: ext llama
	$(PY) -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)
	@echo "==> again without the compiled speedups (FLEXINFER_NO_EXTENSIONS=1): the parts that use them"
	FLEXINFER_NO_EXTENSIONS=1 $(PY) -m pytest -q -p no:cacheprovider tests/speedups tests/proxy tests/test_layers.py

bench: ext wrk
	$(PY) -m pytest bench/bench_speedups.py -q -p no:cacheprovider --benchmark-only
	$(PY) bench/load_proxy.py
	$(PY) bench/bench_activation.py
	$(PY) bench/bench_extender.py
	$(PY) bench/bench_flashloader.py

lint: venv
	$(VENV)/bin/ruff check flexinfer tests bench
	$(VENV)/bin/mypy

clean:
	rm -rf build flexinfer/_speedups/*.c flexinfer/_speedups/*.so
