"""Predicting each configuration's failure point, per view of capacity, and scoring the
predictions on configurations they were not fitted on.

Predictors (capacity.csv columns, per configuration the mean over its seeds' runs at the n_keys
nearest d_dot, within NEAR of it; diagnostics of ``core/diagnostics.py``), of two kinds:
- before training, from the untrained map and the task alone:
  - ``d_dot``: the map's own declaration;
  - ``untrained_rank``, ``untrained_effective_rank`` (columns ``rank_at_d_dot_initial``,
    ``effective_rank_at_d_dot_initial``): the numerical and effective rank of the untrained
    map's features of the written keys at n_keys = d_dot (at most d_dot), measured before the
    first step. They depend on the map, the seed and the task only: ``training/untrained.py``
    computes them from a config with no training step and reproduces the runs' numbers;
- early diagnostic, from a trained run (the n_keys = d_dot probe, round 1 of every search):
  - ``probe_rank``, ``probe_effective_rank`` (columns ``rank_at_d_dot``,
    ``effective_rank_at_d_dot``): the same ranks of the model trained at that probe;
  - ``probe_x_untrained_rank``: sqrt(probe_rank x untrained_rank).
Each predictor p is scored as it is and calibrated, ``c·p``: c = exp(median of ln(observed /
p)) over the fitted configurations, the one constant that minimises the score there. c·d_dot is
the baseline: a predictor whose margin over d_dot is only a constant does not beat it.

Score of a predictor in a view: mean |ln(observed / predicted)| over the configurations that
fail at a point in that view (fails_at, or a keys-retrieved plateau) and have every predictor,
the same set for all predictors; lower is better. A configuration whose value is a bound
(never_fails, fails_everywhere) is censored, not a number: it is neither fitted nor scored, only
counted.
- ``held_out``: the constants fitted on FIT (the zoo at d_dot 64 and dot_scaling), the scores
  on SCORE (the zoo at d_dot 128): another experiment and another size (a size: the d_dot
  levels ``labels.size_groups`` puts together, so the zoo's 64 holds the 65 and 66 of the maps
  that cannot reach 64 exactly).
- ``score`` (a store's report): each constant from the configurations of the other feature
  maps (leave one map out), so no configuration is predicted by a constant that saw its map.

    python -m kernelzoo.analysis.prediction results/reference/{zoo,dot_scaling}/capacity.csv
"""

from __future__ import annotations

import argparse
import io
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from kernelzoo.analysis.capacity import BOUNDS, POINTS, SUFFIX, VIEW_WORDS, VIEWS, value_column
from kernelzoo.analysis.labels import size_groups
from kernelzoo.records.files import StoreError, read_text

MEASURED = {"rank_at_d_dot": "phi_rank", "effective_rank_at_d_dot": "phi_effective_rank",
            "rank_at_d_dot_initial": "phi_rank_initial",
            "effective_rank_at_d_dot_initial": "phi_effective_rank_initial"}
COLUMNS = tuple(MEASURED)
NEAR = 0.25  # the probe used lies within this share of d_dot
# predictor -> the capacity.csv column it is (``probe_x_untrained_rank`` is computed)
SOURCE = {"d_dot": "predicted_capacity", "untrained_rank": "rank_at_d_dot_initial",
          "untrained_effective_rank": "effective_rank_at_d_dot_initial",
          "probe_rank": "rank_at_d_dot", "probe_effective_rank": "effective_rank_at_d_dot"}
BEFORE_TRAINING = ("d_dot", "untrained_rank", "untrained_effective_rank")
EARLY_DIAGNOSTIC = ("probe_rank", "probe_effective_rank", "probe_x_untrained_rank")
BASES = (*BEFORE_TRAINING, *EARLY_DIAGNOSTIC)
PREDICTORS = tuple(p for base in BASES for p in (base, f"c·{base}"))
KINDS = {"before training": BEFORE_TRAINING, "early diagnostic": EARLY_DIAGNOSTIC}
FIT = {"zoo": 64, "dot_scaling": None}  # store -> size (None: every size)
SCORE = {"zoo": 128}


def kind(predictor: str) -> str:
    """"before training" or "early diagnostic" (a calibrated predictor: its base's)."""
    base = predictor.removeprefix("c·")
    return next(k for k, bases in KINDS.items() if base in bases)


def at_d_dot(runs: pd.DataFrame) -> pd.DataFrame:
    """label -> COLUMNS: the mean over seeds of each diagnostic at the run nearest n_keys =
    d_dot (within NEAR); NaN where a configuration has no such run or no diagnostics."""
    rows = {}
    for label, group in runs[runs["d_dot"].notna()].groupby("label"):
        d = float(group["d_dot"].iloc[0])
        gap = (group["n_keys"] - d).abs()
        near = group[(gap == gap.min()) & (gap <= NEAR * d) & (group["status"] != "infeasible")]
        rows[label] = {col: float(pd.to_numeric(near[src], errors="coerce").mean())
                       if src in near and len(near) else math.nan
                       for col, src in MEASURED.items()}
    return pd.DataFrame.from_dict(rows, orient="index", columns=list(COLUMNS))


