"""Capacity analysis of one experiment: failure points, table, figures, report, dashboard.

    python -m kernelzoo.analyze experiment=<name> [results_dir=results] [threshold=0.01]
                                [accuracy_threshold=0.99] [logger=wandb|none]

Reads every ``<results_dir>/<experiment>/runs/*/summary.json`` (never the trainer or the model)
and, for a failure-point search, ``search.json`` (why each probe was trained), saves them as
``runs.parquet`` and writes ``capacity.csv``, the figures (``plots.py``, ``heatmaps.py``; PNG
and SVG) and ``report.md`` (``report.py``) beside it, each atomically. Configurations that are
one of the authors' Figure 2 configurations (``published.py``) also get the failure point of the
authors' published losses by the same rule (``published_capacity``, ``published_outcome``), and
every configuration the failure point of the committed reference runs of the same experiment
(``reference_capacity``, ``reference_outcome``). Grids and the sparse, irregular n_keys of a
search are read alike. Partial sweeps are analysed as far as they go; run directories without a
summary, damaged files (a summary with wrong types, a non-numeric curve, a FIFO, an unreadable
sweep.json or search.json: each named with what is wrong) and grid holes are listed in the
report. Nothing is ever deleted. The command line is checked against
``kernelzoo.config.AnalyzeConfig`` before anything runs.

Failure-point rule (stated again in report.md)
----------------------------------------------
A configuration is (feature_map, params, d_key, d_dot, update_rule). For each configuration and
seed, over n_keys ascending, a grid point fails when its final eval loss is above tau
(``threshold``) or missing, or when the run diverged; infeasible runs are left out. The failure
point is the first failing n whose next grid point fails too (a failure followed by a pass is
noise; a failing last point counts alone). Between the last passing point n_a (loss l_a) and the
failing one n_b (loss l_b), n* = n_a + (log tau - log l_a) / (log l_b - log l_a) * (n_b - n_a),
clamped to [n_a, n_b]; losses are floored at 1e-12 and, when l_b is not finite, n* is the
midpoint. Outcomes: "fails_at" (n*), "never_fails" (lower bound: the largest n tried),
"fails_everywhere" (the first point already fails; upper bound: the smallest n tried) and
"no_data". Failures below the failure point (each followed by a pass) are listed as noise.
The accuracy criterion is the same rule with accuracy < ``accuracy_threshold``,
interpolated linearly in accuracy. Seeds aggregate to the median of their numbers (bounds
included) with a min-max interval below 5 seeds, else a bootstrap 95% percentile interval (RNG
seed 0); a single seed's interval is its bracket [n_a, n_b] (a bound's, the bound itself); a configuration's outcome is its most common seed outcome (ties: fails_at, then
fails_everywhere). Predicted capacity = the map's d_dot (null: unbounded); ratio = observed /
predicted.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import hydra
import numpy as np
import pandas as pd
from hydra._internal.utils import get_args_parser
from omegaconf import DictConfig, OmegaConf

from kernelzoo import config, plots, published, tracking
from kernelzoo.files import StoreError, atomic_write, atomic_write_text, one_line, read_text
from kernelzoo.report import write_report
from kernelzoo.search import LOSS_FLOOR, candidate, failing
from kernelzoo.store import (CURVE_COLUMNS, experiment_dir, read_config_value, read_search,
                             read_summary)
from kernelzoo.style import is_search, natural_key

CONFIG_KEYS = ("feature_map", "params", "d_key", "d_dot", "update_rule")
CAPACITY_COLUMNS = CONFIG_KEYS + (
    "predicted_capacity", "n_seeds", "observed_capacity", "ci_low", "ci_high", "first_failure",
    "ratio", "outcome",
)
EXTRA_COLUMNS = ("observed_capacity_acc", "ci_low_acc", "ci_high_acc", "first_failure_acc",
                 "outcome_acc", "label")
OUTCOMES = ("fails_at", "fails_everywhere", "never_fails")  # tie-break order
BOOTSTRAP_SAMPLES = 2000
BASE_LABELS = {"elu": "ELU+1", "dpfp": "DPFP", "favor": "FAVOR+", "softmax": "softmax",
               "relu": "ReLU", "taylor": "Taylor", "squared_relu": "ReLU²", "hedgehog": "Hedgehog",
               "t2r": "T2R", "rebased": "ReBased", "polysketch": "PolySketch",
               "cosformer": "cosFormer"}
ESSENTIAL_PARAMS = {"dpfp": ("nu",), "favor": ("m",), "trig": ("m",), "t2r": ("m",),
                    "polysketch": ("r",)}


def _fmt(value) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return f"{value:g}" if isinstance(value, float) else str(value)


def canonical_params(params: dict) -> str:
    """``{"nu": 2, "a": True}`` -> ``"a=true,nu=2"``; ``""`` for no parameters."""
    return ",".join(f"{k}={_fmt(v)}" for k, v in sorted(params.items()))


def _number(value) -> float:
    """A summary number as float: null -> NaN, the store's "inf" strings -> inf."""
    return math.nan if value is None else float(value)


