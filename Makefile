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

.PHONY: help install run test test-fast lint system-deps clean FORCE
.DEFAULT_GOAL := help

help:
	@echo "make run        create .venv (first time), install, run \`mlbench run gpt3 --tiny\`"
	@echo "make test       create .venv, install, install SLURM and chromium (as root), run the whole test suite"
	@echo "make test-fast  the tests that neither train nor need SLURM"
	@echo "make lint       ruff over mlbench, tests and perf"
	@echo "make install    create .venv and install (PYTHON=python3.x picks the Python, 3.11 or newer)"
	@echo "make clean      remove .venv and build files"

# A target that does not exist (a typo): one line, exit 2.
.DEFAULT:
	$(error no target '$@' in $(CURDIR)/Makefile; `make help` lists them)

# Bytecode: pip would compile every module it installs (10k, torch's mostly; 25 s of the install); instead the
# install's last step imports what a run, a rank, the official tools and the tests import, which writes bytecode
# for those alone (3.6k). A module left out is compiled by every process that imports it before one has written its
# bytecode, and ranks and tests start side by side. From torch._dynamo on, the lists name what brings in the 1.1k
# modules the suite imported beyond the rest (dynamo, which torch's optimizers import in test processes, not in
# ranks; scipy and pandas under the RCP checker and the summarizer; megatron-core's checkpointing and BERT): 3 s
# to compile once, 5 s more of the install; on fresh clones back to back, 314 s of pytest with them warmed against
# 319 s without. Two processes, one a core, import the two lists side by side: 8.8 s against 13.4 s for one.
# An environment's PYTHONDONTWRITEBYTECODE would make every process compile them again (0.2 s each for mlbench
# alone), so make turns it off for what it runs.
unexport PYTHONDONTWRITEBYTECODE
WARM_TRAIN := from mlbench.train import cpu_compat; cpu_compat.import_megatron_without_jit_fuser(); \
  import mlbench.cli, mlbench.train.loop, mlbench.train.build, mlbench.train.step, mlbench.analysis.commands, \
  mlbench.planner.cpu, torch.distributed.tensor, torch.distributed.run, torch._dynamo, \
  megatron.core.models.bert.bert_model, megatron.core.datasets.gpt_dataset, megatron.core.dist_checkpointing, \
  megatron.core.optimizer
WARM_TOOLS := import mlbench.analysis.report, pandas, scipy.stats, scipy.optimize, \
  mlperf_logging.compliance_checker.mlp_compliance, mlperf_logging.rcp_checker.rcp_checker, \
  mlperf_logging.result_summarizer.result_summarizer, pytest, xdist, execnet, websocket

# A .venv that no longer works is made again from nothing, rather than failing later with "bad interpreter" or
# running another clone's code: its Python gone (uninstalled, upgraded away, a half-made venv), or the clone moved
# or copied (pip's scripts name the venv they were installed in: its pip's first line must name this one, as real
# paths, so a .venv that is a link to another is fine). One interpreter start a make (20 ms).
VENV_CHECK := import os, re, sys; b = os.path.realpath(os.path.join(sys.prefix, 'bin')); \
  h = open(os.path.join(b, 'pip'), 'rb').read(600); \
  m = re.match(rb'\#!/bin/sh\n.{0,4}exec. .([^\x22]+)|\#!(/\S+)\n', h); p = m and os.fsdecode(m[1] or m[2]); \
  sys.exit(not p or os.path.realpath(os.path.dirname(p)) != b)
VENV_BROKEN := $(if $(wildcard $(VENV)),$(shell "$(PY)" -c "$(VENV_CHECK)" >/dev/null 2>&1 || echo yes))
# The Python that makes the venv: said in one line where it cannot run or is too old, before anything is made
# (Python 2 can read the check too).
PYTHON_FIX := make $(or $(MAKECMDGOALS),install) PYTHON=python3.11 (or the path of a Python 3.11 or newer)
PYTHON_CHECK := import sys; v = sys.version_info; v < (3, 11) and \
  sys.exit('make: %s is Python %d.%d; mlbench needs 3.11 or newer: $(PYTHON_FIX)' % (sys.executable, v[0], v[1]))

# The goals that use the venv, unless `clean` is among them (it removes it first): what the notes below are for.
USES_VENV := $(if $(filter clean,$(MAKECMDGOALS)),,$(filter install run test test-fast lint,$(MAKECMDGOALS)))

# A .venv that is not a folder (a file of that name): one line, exit 2, before venv fails on it ('File exists')
# and make adds its own error.
ifneq ($(and $(USES_VENV),$(wildcard $(VENV)),$(shell [ -d "$(VENV)" ] || echo no)),)
$(error $(VENV) is not a folder (a file of that name?): remove it, or name another with VENV=<folder>)
endif

# PYTHON named (on the command line or in the environment) where a working .venv exists, made by another Python:
# the venv is kept, as before, but said in one line, with how to change it (the top make alone: not its sub-make).
# Compared by their interpreters' real paths, which PYTHON itself reports (a pyenv shim is no interpreter).
WHICH_PYTHON = import os, sys; print(sys.version.split()[0], os.path.realpath(sys.$(1)))
PYTHON_NAMED := $(and $(USES_VENV),$(filter command line environment,$(origin PYTHON)),$(filter 0,$(MAKELEVEL)),\
  $(wildcard $(VENV)),$(if $(VENV_BROKEN),,yes))
