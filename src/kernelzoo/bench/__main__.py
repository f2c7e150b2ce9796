"""``python -m kernelzoo.bench``: the benchmark of ``throughput.py``."""
from kernelzoo.bench.throughput import main

main()
