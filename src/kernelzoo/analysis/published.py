"""What a user's failure points are set beside: the authors' published Figure 2 losses, matched
to this suite's configurations, and the committed reference runs of the same experiment.

``data/published_figure2.csv`` (provenance in ``data/README.md``: the final eval loss of each of
the 240 Figure 2 runs, from the logs Schlag et al. released, seed 1) is shipped with the package.
``points(runs)`` gives the published series of every configuration of ``runs`` that is one of
the authors', under its label; ``capacity_columns`` runs the analysis' failure-point rule over
each series.

A configuration is one of the authors' when it is Setting 1 (task ``capacity``) at the same
d_key, update rule and learning rate (1e-3; stores that do not record it count as 1e-3), with
the feature map and the parameters that define their map:

- ``linear``: ``elu``;
- ``dpfpN``: ``dpfp`` with nu = N;
- ``favorM``: ``favor`` with m = M as they ran it (two-sided ``hyperbolic``, orthogonal, a new
  projection every call, unscaled inputs, not stabilised); the other parameters are free;
- ``softmax``: ``softmax``. Their update rule for it is ``cat`` (keys and values concatenated:
  exact attention), which this suite records as ``sum``, the only rule it runs softmax with.
"""

from __future__ import annotations

import io
import json
import math
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import optimize, stats

from kernelzoo.analysis import censored
from kernelzoo.records.files import StoreError, read_text

CSV = "published_figure2.csv"
AUTHORS_FAVOR = {"variant": "hyperbolic", "orthogonal": True, "redraw": "every_call",
                 "input_scale": 1.0, "stabilize": False}
UPDATE_RULES = {"cat": "sum"}  # the authors' name -> this suite's
PUBLISHED_COLUMNS = ("published_capacity", "published_outcome", "published_last_pass",
                     "published_first_failure", "published_verdict")
REFERENCE_COLUMNS = ("reference_capacity", "reference_outcome")
POINT_COLUMNS = ("label", "source", "n_keys", "final_eval_loss", "steps")


def configuration(name: str) -> tuple[str, dict]:
    """(feature_map, the parameters it must have) for one of the authors' names."""
    if name in ("linear", "softmax"):
        return ("elu" if name == "linear" else "softmax"), {}
    match = re.fullmatch(r"(dpfp|favor)(\d+)", name)
    if match is None:
        raise ValueError(f"{CSV}: unknown feature_map {name!r} "
                         "(known: linear, softmax, dpfpN, favorM)")
    fmap, number = match.group(1), int(match.group(2))
    return (fmap, {"nu": number}) if fmap == "dpfp" else (fmap, {"m": number, **AUTHORS_FAVOR})


def load() -> pd.DataFrame:
    """The published table as shipped; every feature_map name must be one ``configuration``
    knows (a ValueError names the first that is not)."""
    with resources.files("kernelzoo").joinpath("data", CSV).open() as f:
        table = pd.read_csv(f)
    for name in table["feature_map"].unique():
        configuration(name)
    return table


PUBLISHED_LR = "0.001"  # the analysis' lr column (style.format_value) of the authors' 1e-3
# the authors' stopping rule (task-spec "Training"), as labels write the settings
PUBLISHED_STOPPING = {"trainer.patience": "10", "trainer.max_steps": "100000"}


def _matches(name: str, rule: str, d_key: int, config) -> bool:
    fmap, required = configuration(name)
    params = json.loads(config.feature_map_params)
    return (config.task == "capacity" and config.feature_map == fmap
            and getattr(config, "lr", "") in ("", PUBLISHED_LR)
            and int(config.d_key) == d_key and config.update_rule == UPDATE_RULES.get(rule, rule)
            and all(k in params and params[k] == v for k, v in required.items()))


def points(runs: pd.DataFrame, published: pd.DataFrame | None = None) -> pd.DataFrame:
    """The published points (columns POINT_COLUMNS, n_keys ascending) of every configuration of
    ``runs`` that is one of the authors'; ``source`` is their name for it."""
    published = load() if published is None else published
    frames = []
    for config in runs.drop_duplicates("label").itertuples():
        for (name, rule, d_key), series in published.groupby(["feature_map", "update_rule",
                                                             "d_key"]):
            if _matches(name, rule, d_key, config):
                frames.append(series.assign(label=config.label, source=name))
    if not frames:
        return pd.DataFrame(columns=list(POINT_COLUMNS))
    return pd.concat(frames)[list(POINT_COLUMNS)].sort_values(["label", "n_keys"],
                                                              ignore_index=True)