def _row(summary: dict, run_dir: str) -> dict:
    """One row of ``runs`` from a summary whose types ``read_summary`` checked."""
    params = summary["feature_map_params"]
    row = dict(summary, run_dir=run_dir, params=canonical_params(params),
               feature_map_params=json.dumps(params, sort_keys=True))
    for key in ("final_eval_loss", "best_eval_loss", "final_eval_accuracy", "wall_seconds"):
        row[key] = _number(summary[key])
    return row


def load_runs(exp_dir: Path) -> tuple[pd.DataFrame, list[str], list[str]]:
    """(one row per readable summary, run dirs without summary, one line per damaged file:
    a bad summary, something in runs/ that is no run directory, an unreadable search.json).
    Hidden entries (a forced rerun in progress) are not runs."""
    rows, missing, damaged = [], [], []
    for path in sorted(p for p in (exp_dir / "runs").iterdir() if not p.name.startswith(".")):
        if not path.is_dir():
            damaged.append(f"{path}: not a run directory")
        elif not (path / "summary.json").exists():
            missing.append(path.name)
        else:
            try:
                rows.append(_row(read_summary(path), path.name))
            except StoreError as err:
                damaged.append(str(err))
    runs = pd.DataFrame(rows)
    if runs.empty:
        return runs, missing, damaged
    try:
        search = read_search(exp_dir) or {}
    except StoreError as err:
        damaged.append(str(err))
        search = {}
    probes = {p["run_id"]: p for series in search.values()
              for p in series["probes"] if isinstance(p, dict) and "run_id" in p}
    runs["probe_round"] = [probes.get(r, {}).get("round") for r in runs["run_id"]]
    runs["probe_round"] = runs["probe_round"].astype("Int64")
    runs["probe_why"] = [probes.get(r, {}).get("why") for r in runs["run_id"]]
    for key in ("d_dot", "predicted_capacity"):
        runs[key] = runs[key].astype("Int64")
    return add_labels(runs), missing, damaged


def add_labels(runs: pd.DataFrame) -> pd.DataFrame:
    """Add ``label``: a short human name per configuration, unique within the experiment.

    Shows the map's essential parameters (nu, m), the parameters that vary among its
    configurations, and d_key / update_rule / d_dot only where needed to tell them apart.
    """
    configs = runs.drop_duplicates(list(CONFIG_KEYS))
    across = [k for k in ("d_key", "update_rule") if runs[k].nunique() > 1]
    labels = {}
    for fmap, group in configs.groupby("feature_map"):
        dicts = [json.loads(p) for p in group["feature_map_params"]]
        keys = sorted(set().union(*dicts))
        shown = [k for k in keys if k in ESSENTIAL_PARAMS.get(fmap, ())
                 or len({json.dumps(d.get(k)) for d in dicts}) > 1]
        for (_, row), params in zip(group.iterrows(), dicts):
            parts = [BASE_LABELS.get(fmap, fmap)]
            if fmap == "dpfp" and "nu" in params:
                parts = [f"DPFP-{params['nu']}"]
            for k in shown:
                if k in params and not (fmap == "dpfp" and k == "nu"):
                    v = params[k]
                    parts.append(v if isinstance(v, str) else f"{k}={_fmt(v)}")
            parts += [f"d_key={row['d_key']}" if k == "d_key" else str(row[k]) for k in across]
            labels[tuple(row[k] for k in CONFIG_KEYS)] = " ".join(parts)
    counts = Counter(labels.values())
    labels = {key: f"{lab} d_dot={key[3]}" if counts[lab] > 1 else lab
              for key, lab in labels.items()}
    runs = runs.copy()
    runs["label"] = [labels[key] for key in zip(*(runs[k] for k in CONFIG_KEYS))]
    return runs


@dataclass(frozen=True)
class SeedResult:
    """Failure point of one (configuration, seed) series."""

    outcome: str
    value: float          # n* for fails_at, else the bound (NaN for no_data)
    first_failure: float  # the grid n where the rule fires (NaN if it never does)
    last_pass: float      # the passing grid n just before it (fails_at only)
    noise: tuple = ()     # failing n below the failure point, each followed by a pass


