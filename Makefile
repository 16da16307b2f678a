# Two commands: `make demo` and `make test`. Each creates .venv when missing and installs
# what it needs, so both work on a fresh clone: the demo only the package itself (the
# simulator, metrics and report need no extra), the tests every extra.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
CHECKSUM := $(shell cat pyproject.toml | cksum | cut -d' ' -f1)
DEMO_STAMP := $(VENV)/.installed-demo-$(CHECKSUM)
STAMP := $(VENV)/.installed-all-$(CHECKSUM)
SHARED ?= ../shared

.PHONY: demo test lint format bench clean install

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

demo: $(DEMO_STAMP)
	$(BIN)/tokenfair demo --shared $(SHARED)

test: $(STAMP)
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