ifneq ($(PYTHON_NAMED),)
VENV_USES := $(shell "$(PY)" -c "$(call WHICH_PYTHON,_base_executable)" 2>/dev/null)
PYTHON_IS := $(shell "$(PYTHON)" -c "$(call WHICH_PYTHON,executable)" 2>/dev/null)
ifneq ($(wordlist 2,99,$(VENV_USES)),$(wordlist 2,99,$(PYTHON_IS)))
$(shell echo "make: $(VENV) uses Python $(word 1,$(VENV_USES)) ($(wordlist 2,99,$(VENV_USES))), not PYTHON=$(PYTHON) \
  $(if $(PYTHON_IS),(Python $(word 1,$(PYTHON_IS)): $(wordlist 2,99,$(PYTHON_IS))); keeping it: make clean \
  $(USES_VENV) PYTHON=$(PYTHON) makes it again with that one,(which cannot run): keeping it)" >&2)
endif
endif

# A checkout whose path is not ASCII ('~/Téléchargements/mlbench'): Python 3.11 reads the editable install's .pth,
# which names it, in the locale's encoding even in UTF-8 mode, so under LC_ALL=C no Python of the venv could start
# ('init_import_site ... UnicodeDecodeError'). The .pth then names it relative to site-packages ('../../../..').
PTH_RELATIVE := import glob, os, site; d = site.getsitepackages()[0]; \
  [t.isascii() or open(p, 'w', encoding='utf-8').write(os.path.relpath(t, d) + '\n') \
   for p in glob.glob(os.path.join(d, '__editable__.mlbench_ttt-*.pth')) \
   if (t := open(p, encoding='utf-8').read().strip())]

$(STAMP): pyproject.toml $(if $(VENV_BROKEN),FORCE)
	@"$(PYTHON)" -c "" >/dev/null 2>&1 || { echo "make: cannot run '$(PYTHON)' (not installed?): \
	$(PYTHON_FIX)" >&2; exit 2; }
	@"$(PYTHON)" -c "$(PYTHON_CHECK)"
	$(if $(VENV_BROKEN),@echo "make: $(VENV) no longer works here (its Python is gone, or the clone was moved or \
	copied); making it again" >&2)
	"$(PYTHON)" -m venv $(if $(VENV_BROKEN),--clear) $(VENV)
	$(PY) -m pip install -q --no-compile $(TORCH_INDEX) "$(TORCH)"
	$(PY) -m pip install -q --no-compile -e '.[dev]'
	$(PY) -c "$(PTH_RELATIVE)"
	$(PY) -W ignore -c "$(WARM_TRAIN)" & train=$$!; $(PY) -W ignore -c "$(WARM_TOOLS)" && wait $$train
	touch $@

install: $(STAMP)

FORCE:

run: install
	$(VENV)/bin/mlbench run gpt3 --tiny

# Debian packages for the tests that need them, installed only where we are root, after one apt-get update:
# SLURM for the two-node cluster tests, and Debian's chromium with one font for the HTML report tests (its
# recommended packages, 8 s more of install, are not needed to load the pages). Without them those tests skip
# with the reason.
SLURM_PKGS := slurmctld slurmd slurm-client munge
system-deps:
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  slurm=$$(for p in $(SLURM_PKGS); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	  browser=$$(command -v chromium >/dev/null || echo "chromium fonts-dejavu-core"); \
	  pkgs=$$(echo $$slurm $$browser); export DEBIAN_FRONTEND=noninteractive; \
	  [ -z "$$pkgs" ] || { apt-get update -qq && apt-get install -y -qq --no-install-recommends $$pkgs >/dev/null; }; \
	else echo "system-deps: not root or no apt-get; the SLURM and browser tests will skip"; fi

# Three workers on two cores: most tests train one rank on one core, and a third keeps the cores busy while a
# test waits (a SLURM job starting, a hang timeout). Measured on 2 cores: 324 s against 341 s at two, back to
# back with bytecode and the CPU cache present; on fresh clones 349-362 s against 353 s (the suite is
# CPU-bound: about 600 s of CPU in it then). A fourth worker gains nothing: 334 s against 325-339 s at three.
# --dist loadfile keeps each file in one worker, so the runs of a set stay together and a file's SLURM cluster
# tests run one after another.
# The Python install and the Debian packages go side by side (pip and dpkg each keep one core busy); under make -j
# the sub-make shares its parent's jobs (a -j2 of its own made make warn 'resetting jobserver mode').
# With another goal beside it (make -j2 run test), test waits for this make's install: the sub-make would make the
# venv a second time, at once, in the same folder.
test: $(if $(filter-out test,$(MAKECMDGOALS)),install)
	$(MAKE) $(if $(filter -j%,$(MAKEFLAGS)),,-j2) --no-print-directory install system-deps
	$(VENV)/bin/pytest -q -n 3 --dist loadfile --no-loadscope-reorder

# The edit-test loop: everything but the tests that train a model or need SLURM (marked slow / slurm), which
# `make test` still runs.
test-fast: install
	$(VENV)/bin/pytest -q -n 2 --dist loadfile --no-loadscope-reorder -m "not slow and not slurm"

lint: install
	$(VENV)/bin/ruff check mlbench tests perf

clean:
	rm -rf $(VENV) build *.egg-info
