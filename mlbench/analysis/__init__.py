"""Analysis of MLPerf result logs (ours and published): scores, comparisons, scaling efficiency.

Reads logs only; never imports mlbench's training code.
"""

# A device count (per node, of nodes, in all; from a file or --devices) is a whole number from 1 to this: far above
# any machine built, so a count past it is a typo; it bounds the efficiency arithmetic (10**400 devices was an
# OverflowError) and the plots' axes (10**30 was a TypeError in matplotlib)
MAX_DEVICES = 10_000_000
