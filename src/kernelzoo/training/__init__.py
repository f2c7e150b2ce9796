"""Training: one loop (runner.py) over a pack of runs (pack.py; a run alone is a pack of one),
checkpoints, devices and the memory check."""
