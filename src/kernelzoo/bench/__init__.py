"""The speed and memory benchmark: ``python -m kernelzoo.bench`` (throughput.py), its packed
rows (pack.py) and its report (report.py)."""
