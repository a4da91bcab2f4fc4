"""Entry point of every rank: `python -m mlbench.train PLAN.json` (started by a launcher)."""

import logging
import os
import sys

from mlbench.launch import lifeline

lifeline.install_pdeathsig()  # first: a rank never outlives its launcher, even while it imports torch

from mlbench.train.loop import main  # noqa: E402 - after the lifeline

code = main()
# The log, events and checkpoint are written and flushed by now: skip the interpreter's teardown of torch and
# megatron-core (most of a second), which does nothing a reader needs.
logging.shutdown()
sys.stdout.flush()
sys.stderr.flush()
os._exit(code)
