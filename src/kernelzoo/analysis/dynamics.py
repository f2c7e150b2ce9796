"""What each run's curve shows about how it reached its end: learned then lost, never learned,
and a training loss that blew up (the read-out's denominator near zero). Per run from its
curve.csv, counted per configuration as flags (``tiers.py``). Pure: the caller reads the curves.

Its rule is stated once, in docs/analysis.md ("Diagnoses from curves").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from kernelzoo.core import rules

LEARNED = 0.99   # eval accuracy that counts as learned
CHANCE = 2.0     # never learned: accuracy never above CHANCE / n_keys
BLOW_UP = 10.0   # a training loss above this: the denominator came near zero
COLUMNS = ("learned_then_lost", "never_learned", "blew_up", "peak_train_loss")


@dataclass(frozen=True)
class RunDynamics:
    """One run's diagnoses from its curve."""

    learned_then_lost: bool
    never_learned: bool
    blew_up: bool
    peak_accuracy: float
    peak_train_loss: float


def diagnose(curve: pd.DataFrame, n_keys: int, final_accuracy: float,
             denominator: bool = True) -> RunDynamics:
    """The module docstring's diagnoses of one run (``curve``: curve.csv's columns); a training
    loss above BLOW_UP is the denominator's doing only where the memory has one
    (``denominator``: ``UpdateRule.has_denominator``)."""
    accuracy = curve["eval_accuracy"].to_numpy(float)
    loss = curve["train_loss"].to_numpy(float)
    peak = float(np.nanmax(accuracy)) if np.isfinite(accuracy).any() else math.nan
    top = float(np.nanmax(np.where(np.isfinite(loss), loss, np.nan))) \
        if np.isfinite(loss).any() else math.nan
    final = final_accuracy if np.isfinite(final_accuracy) else 0.0
    return RunDynamics(bool(peak >= LEARNED and final < LEARNED),
                       bool(not peak > CHANCE / n_keys), bool(denominator and top > BLOW_UP),
                       peak, top)


def run_table(runs: pd.DataFrame, read) -> pd.DataFrame:
    """One row per run of ``runs`` with a curve (``read(run)``: its curve.csv as a DataFrame,
    None without one): label, seed, n_keys and its RunDynamics."""
    rows = []
    for run in runs.itertuples():
        curve = read(run)
        if curve is None or curve.empty:
            continue
        found = diagnose(curve, int(run.n_keys), float(run.final_eval_accuracy),
                         rules.get(str(run.update_rule)).has_denominator(str(run.normalisation)))
        rows.append({"label": run.label, "seed": run.seed, "n_keys": run.n_keys, **vars(found)})
    return pd.DataFrame(rows, columns=["label", "seed", "n_keys", *RunDynamics.__annotations__])


def add_columns(capacity: pd.DataFrame, found: pd.DataFrame) -> pd.DataFrame:
    """``capacity`` with COLUMNS per configuration from ``run_table``'s rows (0 and NaN where
    none of its runs has a curve)."""
    capacity = capacity.copy()
    by = found.groupby("label") if len(found) else None
    for column in COLUMNS[:3]:
        counts = by[column].sum() if by is not None else pd.Series(dtype=int)
        capacity[column] = capacity["label"].map(counts).fillna(0).astype(int)
    peaks = by["peak_train_loss"].max() if by is not None else pd.Series(dtype=float)
    capacity["peak_train_loss"] = capacity["label"].map(peaks).astype(float)
    return capacity
