"""Records: the results store (run ids, the run directory and its one writer, summaries), atomic
and safe file access, the sweep and search records, merging stores, wandb tracking, sweep
progress and whether a store changed since its analysis."""
