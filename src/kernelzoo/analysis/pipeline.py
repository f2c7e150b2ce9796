"""One experiment's analysis: ``analyse`` reads the store once, in one pass, and returns an
``Analysis``, the record every output is written from (``kernelzoo.report``).

What it reads, each once: every run's summary.json and config.yaml (``runs.load_runs``), the
search record (search.json) and the sweep record (sweep.json), the diagnostics.json of each
stalled run (which keys never learned), every run's curve.csv (its dynamics:
``dynamics.run_table``) and those of the runs just below and above each loss-view failure
point, and the reference store's capacity.csv. Nothing here writes.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from kernelzoo.analysis import (answer, between_sizes, dynamics, factorial, optimisation,
                                prediction, published, rank_bound, scaling, settings, stalls,
                                verdicts)
from kernelzoo.analysis.capacity import by_view, capacity_table, loss_failure, seed_table
from kernelzoo.analysis.flags import flags
from kernelzoo.analysis.labels import is_search, natural_key
from kernelzoo.analysis.runs import add_labels, load_runs
from kernelzoo.analysis.tiers import tiers
from kernelzoo.records.files import StoreError, one_line, read_text
from kernelzoo.records.history import read_sweep
from kernelzoo.records.store import CURVE_COLUMNS


@dataclass(frozen=True)
class Analysis:
    """Everything an analysis found in one store; ``runs`` is empty when nothing could be read.

    runs: one row per run (``runs.load_runs``) with its ``rank_bound`` and ``stalled``; checks:
    the stall checks' runs; seeds: ``capacity.seed_table``; capacity: one row per configuration
    (capacity.csv); long: one row per configuration and view with its flags
    (``capacity.by_view``, capacity_long.csv); checked: ``stalls.check_outcomes``; published:
    the authors' points of the matching configurations; families: ``scaling.families``; moves:
    ``optimisation.tables``; effects: ``factorial.table``; placed: ``tiers.tiers``; size_pairs:
    ``between_sizes.pairs``; answer:
    ``answer.facts``; verdicts: ``verdicts.facts`` (verdicts.csv);
    curves: the eval curves of the runs around each failure point; history: sweep.json (None
    without one); stall_lines: one line per stalled run; holes: a grid's missing points (None
    for a search); missing, damaged, set_aside: what could not be read or was left out."""

    experiment: str
    exp_dir: Path
    threshold: float
    accuracy_threshold: float
    runs: pd.DataFrame
    checks: pd.DataFrame = field(default_factory=pd.DataFrame)
    seeds: pd.DataFrame = field(default_factory=pd.DataFrame)
    capacity: pd.DataFrame = field(default_factory=pd.DataFrame)
    long: pd.DataFrame = field(default_factory=pd.DataFrame)
    checked: pd.DataFrame = field(default_factory=pd.DataFrame)
    published: pd.DataFrame = field(default_factory=pd.DataFrame)
    families: tuple = ()
    moves: tuple = ()
    effects: pd.DataFrame = field(default_factory=pd.DataFrame)
    placed: tuple = ()
    size_pairs: tuple = ()
    answer: pd.DataFrame = field(default_factory=pd.DataFrame)
    verdicts: pd.DataFrame = field(default_factory=pd.DataFrame)
    curves: pd.DataFrame = field(default_factory=pd.DataFrame)
    history: dict | None = None
    stall_lines: tuple = ()
    holes: tuple | None = None
    missing: tuple = ()
    damaged: tuple = ()
    set_aside: tuple = ()

    @property
    def search(self) -> bool:
        """True for a failure-point search's probes (no grid to fill)."""
        return is_search(self.runs)


def sort_out(runs: pd.DataFrame, experiment: str) -> tuple[pd.DataFrame, list[str]]:
    """``runs`` without the runs that do not belong to ``experiment`` and with each
    configuration trained under several settings split by them (``settings.py``), and one
    line per run left out or configuration split."""
    if runs.empty:
        return runs, []
    kept, lines = settings.set_aside(runs, experiment)
    if len(kept) < len(runs):
        kept = add_labels(kept.reset_index(drop=True)) if len(kept) else kept.iloc[:0]
    if kept.empty:
        return pd.DataFrame(), lines
    kept, split = settings.split(kept)
    return kept.reset_index(drop=True), lines + split


