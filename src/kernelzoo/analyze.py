"""Capacity analysis of one experiment: failure points, table, figures, report, dashboard.

    python -m kernelzoo.analyze experiment=<name> [results_dir=results] [threshold=0.01]
                                [accuracy_threshold=0.99] [logger=wandb|none]

Reads every ``<results_dir>/<experiment>/runs/*/summary.json`` (never the trainer or the model) and,
for a failure-point search, ``search.json`` (why each probe was trained), saves them as
``runs.parquet`` and writes ``capacity.csv``, ``scaling.csv`` (``scaling.py``: each family's failure
points against d_dot, n* = a d_dot^b with t intervals), ``factorial.csv`` where configurations form
a 2^k design (``factorial.py``: each change's effect with its interval), the figures (``plots.py``,
``heatmaps.py``; PNG and SVG) and ``report.md`` (``report.py``) beside it, each atomically.
Configurations that are one of the authors' Figure 2 configurations (``published.py``) also get the
failure point of the authors' published losses by the same rule (``published_capacity``,
``published_outcome``); every configuration gets the failure point of the committed reference runs
of the same experiment (``reference_capacity``, ``reference_outcome``) and the ranks of its written
keys' features measured at the n_keys = d_dot probe, before its failure point is known
(``prediction.py``: ``rank_at_d_dot`` and the like). Grids and the sparse, irregular n_keys of a
search are read alike. Partial sweeps are analysed as far as they go; run directories without a
summary, damaged files (a summary with wrong types, a non-numeric curve, a FIFO, an unreadable
sweep.json or search.json: each named with what is wrong) and grid holes are listed in the
report. Runs that stalled (``stalls.py``) are marked in runs.parquet (``stalled``) and listed in
the report; the failure-point rule counts them as they ended (a stall is a diagnosis), and only
the verified columns replace a stalled run by its check (``stall_check=true``). Nothing is ever
deleted. The command line is
checked against ``kernelzoo.config.AnalyzeConfig`` before anything runs. The failure-point rule is
in ``capacity.py`` (and in every report); the wandb dashboard's tables in ``dashboard_tables``, its
charts in ``tracking.log_dashboard``.
"""

from __future__ import annotations

import io
import math
import sys
from pathlib import Path

import hydra
import numpy as np
import pandas as pd
from omegaconf import DictConfig, OmegaConf

from kernelzoo import config
from kernelzoo.config.hydra_internals import args_parser
from kernelzoo.analysis import (dynamics, efficiency, factorial, plots, prediction, published,
                                rank_bound, scaling, settings, stalls)
from kernelzoo.records import tracking
from kernelzoo.training import interrupt
from kernelzoo.analysis.capacity import RULE, by_view, capacity_table, loss_failure, seed_table
from kernelzoo.records.files import StoreError, atomic_write, atomic_write_text, one_line, read_text
from kernelzoo.analysis.report import write_report
from kernelzoo.analysis.runs import add_labels, load_runs, number
from kernelzoo.records.store import CURVE_COLUMNS, experiment_dir, read_config_value
from kernelzoo.analysis.style import is_search, natural_key
from kernelzoo.config.words import plural


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


def curve_reader(exp_dir: Path):
    """A run's curve.csv by ``read_curve`` (None when missing or damaged: damaged files are
    listed by ``curve_table``), for ``dynamics.run_table``."""
    def read(run):
        try:
            return read_curve(exp_dir / "runs" / run.run_dir / "curve.csv")
        except (OSError, StoreError):
            return None
    return read


def curve_table(runs: pd.DataFrame, seeds: pd.DataFrame, capacity: pd.DataFrame,
                exp_dir: Path, damaged: list[str]) -> pd.DataFrame:
    """Eval curves of the runs just below and above each failure point (the median-most seed),
    with each run's stop threshold (``trainer.stop_loss`` in its config.yaml; NaN if absent);
    a damaged curve is added to ``damaged`` and left out, a missing one left out."""
    frames = []
    for row in capacity[capacity["outcome"] == "fails_at"].itertuples():
        group = seeds[(seeds["label"] == row.label) & (seeds["outcome"] == "fails_at")]
        seed = group.loc[(group["value"] - row.observed_capacity).abs().idxmin()]
        for side, n in (("below", seed["last_pass"]), ("above", seed["first_failure"])):
            match = runs[(runs["label"] == row.label) & (runs["seed"] == seed["seed"])
                         & (runs["n_keys"] == n)]
            path = exp_dir / "runs" / match["run_dir"].iloc[0] / "curve.csv"
            try:
                curve = read_curve(path)
            except FileNotFoundError:
                continue
            except (OSError, StoreError) as err:
                damaged.append(one_line(err))
                continue
            stop_loss = number(read_config_value(path.parent, "trainer.stop_loss"))
            frames.append(curve.assign(label=row.label, n_keys=int(n), side=side,
                                       stop_loss=stop_loss))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def rank_bounds(runs: pd.DataFrame, threshold: float) -> pd.Series:
    """Each run's loss-view rank bound (``rank_bound.bound_of``; NA where none holds)."""
    bounds = [rank_bound.bound_of(None if pd.isna(r.read_rank) else int(r.read_rank),
                                  r.update_rule, r.replacement, threshold, r.eval_max_queries,
                                  r.eval_query_batch)
              for r in runs.itertuples()]
    return pd.Series(bounds, index=runs.index, dtype="Int64")


