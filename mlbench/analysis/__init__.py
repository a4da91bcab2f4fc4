"""Analysis of MLPerf result logs (ours and published): scores, comparisons, scaling efficiency.

Reads logs only; never imports mlbench's training code.
"""