def failure_point(n: np.ndarray, failing: np.ndarray, cross) -> SeedResult:
    """The rule on one series sorted by n; ``cross(i)`` interpolates between points i-1 and i."""
    if len(n) == 0:
        return SeedResult("no_data", math.nan, math.nan, math.nan)
    i = candidate(list(failing))
    noise = tuple(float(x) for x, f in zip(n[:len(n) if i is None else i], failing) if f)
    if i is None:
        return SeedResult("never_fails", float(n[-1]), math.nan, math.nan, noise)
    if i == 0:
        return SeedResult("fails_everywhere", float(n[0]), float(n[0]), math.nan)
    value = min(max(cross(i), n[i - 1]), n[i])
    return SeedResult("fails_at", float(value), float(n[i]), float(n[i - 1]), noise)


def loss_failure(n, loss, diverged, threshold: float) -> SeedResult:
    """Loss criterion: fails when loss > threshold, missing, or diverged; log-linear crossing."""
    n, loss = np.asarray(n, float), np.asarray(loss, float)

    def cross(i):
        if not np.isfinite(loss[i]):
            return (n[i - 1] + n[i]) / 2
        la, lb = np.log10(max(loss[i - 1], LOSS_FLOOR)), np.log10(loss[i])
        return n[i - 1] + (np.log10(threshold) - la) / (lb - la) * (n[i] - n[i - 1])

    return failure_point(n, failing(loss, diverged, threshold), cross)


def accuracy_failure(n, accuracy, diverged, threshold: float) -> SeedResult:
    """Accuracy criterion: fails when accuracy < threshold, missing, or diverged; linear."""
    n, acc = np.asarray(n, float), np.asarray(accuracy, float)
    fails = np.asarray(diverged, bool) | ~(acc >= threshold)

    def cross(i):
        if not np.isfinite(acc[i]):
            return (n[i - 1] + n[i]) / 2
        return n[i - 1] + (acc[i - 1] - threshold) / (acc[i - 1] - acc[i]) * (n[i] - n[i - 1])

    return failure_point(n, fails, cross)


def aggregate(values) -> tuple[float, float, float]:
    """(median, low, high): min-max below 5 values, else a bootstrap 95% percentile interval."""
    values = np.asarray([v for v in values if not math.isnan(v)], float)
    if len(values) == 0:
        return math.nan, math.nan, math.nan
    if len(values) < 5:
        return float(np.median(values)), float(values.min()), float(values.max())
    draws = np.random.default_rng(0).choice(values, size=(BOOTSTRAP_SAMPLES, len(values)))
    low, high = np.percentile(np.median(draws, axis=1), [2.5, 97.5])
    return float(np.median(values)), float(low), float(high)


def combine(outcomes) -> str:
    """The most common seed outcome (ties in the order of OUTCOMES); no_data if none has data."""
    counts = Counter(o for o in outcomes if o != "no_data")
    if not counts:
        return "no_data"
    return max(OUTCOMES, key=lambda o: (counts[o], -OUTCOMES.index(o)))


def seed_table(runs: pd.DataFrame, threshold: float, accuracy_threshold: float) -> pd.DataFrame:
    """One row per (label, seed): both criteria's SeedResults; infeasible points left out."""
    rows = []
    for (label, seed), group in runs.groupby(["label", "seed"], sort=True):
        series = group[group["status"] != "infeasible"].sort_values("n_keys")
        diverged = series["status"].eq("diverged")
        loss = loss_failure(series["n_keys"], series["final_eval_loss"], diverged, threshold)
        acc = accuracy_failure(series["n_keys"], series["final_eval_accuracy"], diverged,
                               accuracy_threshold)
        rows.append({"label": label, "seed": seed, **vars(loss),
                     **{f"{k}_acc": v for k, v in vars(acc).items()}})
    return pd.DataFrame(rows)


