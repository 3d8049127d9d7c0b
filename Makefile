# Every target sets itself up: a fresh clone needs nothing but `make test` or `make serve`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
HOST ?= 127.0.0.1
PORT ?= 30000
MODEL ?= default

.PHONY: install test test-all serve bench bench-peers clean

$(PY):
	$(PYTHON) -m venv $(VENV)

# Reinstall only when the project's requirements change.
$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev,bench]'
	touch $(STAMP)

install: $(STAMP)

test: install
	$(PY) -m pytest -m "not slow" -q

test-all: install
	$(PY) -m pytest -q

serve: install
	@echo "radixserve: OpenAI-compatible API at http://$(HOST):$(PORT)/v1 (model: $(MODEL))"
	$(PY) -m server --model $(MODEL) --host $(HOST) --port $(PORT)

bench: install
	$(PY) -m benchmarks.run_all --quick

bench-peers: install
	$(PY) -m benchmarks.peers

clean:
	rm -rf $(VENV) build *.egg-info
