# Two commands: `make run` and `make test`. Both set everything up on a fresh clone.
VENV     ?= .venv
PYTHON   ?= python3
PY       := $(VENV)/bin/python
STAMP    := $(VENV)/.installed
# torch goes in first and pinned, so nothing later resolves `torch` to a CUDA build.
# Off this network, on a machine without CUDA, add the CPU wheel index:
#   make test TORCH_INDEX=--index-url=https://download.pytorch.org/whl/cpu
TORCH    ?= torch==2.13.0
TORCH_INDEX ?=

.PHONY: install run test test-fast lint slurm-deps browser-deps clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH_INDEX) "$(TORCH)"
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

install: $(STAMP)

run: install
	$(VENV)/bin/mlbench run gpt3 --tiny

# SLURM for the two-node cluster tests: Debian's packages, installed only where we are root.
slurm-deps:
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  command -v slurmctld >/dev/null || { apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null; }; \
	else echo "slurm-deps: not root or no apt-get; SLURM tests will skip"; fi

# A headless browser for the HTML report tests: Debian's chromium, installed only where we are root.
browser-deps:
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  command -v chromium >/dev/null || { apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }; \
	else echo "browser-deps: not root or no apt-get; the HTML report browser tests will skip"; fi

# Two workers: most tests train one rank on one core. --dist loadfile keeps each file in one worker, so the
# runs of a set stay together and a file's SLURM cluster tests run one after another.
test: install slurm-deps browser-deps
	$(VENV)/bin/pytest -q -n 2 --dist loadfile --no-loadscope-reorder

# The edit-test loop: everything but the tests that train a model or need SLURM (marked slow / slurm), which
# `make test` still runs.
test-fast: install
	$(VENV)/bin/pytest -q -n 2 --dist loadfile --no-loadscope-reorder -m "not slow and not slurm"

lint: install
	$(VENV)/bin/ruff check mlbench tests

clean:
	rm -rf $(VENV) build *.egg-info