def capacity_table(runs: pd.DataFrame, seeds: pd.DataFrame) -> pd.DataFrame:
    """One row per configuration with the columns of CAPACITY_COLUMNS + EXTRA_COLUMNS."""
    rows = []
    for label, group in seeds.groupby("label"):
        first = runs[runs["label"] == label].iloc[0]
        observed, low, high = aggregate(group["value"])
        if len(group) == 1 and group["outcome"].iloc[0] == "fails_at":  # its bracket
            low, high = group["last_pass"].iloc[0], group["first_failure"].iloc[0]
        observed_acc, low_acc, high_acc = aggregate(group["value_acc"])
        predicted = first["predicted_capacity"]
        rows.append({
            **{k: first[k] for k in CONFIG_KEYS}, "predicted_capacity": predicted,
            "n_seeds": int((group["outcome"] != "no_data").sum()),
            "observed_capacity": observed, "ci_low": low, "ci_high": high,
            "first_failure": aggregate(group["first_failure"])[0],
            "ratio": math.nan if pd.isna(predicted) else observed / predicted,
            "outcome": combine(group["outcome"]),
            "observed_capacity_acc": observed_acc, "ci_low_acc": low_acc, "ci_high_acc": high_acc,
            "first_failure_acc": aggregate(group["first_failure_acc"])[0],
            "outcome_acc": combine(group["outcome_acc"]), "label": label,
        })
    table = pd.DataFrame(rows, columns=list(CAPACITY_COLUMNS + EXTRA_COLUMNS))
    for key in ("d_dot", "predicted_capacity"):
        table[key] = table[key].astype("Int64")
    order = sorted(range(len(table)), key=lambda i: natural_key(table["label"].iloc[i]))
    return table.iloc[order].reset_index(drop=True)


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
            stop_loss = _number(read_config_value(path.parent, "trainer.stop_loss"))
            frames.append(curve.assign(label=row.label, n_keys=int(n), side=side,
                                       stop_loss=stop_loss))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def log_dashboard(cfg: DictConfig, capacity: pd.DataFrame, figures: list[Path]) -> None:
    """Log the table and the figures to wandb; a failure is one warning line, nothing more."""
    tracker = tracking.start(
        True, cfg.results_dir, project=cfg.logger.get("project") or tracking.PROJECT,
        entity=cfg.logger.get("entity"), group=cfg.experiment, name=f"{cfg.experiment}-analysis",
        config=OmegaConf.to_container(cfg), job_type="analysis")
    if tracker.run is None:
        return
    try:
        import wandb

        table = capacity.astype(object).where(capacity.notna(), None)
        tracker.run.log({"capacity": wandb.Table(dataframe=table),
                         **{f"figures/{p.stem}": wandb.Image(str(p)) for p in figures}})
        tracker.finish()
    except Exception as err:  # the dashboard is a view: local outputs are already complete
        print(f"warning: wandb logging failed ({type(err).__name__}: {err}); "
              "the local outputs are complete", file=sys.stderr)
        with contextlib.suppress(Exception):
            tracker.finish(exit_code=1)


def analyze(cfg: DictConfig) -> None:
    """Load, compute failure points, write runs.parquet, capacity.csv, figures and report.md."""
    exp_dir = experiment_dir(cfg.results_dir, cfg.experiment)
    runs, missing, damaged = load_runs(exp_dir)
    if runs.empty:
        for line in damaged:
            print(f"warning: skipped damaged file: {line}", file=sys.stderr)
        print(f"nothing to analyse in {exp_dir / 'runs'}: {len(missing)} runs without summary, "
              f"{len(damaged)} damaged", file=sys.stderr)
        return
    atomic_write(exp_dir / "runs.parquet", lambda f: runs.to_parquet(f, index=False))
    seeds = seed_table(runs, cfg.threshold, cfg.accuracy_threshold)
    points = published.points(runs)
    capacity = published.capacity_columns(
        capacity_table(runs, seeds), points,
        lambda n, loss: loss_failure(n, loss, np.zeros(len(n), bool), cfg.threshold))
    reference = experiment_dir(cfg.get("reference_dir") or exp_dir.parent, cfg.experiment)
    capacity = published.reference_columns(
        capacity, None if reference.resolve() == exp_dir.resolve() else reference / "capacity.csv")
    atomic_write_text(exp_dir / "capacity.csv", capacity.to_csv(index=False))
    search = is_search(runs)  # sparse probes: no grid to fill
    curves = curve_table(runs, seeds, capacity, exp_dir, damaged)
    figures, omitted = plots.all_figures(runs, capacity, points, curves, exp_dir, cfg.threshold,
                                         cfg.accuracy_threshold, search)
    report, damaged = write_report(exp_dir, cfg.experiment, runs, seeds, capacity, missing,
                                   damaged, None if search else grid_holes(runs), figures,
                                   omitted, cfg.threshold, cfg.accuracy_threshold,
                                   rule=__doc__.partition("---\n")[2].strip())
    for line in damaged:
        print(f"warning: skipped damaged file: {line}", file=sys.stderr)
    print(f"analysed {len(runs)} runs of {cfg.experiment} -> {report}")
    if cfg.logger.get("name") != "none":
        log_dashboard(cfg, capacity, figures)


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
    args = get_args_parser().parse_args(sys.argv[1:])
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
    _hydra_main()


if __name__ == "__main__":
    main()
