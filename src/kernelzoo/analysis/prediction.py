"""A prediction made before the answer is known: each configuration's failure point predicted
from quantities measured at the n_keys = d_dot probe (round 1 of every search trains it), scored
per view of capacity on configurations it was not tuned on.

Predictors (capacity.csv columns, per configuration the mean over its seeds' runs at the n_keys
nearest d_dot, within 25% of it; diagnostics of ``diagnostics.py``):
- ``d_dot``: the map's own declaration;
- ``rank_at_d_dot``, ``effective_rank_at_d_dot``: the numerical and effective rank of the
  written keys' features of the trained model at that probe (at most d_dot: d_dot keys written);
- ``rank_at_d_dot_initial``, ``effective_rank_at_d_dot_initial``: the same at initialisation;
- ``fitted``: c sqrt(rank_at_d_dot x rank_at_d_dot_initial), the geometric mean of the numerical
  rank after training and at initialisation, with its one constant c = exp(median of
  ln(observed / that mean)) over the configurations of the other feature maps (leave one feature
  map out), so no configuration is predicted by a constant that saw its own map. Its form was
  chosen among a few (each rank alone, their minimum, power laws, a log-linear fit of d_dot and
  both ranks) on the committed stores, so its score there is optimistic by that choice; the
  constant never sees the map it predicts.
Score of a predictor in a view: mean |ln(observed / predicted)| over the configurations that
fail at a point in that view and have every predictor, the same set for all predictors; lower
is better. ``pooled`` scores the configurations of several capacity.csv files together:

    python -m kernelzoo.analysis.prediction results/reference/*/capacity.csv
"""

from __future__ import annotations

import argparse
import io
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from kernelzoo.analysis.capacity import SUFFIX, VIEW_WORDS, VIEWS, value_column
from kernelzoo.records.files import StoreError, read_text

MEASURED = {"rank_at_d_dot": "phi_rank", "effective_rank_at_d_dot": "phi_effective_rank",
            "rank_at_d_dot_initial": "phi_rank_initial",
            "effective_rank_at_d_dot_initial": "phi_effective_rank_initial"}
COLUMNS = tuple(MEASURED)
PREDICTORS = ("d_dot", *COLUMNS, "fitted")
NEAR = 0.25  # the probe used lies within this share of d_dot


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


def fitted(rows: pd.DataFrame, observed: pd.Series) -> pd.Series:
    """The ``fitted`` predictor of each row, its constant from the rows of the other feature
    maps (NaN where no other map has a row)."""
    base = np.log(rows["rank_at_d_dot"].astype(float) * rows["rank_at_d_dot_initial"]
                  .astype(float)) / 2
    gap = np.log(observed.astype(float)) - base
    out = pd.Series(math.nan, index=rows.index)
    for fmap in rows["feature_map"].unique():
        test = rows["feature_map"] == fmap
        if (~test).any():
            out[test] = np.exp(base[test] + float(np.median(gap[~test])))
    return out


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


def scored(capacity: pd.DataFrame, view: str) -> pd.DataFrame:
    """The rows a view is scored on: fails_at in that view, bounded d_dot, every predictor."""
    if any(c not in capacity for c in COLUMNS):
        return capacity.iloc[:0]
    s = SUFFIX[view]
    ok = (capacity[f"outcome{s}"] == "fails_at") & capacity["predicted_capacity"].notna()
    for col in COLUMNS:
        v = capacity[col].astype(float)
        ok &= np.isfinite(v) & (v > 0)
    ok &= capacity[value_column(view)].astype(float) > 0
    return capacity[ok]


def score(capacity: pd.DataFrame) -> Scores:
    """Each predictor's score in each view (module docstring)."""
    n, by = {}, {}
    for view in VIEWS:
        rows = scored(capacity, view)
        if rows.empty:
            n[view], by[view] = 0, {}
            continue
        observed = rows[value_column(view)].astype(float)
        preds = {"d_dot": rows["predicted_capacity"].astype(float),
                 **{c: rows[c].astype(float) for c in COLUMNS}, "fitted": fitted(rows, observed)}
        keep = np.isfinite(preds["fitted"])
        n[view] = int(keep.sum())
        by[view] = {p: float(np.abs(np.log(observed[keep] / v[keep])).mean())
                    for p, v in preds.items()} if keep.any() else {}
    return Scores(n, by)


def pooled(paths) -> tuple[Scores, list[str]]:
    """``score`` over the configurations of several capacity.csv files together, and one line
    per file that could not be used (unreadable, analysed before these columns)."""
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
    return score(pd.concat(tables, ignore_index=True) if tables else pd.DataFrame()), lines


def main(argv=None) -> None:
    """Print the pooled scores, per view."""
    parser = argparse.ArgumentParser(prog="python -m kernelzoo.analysis.prediction",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("capacity_csv", nargs="+", help="capacity.csv files of analysed stores")
    scores, lines = pooled(parser.parse_args(argv).capacity_csv)
    print("\n".join(lines + [f"pooled, {scores.words(v)}" for v in VIEWS]))


if __name__ == "__main__":
    main()
