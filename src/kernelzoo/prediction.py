"""The refined prediction: does the effective rank of the written keys' features, reached at the
failure point, predict a configuration's failure point better than its d_dot?

``effective_rank_at_failure`` (capacity.csv): for every seed whose loss criterion outcome is
fails_at, the diagnostics' ``phi_effective_rank`` of its runs at the last pass n_a and at the
first failure n_b, interpolated linearly in n at its failure point n* (the one that exists when
the other run has none: softmax, a diverged run, a store older than the diagnostics); the mean
over those seeds. ``rank_ratio`` = observed_capacity / effective_rank_at_failure.

``compare`` (report.md): over the fails_at configurations with a bounded d_dot and an effective
rank, the mean absolute log-ratio |ln(observed / d_dot)| against |ln(observed / effective rank)|;
the smaller is the better predictor. The effective rank is measured on the n_keys written keys
of the trained model, so it can exceed neither n_keys nor d_dot: at the failure point it is at
most about the failure point itself, and a small |ln| says the features are still spread evenly
there, not that the rank was known before training. ``pooled`` pools the configurations of
several capacity.csv files:

    python -m kernelzoo.prediction results/reference/*/capacity.csv
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

COLUMNS = ("effective_rank_at_failure", "rank_ratio")


@dataclass(frozen=True)
class Comparison:
    """Mean |ln(observed / predictor)| over ``n`` configurations, for d_dot and effective rank."""

    n: int
    by_d_dot: float
    by_rank: float

    def words(self) -> str:
        if self.n == 0:
            return "no configuration fails at a point with a bounded d_dot and an effective rank"
        better = ("the effective rank" if self.by_rank < self.by_d_dot else
                  "d_dot" if self.by_d_dot < self.by_rank else "neither")
        return (f"over {self.n} configuration{'' if self.n == 1 else 's'} failing at a point: "
                f"mean |ln(observed / d_dot)| = {self.by_d_dot:.3f} (a factor of "
                f"{math.exp(self.by_d_dot):.2f}), mean |ln(observed / effective rank)| = "
                f"{self.by_rank:.3f} (a factor of {math.exp(self.by_rank):.2f}): {better} "
                "predicts the failure point better")


def _at_failure(n_a, e_a, n_b, e_b, n_star) -> float:
    """e interpolated linearly in n at n_star; the finite one when only one is."""
    if math.isfinite(e_a) and math.isfinite(e_b):
        return e_a if n_b == n_a else e_a + (n_star - n_a) / (n_b - n_a) * (e_b - e_a)
    return e_a if math.isfinite(e_a) else e_b


def effective_rank_at_failure(runs: pd.DataFrame, seeds: pd.DataFrame) -> dict[str, float]:
    """label -> mean over its fails_at seeds of the effective rank at n* (module docstring);
    NaN where no such seed has one (no column: a store older than the diagnostics)."""
    if "phi_effective_rank" not in runs:
        return {}
    rank = pd.to_numeric(runs.set_index(["label", "seed", "n_keys"])["phi_effective_rank"],
                         errors="coerce")  # a damaged value reads as none
    found = {}
    for label, group in seeds[seeds["outcome"] == "fails_at"].groupby("label"):
        values = [_at_failure(s.last_pass, rank.get((label, s.seed, int(s.last_pass)), math.nan),
                              s.first_failure,
                              rank.get((label, s.seed, int(s.first_failure)), math.nan), s.value)
                  for s in group.itertuples()]
        values = [v for v in values if math.isfinite(v)]
        found[label] = float(np.mean(values)) if values else math.nan
    return found


def add_columns(capacity: pd.DataFrame, runs: pd.DataFrame, seeds: pd.DataFrame) -> pd.DataFrame:
    """``capacity`` with COLUMNS inserted before ``label``."""
    capacity = capacity.copy()
    ranks = capacity["label"].map(effective_rank_at_failure(runs, seeds)).astype(float)
    at = capacity.columns.get_loc("label")
    capacity.insert(at, "effective_rank_at_failure", ranks)
    capacity.insert(at + 1, "rank_ratio", capacity["observed_capacity"] / ranks)
    return capacity


def compared(capacity: pd.DataFrame) -> pd.DataFrame:
    """The configurations the comparison is over: fails_at, bounded d_dot, an effective rank."""
    if "effective_rank_at_failure" not in capacity:
        return capacity.iloc[:0]
    rank = capacity["effective_rank_at_failure"].astype(float)
    return capacity[(capacity["outcome"] == "fails_at") & capacity["predicted_capacity"].notna()
                    & np.isfinite(rank) & (rank > 0)]


def compare(capacity: pd.DataFrame) -> Comparison:
    """Mean |ln(observed / d_dot)| and |ln(observed / effective rank)| over ``compared``."""
    rows = compared(capacity)
    if rows.empty:
        return Comparison(0, math.nan, math.nan)
    observed = rows["observed_capacity"].astype(float)
    return Comparison(len(rows),
                      float(np.abs(np.log(observed / rows["predicted_capacity"].astype(float)))
                            .mean()),
                      float(np.abs(np.log(observed / rows["effective_rank_at_failure"]
                                          .astype(float))).mean()))


def pooled(paths) -> tuple[Comparison, list[str]]:
    """``compare`` over the configurations of several capacity.csv files together, and one line
    per file: its own comparison, or why it has none (unreadable, analysed before this column)."""
    tables, lines = [], []
    for path in map(Path, paths):
        try:
            table = pd.read_csv(path)
        except (OSError, ValueError) as err:
            lines.append(f"{path}: unreadable ({type(err).__name__}: {err})")
            continue
        if "effective_rank_at_failure" not in table:
            lines.append(f"{path}: no effective_rank_at_failure (analysed before it existed: "
                         "rerun the analysis)")
            continue
        tables.append(table)
        lines.append(f"{path}: {compare(table).words()}")
    return compare(pd.concat(tables) if tables else pd.DataFrame()), lines


def main(argv=None) -> None:
    """Print each capacity.csv's comparison, then the pooled one."""
    parser = argparse.ArgumentParser(prog="python -m kernelzoo.prediction",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("capacity_csv", nargs="+", help="capacity.csv files of analysed stores")
    comparison, lines = pooled(parser.parse_args(argv).capacity_csv)
    print("\n".join(lines))
    print(f"pooled: {comparison.words()}")


if __name__ == "__main__":
    main()
