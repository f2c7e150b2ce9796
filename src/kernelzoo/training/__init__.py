"""Training: a job (job.py) plans its runs once and trains them as one pack in the one loop
(runner.py; a run alone is a pack of one: pack.py the mechanics, packing.py the policy);
checkpoints, devices, the memory check, signal handling (interrupt.py) and loading PyTorch
(loading.py)."""