def capacity_columns(capacity: pd.DataFrame, published_points: pd.DataFrame,
                     failure) -> pd.DataFrame:
    """``capacity`` with PUBLISHED_COLUMNS appended: ``failure(label, n_keys, losses)`` (the
    analysis' loss view, returning its SeedResult) over each configuration's published series;
    NaN and empty where the configuration is not one of the authors'."""
    results = {label: failure(label, series["n_keys"].to_numpy(),
                              series["final_eval_loss"].to_numpy())
               for label, series in published_points.groupby("label")}
    capacity = capacity.copy()
    capacity["published_capacity"] = [results[label].value if label in results else math.nan
                                      for label in capacity["label"]]
    capacity["published_outcome"] = [results[label].outcome if label in results else None
                                     for label in capacity["label"]]
    for column in ("last_pass", "first_failure"):  # the bracket of a published failure point
        capacity[f"published_{column}"] = [getattr(results[label], column) if label in results
                                           else math.nan for label in capacity["label"]]
    return capacity


PREDICTION = 0.99  # the level of the prediction interval for one new seed that does not stall
LEVEL_WORDS = f"{PREDICTION:.0%} for a seed that does not stall"  # what that level covers


def _log_fit(lo: np.ndarray, hi: np.ndarray) -> tuple[float, float]:
    """(mean, sd) of ln n* over seeds whose ln n* lies in [lo, hi] (equal: a point): the sample
    mean and sd (n - 1) when every seed is a point, else the censored normal's maximum-likelihood
    mean and sd (``censored.loglik``), the sd times sqrt(n / (n - 1)) as the sample sd is."""
    n, point = len(lo), lo == hi
    if point.all():
        return float(lo.mean()), float(lo.std(ddof=1))

    def nll(theta):
        value, g_mu, g_s = censored.loglik(np.full(n, theta[0]), float(theta[1]), lo, hi)
        return -value, -np.array([g_mu.sum(), g_s])

    start = [float(lo[point].mean()), math.log(max(float(lo[point].std(ddof=1)), 1e-3))]
    found = optimize.minimize(nll, np.asarray(start), jac=True, method="BFGS",
                              options={"gtol": 1e-8})
    return float(found.x[0]), math.exp(float(found.x[1])) * math.sqrt(n / (n - 1))


def prediction_interval(lo, hi=None, level: float = PREDICTION) -> tuple[float, float]:
    """The ``level`` prediction interval for one more seed from n >= 2 seeds' failure points,
    each the interval [lo, hi] its outcome allows (``censored.seed_intervals``; ``hi`` None:
    every seed a point), on the log scale where seeds spread in proportion:
    exp(m +- t_(n-1) s sqrt(1 + 1/n)), m and s the mean and sd of ln n* (``_log_fit``). Its
    level holds for a new seed drawn as the seeds are, log-normal; a seed that stalls (a few
    keys never learned: its failure point far below the others') lies outside it."""
    lo = np.asarray(lo, float)
    hi = lo if hi is None else np.asarray(hi, float)
    with np.errstate(divide="ignore"):
        mean, sd = _log_fit(np.log(lo), np.log(hi))
    n = len(lo)
    half = float(stats.t.ppf(0.5 + level / 2, n - 1) * sd * math.sqrt(1 + 1 / n))
    return float(np.exp(mean - half)), float(np.exp(mean + half))


@dataclass(frozen=True)
class Comparison:
    """The authors' one run against this configuration's seeds (``compare``): the word, the
    run's rank among the seeds (NaN where none), how many seeds, the prediction interval (NaN
    where none) and the verdict as the report prints it."""

    word: str
    rank: float
    n: int
    low: float
    high: float
    words: str