def add_columns(capacity: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """``capacity`` with COLUMNS inserted before ``label``."""
    capacity = capacity.copy()
    found = at_d_dot(runs)
    at = capacity.columns.get_loc("label")
    for i, col in enumerate(COLUMNS):
        capacity.insert(at + i, col, capacity["label"].map(found[col]).astype(float))
    return capacity


def bases(rows: pd.DataFrame) -> pd.DataFrame:
    """Each base predictor (BASES) of each row, before calibration."""
    out = pd.DataFrame({p: pd.to_numeric(rows[col], errors="coerce").astype(float)
                        if col in rows else math.nan for p, col in SOURCE.items()},
                       index=rows.index)
    out["probe_x_untrained_rank"] = np.sqrt(out["probe_rank"] * out["untrained_rank"])
    return out[list(BASES)]


def eligible(capacity: pd.DataFrame, view: str) -> pd.Series:
    """The rows a view fits and scores: a point in that view (``capacity.POINTS``), every base
    predictor positive."""
    if capacity.empty or any(c not in capacity for c in COLUMNS):
        return pd.Series(False, index=capacity.index)
    ok = capacity[f"outcome{SUFFIX[view]}"].isin(POINTS)
    ok &= pd.to_numeric(capacity[value_column(view)], errors="coerce").astype(float) > 0
    values = bases(capacity)
    return ok & (np.isfinite(values) & (values > 0)).all(axis=1)


def scored(capacity: pd.DataFrame, view: str) -> pd.DataFrame:
    """The rows of ``capacity`` a view is scored on (``eligible``)."""
    return capacity[eligible(capacity, view)]


def bounded(capacity: pd.DataFrame, view: str) -> int:
    """How many configurations with a d_dot have a bound in ``view``: left out as censored."""
    if capacity.empty:
        return 0
    return int((capacity[f"outcome{SUFFIX[view]}"].isin(BOUNDS)
                & capacity["predicted_capacity"].notna()).sum())


def constant(observed: pd.Series, predicted: pd.Series) -> float:
    """c = exp(median of ln(observed / predicted)): minimises mean |ln(observed / (c predicted))|."""
    return float(np.exp(np.median(np.log(observed.astype(float) / predicted.astype(float)))))


def error(observed: pd.Series, predicted: pd.Series) -> float:
    """Mean |ln(observed / predicted)|."""
    return float(np.abs(np.log(observed.astype(float) / predicted.astype(float))).mean())


@dataclass(frozen=True)
class Scores:
    """Per view: the configurations scored and each predictor's mean |ln(observed/predicted)|."""

    n: dict
    by: dict  # view -> predictor -> score

    def words(self, view: str) -> str:
        scores = self.by.get(view, {})
        if not self.n.get(view):
            return f"{VIEW_WORDS[view]} view: no configuration fails at a point with every predictor"
        best = min(scores, key=scores.get)
        return (f"{VIEW_WORDS[view]} view, {self.n[view]} configurations: "
                + ", ".join(f"{p} {s:.3f}" for p, s in scores.items())
                + f"; best: {best}")


def one_map_out(rows: pd.DataFrame, observed: pd.Series) -> pd.DataFrame:
    """The calibrated predictors (``c·`` each base) of each row, each constant fitted on the
    rows of the other feature maps (NaN where no other map has a row)."""
    raw = bases(rows)
    out = pd.DataFrame(math.nan, index=rows.index, columns=[f"c·{b}" for b in BASES])
    for fmap in rows["feature_map"].unique():
        test = (rows["feature_map"] == fmap).to_numpy()
        if (~test).any():
            for b in BASES:
                out.loc[test, f"c·{b}"] = raw[b][test] * constant(observed[~test], raw[b][~test])
    return out


def score(capacity: pd.DataFrame) -> Scores:
    """Each predictor's score in each view within one store, constants leave one map out."""
    n, by = {}, {}
    for view in VIEWS:
        rows = scored(capacity, view)
        observed = rows[value_column(view)].astype(float)
        preds = pd.concat([bases(rows), one_map_out(rows, observed)], axis=1)[list(PREDICTORS)] \
            if len(rows) else pd.DataFrame()
        keep = np.isfinite(preds).all(axis=1) if len(rows) else pd.Series(dtype=bool)
        n[view] = int(keep.sum())
        by[view] = {p: error(observed[keep], preds[p][keep]) for p in PREDICTORS} \
            if n[view] else {}
    return Scores(n, by)


def selected(table: pd.DataFrame, sizes: dict) -> pd.Series:
    """The rows of ``table`` (its ``store`` column) in ``sizes`` (store -> size, None: all); a
    size is a group of the store's d_dot levels (``labels.size_groups``: 64 holds 65 and 66)."""
    keep = pd.Series(False, index=table.index)
    d_dot = pd.to_numeric(table["predicted_capacity"], errors="coerce").astype(float)
    for store, size in sizes.items():
        mine = (table["store"] == store) & d_dot.notna()
        if size is not None:
            levels = size_groups(d_dot[mine].unique()).get(size, [])
            mine &= d_dot.isin(levels)
        keep |= mine
    return keep


@dataclass(frozen=True)
class HeldOut:
    """One view's held-out predictions: the scored configurations' failure points
    (``observed``, indexed by label) and each predictor's prediction of them (``predicted``, a
    column per predictor), the constants (calibrated predictors), how many configurations they
    were fitted on, and how many of the scored selection's were left out as bounds."""

    observed: pd.Series
    predicted: pd.DataFrame
    constants: dict
    fitted_on: int
    bounds: int

    def errors(self) -> pd.DataFrame:
        """|ln(observed / predicted)| per configuration and predictor."""
        return np.abs(np.log(self.predicted.rdiv(self.observed, axis=0)))


def predict(table: pd.DataFrame, view: str, fit: dict = FIT, test: dict = SCORE) -> HeldOut:
    """The predictions in ``view`` of the ``test`` configurations, constants fitted on the
    ``fit`` ones (``table``: the stores' capacity.csv rows with a ``store`` column)."""
    ok = eligible(table, view)
    train, scoring = table[ok & selected(table, fit)], table[ok & selected(table, test)]
    observed = train[value_column(view)].astype(float)
    fitted, raw = bases(train), bases(scoring).set_axis(scoring["label"], axis=0)
    constants = {p: constant(observed, fitted[p.removeprefix("c·")]) if len(train) else math.nan
                 for p in PREDICTORS if p.startswith("c·")}
    predicted = pd.DataFrame({p: raw[p.removeprefix("c·")] * constants.get(p, 1.0)
                              for p in PREDICTORS}, index=raw.index)
    return HeldOut(scoring[value_column(view)].astype(float).set_axis(scoring["label"]),
                   predicted, constants, len(train), bounded(table[selected(table, test)], view))


def held_out(table: pd.DataFrame, fit: dict = FIT, test: dict = SCORE) -> pd.DataFrame:
    """One row per view and predictor: its kind, constant (calibrated ones), score (``predict``)
    and the counts: configurations scored, fitted on, and left out of the scored selection as
    bounds."""
    rows = []
    for view in VIEWS:
        found = predict(table, view, fit, test)
        errors = found.errors()
        for p in PREDICTORS:
            rows.append({"view": view, "predictor": p, "kind": kind(p),
                         "constant": found.constants.get(p, math.nan),
                         "score": float(errors[p].mean()) if len(errors) else math.nan,
                         "configurations": len(errors), "fitted_on": found.fitted_on,
                         "bounds_left_out": found.bounds})
    return pd.DataFrame(rows)


def compared(frame: pd.DataFrame, view: str, baseline: str) -> tuple[list[str], list[str]]:
    """(the predictors whose held-out score in ``view`` is below ``baseline``'s, those above)."""
    rows = frame[frame["view"] == view].set_index("predictor")["score"]
    return ([p for p, s in rows.items() if s < rows[baseline]],
            [p for p, s in rows.items() if s > rows[baseline]])


def d_dot_wins(found: HeldOut) -> tuple[list[str], list[str]]:
    """The configurations where raw d_dot is closer than c·d_dot, and those where no predictor
    is closer than raw d_dot (ties count for d_dot)."""
    errors = found.errors()
    closer = errors.index[errors["d_dot"] < errors["c·d_dot"]]
    best = errors.index[errors["d_dot"] <= errors.min(axis=1)]
    return list(closer), list(best)


def read_stores(paths) -> tuple[pd.DataFrame, list[str]]:
    """The capacity.csv rows of several stores together, with a ``store`` column (the file's
    directory), and one line per file that could not be used (unreadable, analysed before the
    predictor columns)."""
    tables, lines = [], []
    for path in map(Path, paths):
        try:
            table = pd.read_csv(io.StringIO(read_text(Path(path))))
        except (OSError, ValueError, StoreError) as err:
            lines.append(f"{path}: unreadable ({type(err).__name__}: {err})")
            continue
        if any(c not in table for c in (*COLUMNS, "observed_capacity_keys")):
            lines.append(f"{path}: no predictor columns (analysed before them: rerun the "
                         "analysis)")
            continue
        tables.append(table.assign(store=path.parent.name))
    return (pd.concat(tables, ignore_index=True) if tables else pd.DataFrame()), lines


def main(argv=None) -> None:
    """Print the held-out scores, one line per view and predictor."""
    parser = argparse.ArgumentParser(prog="python -m kernelzoo.analysis.prediction",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("capacity_csv", nargs="+", help="capacity.csv files of analysed stores")
    table, lines = read_stores(parser.parse_args(argv).capacity_csv)
    if lines:
        print("\n".join(lines))
    if table.empty:
        raise SystemExit("error: no store with predictor columns; valid: capacity.csv files "
                         "of stores analysed with them")
    frame = held_out(table)
    for r in frame.itertuples():
        print(f"{VIEW_WORDS[r.view]}: {r.predictor} ({r.kind}) {r.score:.3f} on "
              f"{r.configurations} configurations (fitted on {r.fitted_on}, "
              f"{r.bounds_left_out} bounds left out)"
              + (f", c = {r.constant:.3f}" if math.isfinite(r.constant) else ""))


if __name__ == "__main__":
    main()