def grid_holes(runs: pd.DataFrame) -> list[str]:
    """(configuration, seed) pairs lacking an n_keys that the configuration has for another seed,
    or a seed of the experiment altogether (each configuration may have its own key grid)."""
    all_seeds = sorted(runs["seed"].unique())
    present = set(zip(runs["label"], runs["seed"], runs["n_keys"]))
    holes = []
    for label in sorted(runs["label"].unique(), key=natural_key):
        grid = sorted(runs.loc[runs["label"] == label, "n_keys"].unique())
        for seed in all_seeds:
            gaps = [str(n) for n in grid if (label, seed, n) not in present]
            if gaps:
                holes.append(f"{label}, seed {seed}: n_keys {', '.join(gaps)}")
    return holes


def read_curve(path: Path) -> pd.DataFrame:
    """A run's curve.csv as numbers; StoreError naming it when it is not one."""
    try:
        curve = pd.read_csv(io.StringIO(read_text(path)), usecols=list(CURVE_COLUMNS))
        return curve.apply(pd.to_numeric)
    except (ValueError, pd.errors.ParserError) as err:
        raise StoreError(f"{path}: not a curve ({str(err).splitlines()[0]})") from None


class Curves:
    """Each run's curve.csv read once (``read_curve``): the curve, or the error reading it
    raised. ``dynamics.run_table`` and ``curve_table`` share it."""

    def __init__(self, exp_dir: Path):
        self.exp_dir, self.found = exp_dir, {}

    def get(self, run_dir: str) -> pd.DataFrame | Exception:
        if run_dir not in self.found:
            try:
                self.found[run_dir] = read_curve(self.exp_dir / "runs" / run_dir / "curve.csv")
            except (OSError, StoreError) as err:
                self.found[run_dir] = err
        return self.found[run_dir]

    def of(self, run) -> pd.DataFrame | None:
        """A run's curve for ``dynamics.run_table`` (None when missing or damaged: damaged
        files are listed by ``curve_table``)."""
        found = self.get(run.run_dir)
        return None if isinstance(found, Exception) else found


def curve_table(runs: pd.DataFrame, seeds: pd.DataFrame, capacity: pd.DataFrame,
                curves: Curves, damaged: list[str]) -> pd.DataFrame:
    """Eval curves of the runs just below and above each failure point (the median-most seed),
    with each run's stop threshold (``stop_loss``: trainer.stop_loss, NaN if absent); a damaged
    curve is added to ``damaged`` and left out, a missing one left out."""
    frames = []
    for row in capacity[capacity["outcome"] == "fails_at"].itertuples():
        group = seeds[(seeds["label"] == row.label) & (seeds["outcome"] == "fails_at")]
        seed = group.loc[(group["value"] - row.observed_capacity).abs().idxmin()]
        for side, n in (("below", seed["last_pass"]), ("above", seed["first_failure"])):
            match = runs[(runs["label"] == row.label) & (runs["seed"] == seed["seed"])
                         & (runs["n_keys"] == n)]
            curve = curves.get(match["run_dir"].iloc[0])
            if isinstance(curve, FileNotFoundError):
                continue
            if isinstance(curve, Exception):
                damaged.append(one_line(curve))
                continue
            frames.append(curve.assign(label=row.label, n_keys=int(n), side=side,
                                       stop_loss=match["stop_loss"].iloc[0]))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def rank_bounds(runs: pd.DataFrame, threshold: float) -> pd.Series:
    """Each run's loss-view rank bound (``rank_bound.bound_of``; NA where none holds)."""
    bounds = [rank_bound.bound_of(None if pd.isna(r.read_rank) else int(r.read_rank),
                                  r.update_rule, r.replacement, threshold, r.eval_max_queries,
                                  r.eval_query_batch)
              for r in runs.itertuples()]
    return pd.Series(bounds, index=runs.index, dtype="Int64")


def add_stall_columns(table: pd.DataFrame, runs: pd.DataFrame, checks: pd.DataFrame,
                      checked: pd.DataFrame, threshold: float,
                      accuracy_threshold: float) -> pd.DataFrame:
    """Per configuration: its stalled runs, how many have a check and how many the checks
    cleared (loss view), and the loss and accuracy failure points with each checked stalled run
    replaced by its check (``stalls.with_checks``)."""
    if checks.empty:  # nothing verified: the same table
        verified = table.set_index("label")
    else:
        verified_runs = stalls.with_checks(runs, checks)
        verified = capacity_table(verified_runs, seed_table(
            verified_runs, threshold, accuracy_threshold)).set_index("label")
    at = table.columns.get_loc("label")
    by_label = checked.groupby("label")
    columns = {
        "stalled_runs": table["label"].map(runs.groupby("label")["stalled"].sum()).fillna(0),
        "stalls_checked": table["label"].map(by_label.size()).fillna(0),
        "stalls_cleared": table["label"].map(by_label["clears_loss"].sum()).fillna(0),
        "observed_capacity_verified": table["label"].map(verified["observed_capacity"]),
        "observed_capacity_acc_verified": table["label"].map(verified["observed_capacity_acc"])}
    for i, (name, values) in enumerate(columns.items()):
        table.insert(at + i, name, values.astype(int) if name.startswith("stall") else values)
    return table