def add_stall_columns(table: pd.DataFrame, runs: pd.DataFrame, checks: pd.DataFrame,
                      checked: pd.DataFrame, cfg) -> pd.DataFrame:
    """Per configuration: its stalled runs, how many have a check and how many the checks
    cleared (loss view), and the loss and accuracy failure points with each checked stalled run
    replaced by its check (``stalls.with_checks``)."""
    if checks.empty:  # nothing verified: the same table
        verified = table.set_index("label")
    else:
        verified_runs = stalls.with_checks(runs, checks)
        verified = capacity_table(verified_runs, seed_table(
            verified_runs, cfg.threshold, cfg.accuracy_threshold)).set_index("label")
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


def dashboard_tables(runs: pd.DataFrame, capacity: pd.DataFrame,
                     families: list[scaling.Family]) -> dict[str, pd.DataFrame]:
    """The tables of the wandb dashboard (``tracking.log_dashboard``), each with feature_map and
    view columns to filter by: capacity (``capacity.by_view``), efficiency
    (``efficiency.efficiency_table``), scaling (``scaling.csv``) and keys: per configuration, view
    and n_keys the median over seeds of the final eval loss, accuracy or keys retrieved (no
    value where the run diverged), one ``series`` per configuration (a search's: per seed)."""
    feasible = runs[runs["status"] != "infeasible"]
    diverged = feasible["status"].eq("diverged")
    series = feasible["label"] if not is_search(runs) else \
        feasible["label"] + " seed " + feasible["seed"].astype(str)
    values = {"loss": feasible["final_eval_loss"], "accuracy": feasible["final_eval_accuracy"],
              "keys_retrieved": feasible["n_keys"] * feasible["final_eval_accuracy"]}
    keys = pd.concat([
        feasible[["feature_map", "label", "update_rule", "n_keys"]]
        .assign(series=series, view=view, value=value.where(~diverged).astype(float))
        .groupby(["feature_map", "label", "update_rule", "series", "view", "n_keys"])["value"]
        .agg(value="median", seeds="size").reset_index() for view, value in values.items()],
        ignore_index=True)
    return {"capacity": by_view(capacity), "efficiency": efficiency.efficiency_table(capacity),
            "scaling": scaling.table(families), "keys": keys}


