# Two commands do all the set-up on a fresh machine with Python 3.11+:
#   make demo   - the main job on the embedded defaults
#   make test   - the test suite
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-all compile-checks ci bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[dev,tpu-compiler]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/perfmodel hw compare tpu-v5e tpu-v5p tpu-v6e tpu-7x
	$(BIN)/perfmodel predict model llama-3.1-70b --hw v5e,v6e,tpu-7x --tp 8 --sweep batch=1,32,256 --context 4096 --weight-dtype int8
	$(BIN)/perfmodel analyze kernels.matmul:matmul --hw v5e --shape x=8192x8192:bf16 --shape w=8192x8192:bf16
	mkdir -p out
	$(BIN)/perfmodel predict model llama-3.1-8b --hw v6e --batch 16 --context 2048 --json | $(BIN)/perfmodel report - --out out/demo-report.md

test: $(STAMP)
	$(BIN)/python -m pytest -m "not slow"

test-all: $(STAMP)
	$(BIN)/python -m pytest

# The compiler checks the default run leaves to CI: every kernel on every TPU generation, every published timing.
compile-checks: $(STAMP)
	$(BIN)/python -m pytest -m slow tests/compiler

# What CI runs on a fresh clone: the test suite, then the compiler checks.
ci: test compile-checks

bench: $(STAMP)
	for f in tests/benchmarks/bench_*.py; do $(BIN)/python $$f || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info
