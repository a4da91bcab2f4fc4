"""Launchers: how a set of runs is started and followed. `launcher.start` is the one entry point the CLI
calls; it chooses the launcher once and takes it through the same contract, whichever it is:

- prepare(folder): checks and files before anything starts; a request that cannot run is refused here
  (UserError), and the result folder it opened is left as it was;
- start(): the runs (a SLURM job) begin; a dry run starts nothing;
- supervise(): followed to their end, with live progress;
- collect(): what they produced, reported; the exit code (0 when every run reached its target).

Launchers: runner.RunSet (`local`: this machine, the rank itself or local_ranks' agent for more; `torchrun`: one
invocation per node; also the driver inside a SLURM job), slurm.SlurmLauncher (an sbatch job) and
dry_run.DryRun (starts nothing; shows what the launcher it wraps would start).
"""
