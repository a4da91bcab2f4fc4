"""Moved to `mlbench.run_plan` (the plan is a step of its own, read by the launcher, the loop and the log writer).
Kept while code elsewhere still imports it from here."""

from mlbench.run_plan import RunPlan, benchmark_from_dict

__all__ = ["RunPlan", "benchmark_from_dict"]
