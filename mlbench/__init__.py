"""mlbench: MLPerf-style time-to-train runs on megatron-core."""

import os

# numpy's OpenBLAS starts a thread per core (up to 64) as numpy is imported, in every mlbench process: the CLI,
# each rank, the checker. Nothing mlbench runs does BLAS work through numpy (torch has its own threads), and the
# start alone cost 0.12 s of CPU a CLI and 0.07 s a rank on 2 cores. One, unless the user says otherwise; the ranks
# get --threads (runner.py), as torch's own threads.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