def compare(published_value: float, published_outcome, seeds: pd.DataFrame,
            bracket: tuple[float, float] = (math.nan, math.nan)) -> Comparison | None:
    """Where the authors' one run lies against this configuration's seeds, in the loss view.

    The published point is one run (seed 1): it is set against the interval that holds one new
    seed of this configuration (``prediction_interval``, PREDICTION for a seed that does not
    stall), not the median's, and its rank among the seeds is given ("ranks 2 of 6": one run
    and 5 seeds, 1 the lowest; a tie, or a bound on its side of the published value, counts
    half). The two designs differ: this suite's search brackets each seed's failure point
    between probes set near d_dot, the authors' grid steps by 20 keys, so their point is known
    only to its ``bracket`` [last pass, first fail]. Words: "consistent" when that bracket (the
    point itself without one) meets the prediction interval, "differs" when it lies outside;
    seeds whose value is a bound enter as the intervals they allow, while more than half the
    seeds and at least two are points; with fewer, or a published bound, "same bound" when the
    seeds all end in the published bound and "other outcome" otherwise; "one seed" with fewer
    than two; "cannot tell" where the seeds fail at one value (no spread: no interval to
    predict a new seed from). None without a published point."""
    if published_outcome is None or (isinstance(published_outcome, float)
                                     and math.isnan(published_outcome)):
        return None
    seeds = seeds[seeds["outcome"] != "no_data"]
    if len(seeds) < 2:
        return Comparison("one seed", math.nan, len(seeds), math.nan, math.nan, "one seed")
    points = int(seeds["outcome"].eq("fails_at").sum())
    if published_outcome != "fails_at" or points < 2 or 2 * points <= len(seeds) \
            or not seeds["outcome"].isin(("fails_at", censored.LOWER, censored.UPPER)).all():
        same = set(seeds["outcome"]) == {published_outcome} and \
            bool((seeds["value"] == published_value).all())
        word = "same bound" if same else "other outcome"
        return Comparison(word, math.nan, len(seeds), math.nan, math.nan, word)
    lo, hi = censored.seed_intervals(seeds["outcome"], seeds["value"])
    below = (hi < published_value).sum()
    tied = ((lo == hi) & (lo == published_value)).sum() + \
        ((lo != hi) & (lo <= published_value) & (hi >= published_value)).sum()
    rank = float(1 + below + 0.5 * tied)
    if (lo == hi).all() and np.ptp(lo) == 0:  # no spread: a zero-width interval says nothing
        return Comparison("cannot tell", rank, len(lo), math.nan, math.nan,
                          f"cannot tell (ranks {rank:g} of {len(lo) + 1}; its {len(lo)} seeds "
                          f"fail at one value, {lo[0]:.3g}: no spread to predict a new seed "
                          "from)")
    low, high = prediction_interval(lo, hi)
    first, last = (published_value, published_value) if any(map(math.isnan, bracket)) \
        else bracket
    word = "consistent" if first <= high and last >= low else "differs"
    return Comparison(word, rank, len(lo), low, high,
                      f"{word} (ranks {rank:g} of {len(lo) + 1}; one new seed: {low:.3g} to "
                      f"{high:.3g}, {LEVEL_WORDS})")


def verdict(published_value: float, published_outcome, seeds: pd.DataFrame,
            bracket: tuple[float, float] = (math.nan, math.nan)) -> str | None:
    """``compare``'s verdict as the report prints it (None without a published point)."""
    found = compare(published_value, published_outcome, seeds, bracket)
    return None if found is None else found.words


def verdict_column(capacity: pd.DataFrame, seeds: pd.DataFrame) -> pd.DataFrame:
    """``capacity`` with ``published_verdict`` (``verdict``) for the authors' configurations."""
    capacity = capacity.copy()
    capacity["published_verdict"] = [
        verdict(r.published_capacity, r.published_outcome, seeds[seeds["label"] == r.label],
                (r.published_last_pass, r.published_first_failure))
        for r in capacity.itertuples()]
    return capacity


def reference_columns(capacity: pd.DataFrame, reference: Path | None) -> pd.DataFrame:
    """``capacity`` with REFERENCE_COLUMNS: the failure point and outcome of the same
    configuration (label) in ``reference`` (a committed ``capacity.csv`` of this experiment,
    e.g. ``results/reference/quick/capacity.csv``); empty where it has none or there is no
    reference (the experiment analysed is the reference itself)."""
    capacity = capacity.copy()
    try:
        ref = pd.read_csv(io.StringIO(read_text(reference))).set_index("label") \
            if reference is not None else None  # a FIFO or a device is never waited on
        if ref is not None:
            ref = ref[["observed_capacity", "outcome"]]
    except (OSError, ValueError, KeyError, pd.errors.ParserError, StoreError):
        ref = None
    found = [ref is not None and label in ref.index for label in capacity["label"]]
    capacity["reference_capacity"] = [ref.loc[lab, "observed_capacity"] if ok else math.nan
                                      for lab, ok in zip(capacity["label"], found)]
    capacity["reference_outcome"] = [ref.loc[lab, "outcome"] if ok else None
                                     for lab, ok in zip(capacity["label"], found)]
    return capacity
