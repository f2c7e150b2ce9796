"""Is a failure point a capacity limit or an optimisation limit? (experiment ``lr_robustness``)

For every configuration run at several learning rates (the analysis' configurations differ in
``lr``, read from each run's config.yaml), the failure point at the published lr (1e-3) is set
beside the best over the learning rates tried (the largest observed failure point). Capacity
*moves with the learning rate* when the best's interval lies wholly above the published lr's
(its ci_low above that one's ci_high); otherwise the failure points agree within their
intervals and the limit is the state's, not the optimiser's at lr 1e-3.
"""

from __future__ import annotations

import pandas as pd

from kernelzoo.analysis.capacity import CONFIG_KEYS
from kernelzoo.analysis.published import PUBLISHED_LR


def table(capacity: pd.DataFrame) -> pd.DataFrame:
    """One row per configuration (less its lr) with fails_at at >= 2 learning rates, the
    published lr among them: label, the published lr's and the best lr's failure point and
    interval, and ``moves``."""
    fails = capacity[capacity["outcome"] == "fails_at"]
    rows = []
    for _, group in fails.groupby([k for k in CONFIG_KEYS if k != "lr"], dropna=False):
        at = group[group["lr"] == PUBLISHED_LR]
        if group["lr"].nunique() < 2 or at.empty:
            continue
        base, best = at.iloc[0], group.loc[group["observed_capacity"].idxmax()]
        rows.append({"label": base["label"].replace(f" lr={PUBLISHED_LR}", ""),
                     "published_lr": base["observed_capacity"],
                     "published_low": base["ci_low"], "published_high": base["ci_high"],
                     "best_lr": best["lr"], "best": best["observed_capacity"],
                     "best_low": best["ci_low"], "best_high": best["ci_high"],
                     "lrs": ", ".join(sorted(group["lr"], key=float)),
                     "moves": bool(best["ci_low"] > base["ci_high"])})
    return pd.DataFrame(rows)


def section(capacity: pd.DataFrame) -> list[str]:
    """The report's "Learning rate" section; [] without configurations run at several lr."""
    if "lr" not in capacity:
        return []
    found = table(capacity)
    if found.empty:
        return []
    lines = ["## Learning rate", "", __doc__.split("\n\n", 1)[1].replace("\n", " ").strip(), "",
             "| configuration | learning rates | failure point at lr 1e-3 | best over lr | "
             "moves with lr |", "|---|---|---|---|---|"]
    for r in found.itertuples():
        lines.append(f"| {r.label} | {r.lrs} | {r.published_lr:.3g} [{r.published_low:.3g}, "
                     f"{r.published_high:.3g}] | {r.best:.3g} [{r.best_low:.3g}, "
                     f"{r.best_high:.3g}] at lr {r.best_lr} | {'yes' if r.moves else 'no'} |")
    moved = found[found["moves"]]
    lines += ["", f"Capacity moves with the learning rate in {len(moved)} of {len(found)} "
              "configurations" + (f": {', '.join(moved['label'])}." if len(moved) else "."), ""]
    return lines
