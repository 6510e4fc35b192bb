# loopline: `make run` and `make test` do their own set-up on a fresh clone.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
BROWSER_TRIED := $(VENV)/.browser-tried
CONFIG ?= loopline.yaml
BENCH ?= all
PYTEST_ARGS ?=
# Two pytest-xdist workers: the suite is mostly one busy core per test, and CI has two.
# TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 2

.PHONY: setup run test serve bench fuzz docs clean

setup: $(STAMP)

# The lock is a full `pip freeze` of a working set, installed with --no-deps because
# tfx 1.21 declares ml-metadata>=1.21 and tensorflow-data-validation>=1.21, which have no
# Linux wheels for Python 3.11: a resolving install of tfx fails. Installing the pinned set
# as it is (tfx, ml-pipelines-sdk and ml-metadata 1.17.1 included) skips that resolution;
# `pip check` then reports the ml-metadata mismatch, which is harmless here.
# Re-installs only when the lock or pyproject.toml change.
$(STAMP): requirements.lock pyproject.toml
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "error: $(PYTHON) not found; loopline needs Python 3.11 (set PYTHON=/path/to/python3.11)"; exit 1; }
	@[ -x $(PY) ] || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -U "pip>=24"
	$(PY) -m pip install -q --disable-pip-version-check --no-deps -r requirements.lock
	$(PY) -m pip install -q --disable-pip-version-check --no-deps -e .
	@touch $(STAMP)

# The payoff: after the pipeline, serve the pushed model, ask it about a few penguins over gRPC,
# print the answers and stop the server.
run: setup
	$(VENV)/bin/loopline run --config $(CONFIG)
	@awk 'NR == 1 || NR % 70 == 2' data/penguins.csv > $(VENV)/.predict_sample.csv
	@$(VENV)/bin/loopline serve --config $(CONFIG) & server=$$!; \
	  trap 'kill $$server 2>/dev/null; wait $$server 2>/dev/null' EXIT; \
	  $(VENV)/bin/loopline predict --config $(CONFIG) --wait 120 $(VENV)/.predict_sample.csv

serve: setup
	$(VENV)/bin/loopline serve --config $(CONFIG)

test: setup $(BROWSER_TRIED)
	$(PY) -m pytest -n $(TEST_WORKERS) $(PYTEST_ARGS)

# Chromium, Debian's package, for the test that opens a model card in a headless browser. Tried
# once per virtual environment, as root or with password-less sudo; never fails `make test`:
# without a browser that one test is skipped and says why.
$(BROWSER_TRIED): $(STAMP)
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || { \
	  sudo=$$([ "$$(id -u)" = 0 ] || echo "sudo -n"); \
	  command -v apt-get >/dev/null 2>&1 && { $$sudo apt-get install -y -q chromium >/dev/null 2>&1 || \
	    { $$sudo apt-get update -q >/dev/null 2>&1 && $$sudo apt-get install -y -q chromium >/dev/null 2>&1; }; } || \
	  echo "note: chromium could not be installed; the model card's browser test will be skipped"; }
	@touch $@

bench: setup
	$(PY) -m bench --only $(BENCH)

# The fuzzers with FUZZ_EXAMPLES cases per target (make test runs a few dozen, a fixed seed):
# `loopline serve` against malformed gRPC, REST and HTTP (docs/fuzzing.md), and the pipeline's
# inputs where tests/test_fuzz_inputs.py exists. The serving fuzzer adds its run to FUZZ_REPORT
# and writes a summary beside it (.md), also when it finds failures.
FUZZ_EXAMPLES ?= 5000
FUZZ_REPORT ?= bench/results/fuzz.json
fuzz: setup
	LOOPLINE_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) LOOPLINE_FUZZ_REPORT=$(FUZZ_REPORT) $(PY) -m pytest -n 0 -p no:cacheprovider \
	  tests/test_fuzz_serving.py $(wildcard tests/test_fuzz_inputs.py) $(PYTEST_ARGS)

# The documentation site (mkdocs, sources in docs/) into site/; broken links and anchors fail it.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

clean:
	rm -rf workspace
