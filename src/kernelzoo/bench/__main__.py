"""``python -m kernelzoo.bench``: the benchmark of ``throughput.py`` (``--estimate``: the memory
estimate, ``estimate.py``; ``--scaleout``: workers or threads, ``scaleout.py``)."""
import sys

if "--scaleout" in sys.argv[1:]:
    from kernelzoo.bench.scaleout import main
else:
    from kernelzoo.bench.throughput import main

main()
