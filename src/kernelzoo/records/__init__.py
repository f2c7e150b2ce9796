"""Records: the results store (run ids, summaries, claims), atomic and safe file access,
wandb tracking, sweep progress and signal handling."""
