# nodewarden — developer entry points. `make demo` and `make test` are the two that matter.
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
IMAGE ?= nodewarden:$(VERSION)
# the slowest tests are listed at the end of every run (the suite has a 30-minute budget)
PYTEST_ARGS ?= --durations=25

help: ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	@scripts/install-system-deps.sh
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install --quiet --upgrade 'pip>=24' 'setuptools>=69' wheel
	$(PIP) install --quiet -e '.[test]'
	@touch $(STAMP)

install: $(STAMP) ## create .venv and install nodewarden with its test dependencies

controlplane: ## build (or reuse from ~/.cache/nodewarden) etcd, kube-apiserver, kube-controller-manager, helm
	@e2e/controlplane/build.sh >/dev/null

crds: $(STAMP) ## regenerate crds/ from the pydantic models
	$(PY) -m nodewarden.api.crdgen crds helm/nodewarden/crds

cluster-up: $(STAMP) controlplane ## start the local control plane on 127.0.0.1; kubeconfig in .nodewarden/kubeconfig
	$(PY) e2e/localcluster.py up

cluster-down: $(STAMP) ## stop the local control plane started by cluster-up and remove its state
	$(PY) e2e/localcluster.py down

lint: $(STAMP) ## ruff and mypy
	$(VENV)/bin/ruff check operator tests e2e benchmarks
	$(VENV)/bin/ruff format --check operator tests e2e benchmarks
	$(VENV)/bin/mypy

test: $(STAMP) controlplane lint chart-lint ## ruff, mypy, chart checks and the whole pytest suite (starts its own control plane)
	$(PY) e2e/run_pytest.py $(PYTEST_ARGS)

chart-lint: $(STAMP) controlplane ## helm lint --strict, kubeconform (offline schemas), checkov, hadolint
	$(PY) e2e/dataplane/chartlint.py

demo: $(STAMP) controlplane ## start a local control plane, apply the examples, run the operator (Ctrl-C cleans up)
	$(PY) e2e/demo.py $(DEMO_ARGS)

bench: $(STAMP) controlplane ## run the benchmark scripts and print their figures (several minutes)
	$(PY) benchmarks/bench_policy.py
	$(PY) benchmarks/bench_scheduler.py
	$(PY) benchmarks/bench_probe.py --nodes 1000 --throttled-nodes 100
	$(PY) benchmarks/bench_stub_cloud.py
	$(PY) benchmarks/bench_dispatch.py
	$(PY) benchmarks/bench_power_fleet.py --nodes 1000
	$(PY) benchmarks/bench_intents.py
	$(PY) benchmarks/bench_scale.py --nodes 1000  # issue 14's fleet: --nodes 10000 (heavy)
	$(PY) benchmarks/bench_simulate.py

bench-anchor: $(STAMP) controlplane ## Karpenter's 1,000-pod scale-out (KWOK) then bench_dispatch on one control plane, side by side (BENCH_ANCHOR_ARGS='--pods 50'; not in `make test`)
	@e2e/anchor/build.sh >/dev/null
	$(PY) benchmarks/bench_anchor.py $(BENCH_ANCHOR_ARGS)

clean: ## remove .venv and local state (not the control-plane cache)
	-$(PY) e2e/localcluster.py down 2>/dev/null
	rm -rf $(VENV) .nodewarden .mypy_cache .ruff_cache .pytest_cache

image: $(STAMP) ## build the operator image IMAGE (docker build with Docker, else podman on a local Debian base)
	@if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then \
		docker build -t $(IMAGE) . ; \
	else \
		$(PY) e2e/dataplane/images.py operator --tag $(IMAGE) ; \
	fi

lock: ## regenerate requirements.lock (the image's Python dependencies, hashed) from pyproject.toml
	@test -x .nodewarden/piptools/bin/pip-compile || \
		(python3 -m venv .nodewarden/piptools && .nodewarden/piptools/bin/pip install --quiet 'pip-tools>=7.4,<8')
	PIP_FIND_LINKS= .nodewarden/piptools/bin/pip-compile --quiet --generate-hashes --allow-unsafe \
		--strip-extras --build-deps-for=wheel --pip-args='--only-binary=:all:' --no-emit-find-links \
		--output-file=requirements.lock pyproject.toml

CHAOS_REPORT ?= chaos-report.json
chaos: $(STAMP) controlplane ## the long chaos run: 320 containers under every fault, then the invariants (CHAOS_ARGS='--chaos-seed N'; report: CHAOS_REPORT=FILE.json)
	$(PY) e2e/run_pytest.py -q -p no:cacheprovider -s e2e/chaos --report $(CHAOS_REPORT) $(CHAOS_ARGS)
	python3 e2e/chaos/recheck.py $(CHAOS_REPORT)

fuzz: $(STAMP) controlplane ## the long fuzz run: 400 hostile objects per kind through the API server, 20x the in-process examples (NODEWARDEN_FUZZ_EXAMPLES), a 60 s flood
	NODEWARDEN_FUZZ_CORPUS=400 NODEWARDEN_FUZZ_EXAMPLES=20 NODEWARDEN_FLOOD_SECONDS=60 \
		$(PY) e2e/run_pytest.py -q -p no:cacheprovider -s --durations=5 \
		tests/unit/test_fuzz_inprocess.py tests/cluster/test_hostile_objects.py \
		tests/cluster/test_slow_clients.py $(FUZZ_ARGS)

e2e: $(STAMP) controlplane ## the chart on a real kubelet in its own network namespaces (root; see README)
	$(PY) e2e/dataplane/run.py $(E2E_ARGS)

.PHONY: help install controlplane crds cluster-up cluster-down lint test demo bench bench-anchor clean image lock e2e chart-lint chaos fuzz
