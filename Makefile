# FlexInfer: the two commands a new user needs are `make run` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
HOST ?= 127.0.0.1
PORT ?= 8080
PYTEST_ARGS ?=

.PHONY: run test bench lint ext clean venv wrk

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

wrk:
	@command -v wrk >/dev/null || { apt-get update -qq && apt-get install -y -qq wrk >/dev/null; }

run: ext
	@echo "Starting flexinfer proxy on http://$(HOST):$(PORT) (static inventory, stub engine)"
	$(PY) -m tests.stub_engine --port 18001 & \
	trap 'kill %1 2>/dev/null' EXIT INT TERM; \
	$(VENV)/bin/flexinfer proxy -c examples/static.yaml --host $(HOST) --port $(PORT)

test: ext
	$(PY) -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

bench: ext wrk
	$(PY) -m pytest bench/ -q -p no:cacheprovider --benchmark-only
	$(PY) bench/load_proxy.py

lint: venv
	$(VENV)/bin/ruff check flexinfer tests bench
	$(VENV)/bin/mypy

clean:
	rm -rf build flexinfer/_speedups/*.c flexinfer/_speedups/*.so
