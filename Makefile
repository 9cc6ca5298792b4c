# One entry point for a fresh machine: `make serve` (the memory server) and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup serve test lint bench

setup: $(STAMP)

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

serve: setup
	$(VENV)/bin/memrl-mcp --transport streamable-http --host 127.0.0.1 --port 8765

test: setup
	$(VENV)/bin/ruff check memrl_mcp tests benchmarks
	$(VENV)/bin/ruff format --check memrl_mcp tests benchmarks
	$(PY) -m pytest -q

bench: setup
	$(PY) benchmarks/backends.py
	$(PY) benchmarks/latency.py
