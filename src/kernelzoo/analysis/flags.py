"""What a configuration's failure points need read beside them, as short flags (the capacity
table's last column), each a fact the store measured, and where two views of its capacity lie
apart (``apart``). The flags and when each is raised are stated once, in docs/analysis.md
("Flags").
"""

from __future__ import annotations

import math

import pandas as pd

from kernelzoo.analysis import tiers
from kernelzoo.analysis.capacity import POINTS, SUFFIX, VIEW_WORDS, VIEWS
from kernelzoo.analysis.labels import cell

# dynamics.py's run counts and their flags
DYNAMICS = {"learned_then_lost": "learned then lost", "never_learned": "never learned",
            "blew_up": "denominator near zero"}


def span(r, view: str) -> tuple[float, float] | None:
    """The failure points capacity row ``r`` allows in ``view``, in keys: its interval (one
    seed's bracket, or the order-statistic interval), from a lower bound up, up to an upper
    bound; None without a result."""
    s = SUFFIX[view]
    outcome, value = getattr(r, f"outcome{s}"), getattr(r, f"observed_capacity{s}")
    if outcome == "never_fails":
        return value, math.inf
    if outcome == "fails_everywhere":
        return 0.0, value
    if outcome not in POINTS or pd.isna(value):
        return None
    low, high = getattr(r, f"ci_low{s}"), getattr(r, f"ci_high{s}")
    return (value if pd.isna(low) else low), (value if pd.isna(high) else high)


TOUCH = 1e-6  # spans within this relative gap touch (a float32 accuracy x n_keys: 64.000002)


def apart(r) -> list[tuple[str, str]]:
    """The pairs of views (lower, higher) whose spans (``span``) do not overlap."""
    found = []
    for i, v in enumerate(VIEWS):
        for w in VIEWS[i + 1:]:
            a, b = span(r, v), span(r, w)
            if a is None or b is None:
                continue
            if a[1] * (1 + TOUCH) < b[0]:
                found.append((v, w))
            elif b[1] * (1 + TOUCH) < a[0]:
                found.append((w, v))
    return found


def apart_words(r, measured) -> str:
    """"views apart (loss < keys retrieved, accuracy < keys retrieved): partial retrieval": the
    pairs of views apart and what the store measured that bears on them (``measured``: the row
    of ``tiers.flags``): a diluted read-out where the loss view is below another, the loss
    passing wrong keys where it is above the accuracy view, and where keys retrieved is above
    the accuracy view (or the loss view, without a diluted read-out) partial retrieval, or its
    measured ratio where the flag is not raised ("partial retrieval x1.27 (flag: > 1.5)"); "no
    measured cause" where none does; "" when no two views are apart."""
    pairs = apart(r)
    if not pairs:
        return ""
    has = (lambda flag: measured is not None and bool(measured[flag]))
    why = []
    diluted = has("diluted") and (("loss", "accuracy") in pairs
                                  or ("loss", "keys_retrieved") in pairs)
    if diluted:
        why.append("diluted read-out")
    if ("accuracy", "loss") in pairs and has("lenient"):
        why.append("loss passes wrong keys")
    if measured is not None and (("accuracy", "keys_retrieved") in pairs
                                 or (("loss", "keys_retrieved") in pairs and not diluted)):
        over = float(measured["retrieved_over"])
        why.append("partial retrieval" if has("partial") else
                   f"partial retrieval x{over:.2f} (flag: > {tiers.PARTIAL:g})")
    return ("views apart (" + ", ".join(f"{VIEW_WORDS[a]} < {VIEW_WORDS[b]}" for a, b in pairs)
            + "): " + (", ".join(why) or "no measured cause"))


def flags(capacity: pd.DataFrame, seeds: pd.DataFrame, runs: pd.DataFrame, threshold: float,
          accuracy_threshold: float) -> pd.Series:
    """One string per row of ``capacity`` (its flags joined by "; ", "" for none)."""
    mixed = seeds.groupby("label")["outcome"].nunique() > 1
    capped = runs[runs["status"] == "max_steps"].groupby("label").size()
    diverged = runs[runs["status"] == "diverged"].groupby("label").size()
    measured = tiers.flags(capacity, runs, threshold, accuracy_threshold).set_index("label")
    found = []
    for r in capacity.itertuples():
        words = []
        stalled = int(getattr(r, "stalled_runs", 0) or 0)
        if stalled:
            words.append(f"stalls {stalled} ({int(r.stalls_cleared)} cleared)")
        if getattr(r, "stalls_cleared", 0):
            words.append(f"verified {cell(r.observed_capacity_verified)}")
        if (r.outcome == "fails_at" and pd.notna(r.rank_bound)
                and r.observed_capacity >= r.rank_bound):
            words.append("at rank bound")
        mine = measured.loc[r.label] if r.label in measured.index else None
        if apart(r):
            words.append(apart_words(r, mine))
        else:
            words += [word for flag, word in (("diluted", "diluted read-out"),
                                              ("partial", "partial retrieval"),
                                              ("lenient", "loss passes wrong keys"))
                      if mine is not None and bool(mine[flag])]
        if bool(mixed.get(r.label, False)):
            words.append("seeds disagree")
        if r.label in capped.index:
            words.append(f"step cap {int(capped[r.label])}")
        if r.label in diverged.index:
            words.append(f"diverged {int(diverged[r.label])}")
        for column, word in DYNAMICS.items():  # runs counted by ``dynamics.add_columns``
            if int(getattr(r, column, 0) or 0):
                words.append(f"{word} {int(getattr(r, column))}")
        found.append("; ".join(words))
    return pd.Series(found, index=capacity.index, dtype=object)
