"""What a configuration's failure points need read beside them, as short flags (the capacity
table's last column), each a fact the store measured. The flags and when each is raised are
stated once, in docs/analysis.md ("Flags").
"""

from __future__ import annotations

import pandas as pd

from kernelzoo.analysis.labels import cell
from kernelzoo.analysis.rankings import diluted

# dynamics.py's run counts and their flags
DYNAMICS = {"learned_then_lost": "learned then lost", "never_learned": "never learned",
            "blew_up": "denominator near zero"}


def flags(capacity: pd.DataFrame, seeds: pd.DataFrame, runs: pd.DataFrame) -> pd.Series:
    """One string per row of ``capacity`` (its flags joined by "; ", "" for none)."""
    mixed = seeds.groupby("label")["outcome"].nunique() > 1
    capped = runs[runs["status"] == "max_steps"].groupby("label").size()
    weak = diluted(capacity)
    found = []
    for i, r in enumerate(capacity.itertuples()):
        words = []
        stalled = int(getattr(r, "stalled_runs", 0) or 0)
        if stalled:
            words.append(f"stalls {stalled} ({int(r.stalls_cleared)} cleared)")
        if getattr(r, "stalls_cleared", 0):
            words.append(f"verified {cell(r.observed_capacity_verified)}")
        if (r.outcome == "fails_at" and pd.notna(r.rank_bound)
                and r.observed_capacity >= r.rank_bound):
            words.append("at rank bound")
        if bool(weak.iloc[i]):
            words.append("diluted")
        if bool(mixed.get(r.label, False)):
            words.append("seeds disagree")
        if r.label in capped.index:
            words.append(f"step cap {int(capped[r.label])}")
        for column, word in DYNAMICS.items():  # runs counted by ``dynamics.add_columns``
            if int(getattr(r, column, 0) or 0):
                words.append(f"{word} {int(getattr(r, column))}")
        found.append("; ".join(words))
    return pd.Series(found, index=capacity.index, dtype=object)
