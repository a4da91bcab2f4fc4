"""Entry point of every rank: `python -m mlbench.train PLAN.json` (started by a launcher)."""

import sys

from mlbench.train.loop import main

sys.exit(main())
