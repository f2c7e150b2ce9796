"""Every output of an analysis, written from its ``Analysis`` into the experiment's directory,
each file atomically: runs.parquet, capacity.csv (one row per configuration), capacity_long.csv
(one row per configuration and view, with its flags), scaling.csv, verdicts.csv (every
verdict as facts), headlines.csv (report.md's first screen), factorial.csv (where
configurations form a 2^k design), probes.csv (a search's probes), stalls.csv (the stalled
runs), the figures (PNG and SVG) and report.md."""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd

from kernelzoo.analysis import scaling
from kernelzoo.analysis.pipeline import Analysis
from kernelzoo.records.files import atomic_write, atomic_write_text
from kernelzoo.report.figures import all_figures
from kernelzoo.report.markdown import probes_table, write_report
from kernelzoo.report.verdicts import headlines

STALL_COLUMNS = ["label", "seed", "n_keys", "dead_keys", "status", "final_eval_loss",
                 "final_eval_accuracy", "run_id"]


def _csv(path: Path, frame: pd.DataFrame) -> None:
    atomic_write_text(path, frame.to_csv(index=False))


def write_tables(a: Analysis, lines: pd.DataFrame) -> None:
    """runs.parquet (the runs and the stall checks) and the CSV tables (``lines``: the
    headlines); probes.csv and stalls.csv only where there are probes or stalled runs."""
    atomic_write(a.exp_dir / "runs.parquet",
                 lambda f: pd.concat([a.runs, a.checks]).to_parquet(f, index=False))
    _csv(a.exp_dir / "capacity.csv", a.capacity)
    _csv(a.exp_dir / "capacity_long.csv", a.long)
    _csv(a.exp_dir / "scaling.csv", scaling.table(list(a.families)))
    _csv(a.exp_dir / "verdicts.csv", a.verdicts)
    _csv(a.exp_dir / "headlines.csv", lines)
    if len(a.answer):
        _csv(a.exp_dir / "answer.csv", a.answer)
    if not a.effects.empty:
        _csv(a.exp_dir / "factorial.csv", a.effects)
    if a.search:
        _csv(a.exp_dir / "probes.csv", probes_table(a))
    if a.runs["stalled"].any():
        _csv(a.exp_dir / "stalls.csv", a.runs.loc[a.runs["stalled"], STALL_COLUMNS])


INCOMPLETE = "ANALYSIS_INCOMPLETE.txt"  # beside outputs an analysis began and did not finish


def write(a: Analysis, figures: bool = True) -> tuple[Path, list[Path]]:
    """Every output of ``a``: (report.md's path, the figures' PNG paths); without ``figures``,
    the tables and report.md alone (its Figures section says they were not drawn, and that
    any beside it are an earlier analysis'). ``INCOMPLETE`` is
    written first and removed once report.md is: an analysis that fails on the way (a full
    disk) leaves it beside the tables and figures it did write, which are then newer than the
    report, so the set says it is mixed."""
    marker = a.exp_dir / INCOMPLETE
    atomic_write_text(marker, f"an analysis begun at {time.strftime('%Y-%m-%d %H:%M:%S')} did "
                      "not finish: the tables and figures here may be newer than report.md; "
                      "`make plots` (python -m kernelzoo.analyze) writes them all again\n")
    lines = headlines(a)
    write_tables(a, lines)
    if figures:
        drawn, omitted = all_figures(a.runs, a.seeds, a.capacity, a.published, a.curves,
                                     list(a.families), a.exp_dir, a.threshold,
                                     a.accuracy_threshold, a.search)
    else:
        drawn, omitted = [], ["figures: not drawn (analysed with figures=false); any figure "
                              "beside this report is an earlier analysis'"]
    report = write_report(a, lines, drawn, omitted)
    marker.unlink()
    return report, drawn