def analyze(cfg: DictConfig) -> None:
    """Load, compute failure points, write runs.parquet, capacity.csv, scaling.csv, figures
    and report.md."""
    exp_dir = experiment_dir(cfg.results_dir, cfg.experiment)
    runs, missing, damaged = load_runs(exp_dir)
    runs, checks = stalls.split_checks(runs)  # a check's stopping rule differs by design
    runs, set_aside = sort_out(runs, cfg.experiment)
    for line in set_aside:
        print(f"warning: {line}", file=sys.stderr)
    if runs.empty:
        for line in damaged:
            print(f"warning: skipped damaged file: {line}", file=sys.stderr)
        print(f"nothing to analyse in {exp_dir / 'runs'}: {plural(len(missing), 'run')} without "
              f"summary, {len(damaged)} damaged", file=sys.stderr)
        return
    runs["rank_bound"] = rank_bounds(runs, cfg.threshold)
    runs["stalled"] = stalls.stalled(runs, exp_dir / "runs", cfg.threshold)
    atomic_write(exp_dir / "runs.parquet",
                 lambda f: pd.concat([runs, checks]).to_parquet(f, index=False))
    seeds = seed_table(runs, cfg.threshold, cfg.accuracy_threshold)
    table = capacity_table(runs, seeds)
    checked = stalls.check_outcomes(runs, checks, cfg.threshold, cfg.accuracy_threshold)
    table = add_stall_columns(table, runs, checks, checked, cfg)
    table = dynamics.add_columns(table, dynamics.run_table(runs, curve_reader(exp_dir)))
    points = published.points(runs)
    bounds = table.set_index("label")["rank_bound"].astype(float).fillna(math.inf)
    capacity = published.capacity_columns(
        prediction.add_columns(table, runs), points,
        lambda label, n, loss: loss_failure(n, loss, np.zeros(len(n), bool), cfg.threshold,
                                            bounds[label]))
    capacity = published.verdict_column(capacity, seeds)
    reference = experiment_dir(cfg.get("reference_dir") or exp_dir.parent, cfg.experiment)
    capacity = published.reference_columns(
        capacity, None if reference.resolve() == exp_dir.resolve() else reference / "capacity.csv")
    atomic_write_text(exp_dir / "capacity.csv", capacity.to_csv(index=False))
    families = scaling.families(runs, seeds)
    atomic_write_text(exp_dir / "scaling.csv", scaling.table(families).to_csv(index=False))
    effects = factorial.table(capacity, seeds)
    if not effects.empty:
        atomic_write_text(exp_dir / "factorial.csv", effects.to_csv(index=False))
    search = is_search(runs)  # sparse probes: no grid to fill
    curves = curve_table(runs, seeds, capacity, exp_dir, damaged)
    figures, omitted = plots.all_figures(runs, seeds, capacity, points, curves, families, exp_dir,
                                         cfg.threshold, cfg.accuracy_threshold, search)
    report, damaged = write_report(exp_dir, cfg.experiment, runs, seeds, capacity, checked,
                                   families, missing, damaged,
                                   None if search else grid_holes(runs), figures, omitted,
                                   cfg.threshold, cfg.accuracy_threshold, rule=RULE,
                                   set_aside=set_aside, effects=effects)
    for line in damaged:
        print(f"warning: skipped damaged file: {line}", file=sys.stderr)
    print(f"analysed {plural(len(runs), 'run')} of {cfg.experiment} -> {report}")
    if cfg.logger.get("name") != "none":
        tracking.log_dashboard(cfg, dashboard_tables(runs, capacity, families), figures)


def _experiments(results_dir: str) -> str:
    root = Path(results_dir)
    if not root.is_dir():
        return f"results_dir {root} does not exist"
    names = sorted(p.name for p in root.iterdir() if (p / "runs").is_dir())
    return f"experiments in {root}: {', '.join(names) or 'none'}"


def validate(cfg: DictConfig) -> str | None:
    """The first problem with ``cfg`` (composed, without its hydra node) as one line, or None."""
    if OmegaConf.is_missing(cfg, "experiment"):
        return f"experiment=<name> is required ({_experiments(cfg.results_dir)})"
    try:
        config.check(cfg, config.AnalyzeConfig)
    except config.UsageError as err:
        return str(err)
    runs_dir = experiment_dir(cfg.results_dir, cfg.experiment) / "runs"
    if not runs_dir.is_dir():
        return (f"unknown experiment {cfg.experiment!r}: no {runs_dir} "
                f"({_experiments(cfg.results_dir)})")
    return None


@hydra.main(config_path=str(config.CONF), config_name="analyze", version_base="1.3")
def _hydra_main(cfg: DictConfig) -> None:
    try:
        analyze(cfg)
    except OSError as err:  # a full disk: the outputs written so far are whole, the rest old
        print(f"kernelzoo-analyze: error: {one_line(err)}", file=sys.stderr)
        sys.exit(1)


def main() -> None:
    """Console entry point: the command line is composed and checked as Hydra will run it, so
    a bad value is one line and exit code 2 before anything is read or written."""
    sys.argv[1:] = config.expand_home(sys.argv[1:])  # before Hydra reads them too
    args = args_parser().parse_args(sys.argv[1:])
    if args.help:  # what the analysis takes and writes, not Hydra's listing of train's groups
        title, usage = __doc__.split("\n\n")[:2]
        print(f"usage:\n{usage}\n\n{title} Writes runs.parquet, capacity.csv, scaling.csv, the "
              "figures and report.md into <results_dir>/<experiment>/.\n"
              f"{_experiments(config.compose('analyze', []).results_dir)}")
        sys.exit(0)
    if not any((args.help, args.hydra_help, args.cfg, args.info, args.shell_completion,
                args.config_path, args.config_dir)):
        try:
            with config.as_job(config.compose("analyze", args.overrides)) as job:
                error = validate(job)
        except config.UsageError as err:
            error = str(err)
        if error:
            print(f"kernelzoo-analyze: error: {error}", file=sys.stderr)
            sys.exit(2)
    with interrupt.handled():  # a file being written is removed, the others stay whole
        try:
            _hydra_main()
        except interrupt.Interrupted as stop:
            print(f"kernelzoo-analyze: stopped by {stop.name}; every output written is whole "
                  "(the old file or the new), and a rerun writes them all", file=sys.stderr)
            sys.exit(stop.exit_code)


if __name__ == "__main__":
    main()
