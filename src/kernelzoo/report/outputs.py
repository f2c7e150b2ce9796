"""Every output of an analysis, written from its ``Analysis`` into the experiment's directory,
each file atomically: runs.parquet, capacity.csv, scaling.csv, factorial.csv (where
configurations form a 2^k design), the figures (PNG and SVG) and report.md."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from kernelzoo.analysis import scaling
from kernelzoo.analysis.capacity import RULE
from kernelzoo.analysis.pipeline import Analysis
from kernelzoo.records.files import atomic_write, atomic_write_text
from kernelzoo.report.figures import all_figures
from kernelzoo.report.markdown import write_report


def write_tables(a: Analysis) -> None:
    """runs.parquet (the runs and the stall checks), capacity.csv, scaling.csv, factorial.csv."""
    atomic_write(a.exp_dir / "runs.parquet",
                 lambda f: pd.concat([a.runs, a.checks]).to_parquet(f, index=False))
    atomic_write_text(a.exp_dir / "capacity.csv", a.capacity.to_csv(index=False))
    atomic_write_text(a.exp_dir / "scaling.csv",
                      scaling.table(list(a.families)).to_csv(index=False))
    if not a.effects.empty:
        atomic_write_text(a.exp_dir / "factorial.csv", a.effects.to_csv(index=False))


def write(a: Analysis) -> tuple[Path, list[Path]]:
    """Every output of ``a``: (report.md's path, the figures' PNG paths)."""
    write_tables(a)
    figures, omitted = all_figures(a.runs, a.seeds, a.capacity, a.published, a.curves,
                                   list(a.families), a.exp_dir, a.threshold,
                                   a.accuracy_threshold, a.search)
    return write_report(a, figures, omitted, rule=RULE), figures