def _sweep(exp_dir: Path, damaged: list[str]) -> dict | None:
    try:
        return read_sweep(exp_dir)
    except StoreError as err:
        damaged.append(str(err))
        return None


def seeds_of(exp_dir: Path, experiment: str, threshold: float,
             accuracy_threshold: float) -> pd.DataFrame:
    """The seed table of the store at ``exp_dir`` (``capacity.seed_table``) as ``analyse``
    builds it: stall checks and runs of another experiment left out; empty without runs."""
    runs, _, _ = load_runs(exp_dir)
    runs, _ = sort_out(stalls.split_checks(runs)[0], experiment)
    if runs.empty:
        return pd.DataFrame(columns=["label", "seed"])
    return seed_table(runs.assign(rank_bound=rank_bounds(runs, threshold)), threshold,
                      accuracy_threshold)


def analyse(exp_dir: Path, experiment: str, threshold: float, accuracy_threshold: float,
            reference: Path | None = None) -> Analysis:
    """The analysis of the store at ``exp_dir``; ``reference``: the capacity.csv whose failure
    points fill the reference columns (None: none)."""
    runs, missing, damaged = load_runs(exp_dir)
    runs, checks = stalls.split_checks(runs)  # a check's stopping rule differs by design
    runs, set_aside = sort_out(runs, experiment)
    base = dict(experiment=experiment, exp_dir=exp_dir, threshold=threshold,
                accuracy_threshold=accuracy_threshold, missing=tuple(missing),
                set_aside=tuple(set_aside))
    if runs.empty:
        return Analysis(runs=runs, damaged=tuple(damaged), **base)
    runs["rank_bound"] = rank_bounds(runs, threshold)
    runs["stalled"] = stalls.stalled(runs, threshold)
    seeds = seed_table(runs, threshold, accuracy_threshold)
    checked = stalls.check_outcomes(runs, checks, threshold, accuracy_threshold)
    table = add_stall_columns(capacity_table(runs, seeds), runs, checks, checked, threshold,
                              accuracy_threshold)
    curves = Curves(exp_dir)
    table = dynamics.add_columns(table, dynamics.run_table(runs, curves.of))
    points = published.points(runs)
    bounds = table.set_index("label")["rank_bound"].astype(float).fillna(math.inf)
    capacity = published.capacity_columns(
        prediction.add_columns(table, runs), points,
        lambda label, n, loss: loss_failure(n, loss, np.zeros(len(n), bool), threshold,
                                            bounds[label]))
    capacity = published.verdict_column(capacity, seeds)
    capacity = published.reference_columns(capacity, reference)
    around = curve_table(runs, seeds, capacity, curves, damaged)
    history = _sweep(exp_dir, damaged)
    lines, unreadable = stalls.stall_lines(runs, exp_dir / "runs")
    placed = tuple(tiers(capacity, seeds))
    grid = not is_search(runs)
    families = tuple(scaling.families(runs, seeds))
    moves = optimisation.tables(seeds, capacity, grid=grid)
    effects = factorial.table(capacity, seeds)
    family = {label: f.name for f in families for label in f.points["label"].unique()}
    size_pairs = tuple(between_sizes.pairs(capacity, family))
    return Analysis(
        runs=runs, checks=checks, seeds=seeds, capacity=capacity, checked=checked,
        long=by_view(capacity.assign(flags=flags(capacity, seeds, runs, threshold,
                                                     accuracy_threshold))),
        published=points, families=families, moves=moves, effects=effects, placed=placed,
        size_pairs=size_pairs, answer=answer.facts(capacity, seeds, placed),
        verdicts=verdicts.facts(capacity, seeds, families, placed, size_pairs, moves, effects,
                                checked, grid),
        curves=around, history=history,
        stall_lines=tuple(lines), holes=tuple(grid_holes(runs)) if grid else None,
        damaged=tuple(damaged + unreadable), **base)
