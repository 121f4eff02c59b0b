# Two commands do all the set-up on a fresh machine with Python 3.11+:
#   make demo   - the main job on the embedded defaults
#   make test   - the test suite
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-all compile-checks thirdparty-checks readme-check chromium ci bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[dev,tpu-compiler]"
	$(BIN)/pip install -q -e ".[ray]" || echo "ray: installing the ray extra failed; the Ray backend tests skip"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/perfmodel hw compare tpu-v5e tpu-v5p tpu-v6e tpu-7x
	$(BIN)/perfmodel predict model llama-3.1-70b --hw v5e,v6e,tpu-7x --tp 8 --sweep batch=1,32,256 --context 4096 --weight-dtype int8
	$(BIN)/perfmodel analyze kernels.matmul:matmul --hw v5e --shape x=8192x8192:bf16 --shape w=8192x8192:bf16
	mkdir -p out
	$(BIN)/perfmodel predict model llama-3.1-8b --hw v6e --batch 16 --context 2048 --json | $(BIN)/perfmodel report - --out out/demo-report.md --force

# The suite runs on every core (pytest-xdist): each test wherever a worker is free, except the files listed in
# tests/conftest.py SHARE_A_WORKER (module fixtures, per-chip compile batches), each on one worker. Compiles and
# XLA:CPU programs are cached between runs in $PERFMODEL_CACHE_DIR (default ~/.cache/perfmodel); a cold run:
# PERFMODEL_CACHE_DIR=$(mktemp -d) make test.
PARALLEL ?= -n auto --dist loadgroup

test: $(STAMP)
	$(BIN)/python -m pytest $(PARALLEL) -m "not slow"

test-all: $(STAMP)
	$(BIN)/python -m pytest $(PARALLEL)

# The compiler checks the default run leaves to CI: every kernel on every TPU generation, every published timing.
compile-checks: $(STAMP)
	$(BIN)/python -m pytest $(PARALLEL) -m slow tests/compiler

# analyze on other packages' Pallas TPU kernels (tokamax, vLLM tpu-inference), installed into .thirdparty/
# (pinned in .ci/thirdparty-requirements.txt, no dependency resolution against the venv). Where the install
# fails (no network) the tests skip and say why.
THIRDPARTY := .thirdparty
thirdparty-checks: $(STAMP)
	$(BIN)/pip install -q --no-deps --target $(THIRDPARTY) -r .ci/thirdparty-requirements.txt \
		|| echo "thirdparty-checks: installing .ci/thirdparty-requirements.txt failed; the tests below skip"
	PYTHONPATH=$(abspath $(THIRDPARTY)) $(BIN)/python -m pytest tests/schedule/test_sched_thirdparty.py tests/harness/test_tokamax_analyze.py -rs

# The shown outputs of README.md and the reference pages (every README.md under the project folders) against the tool as it is now (python tests/readme_examples.py --write regenerates them).
readme-check: $(STAMP)
	$(BIN)/python tests/readme_examples.py --quiet

# Debian's chromium for the HTML report's browser test (tests/test_html_report_browser.py), installed with apt-get
# as root or with sudo -n; where neither works (or there is no network) the browser tests skip and say why.
chromium:
	@command -v chromium >/dev/null 2>&1 && echo "chromium: $$(command -v chromium)" || { \
	  if [ "$$(id -u)" = 0 ]; then SUDO=""; elif sudo -n true 2>/dev/null; then SUDO="sudo -n"; \
	  else echo "chromium: not installed and no root or sudo -n; the browser tests skip"; exit 0; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends \
	    chromium || echo "chromium: apt-get install failed; the browser tests skip"; }

# What CI runs on a fresh clone: the test suite, then the compiler checks, the third-party kernels and the README
# examples side by side (the last two leave a core idle most of the time: installs and one CLI at a time).
ci: $(STAMP)
	$(MAKE) test
	$(MAKE) -j3 --output-sync=target compile-checks thirdparty-checks readme-check

bench: $(STAMP)
	for f in tests/benchmarks/bench_*.py; do $(BIN)/python $$f || exit 1; done

clean:
	rm -rf $(VENV) $(THIRDPARTY) build *.egg-info
