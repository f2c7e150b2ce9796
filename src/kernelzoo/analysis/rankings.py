"""Maps ranked by capacity efficiency in each view: the report's efficiency table with the
views' rank correlations (``efficiency_table``, ``view_rhos``) and, at each size, why the views
disagree (``section``); ``between_sizes.py`` compares the sizes. Pure: it reads no file.

Its rule is stated once, in docs/analysis.md ("Rankings per view and why they disagree").
"""

from __future__ import annotations

import math

import pandas as pd
from scipy import stats

from kernelzoo.analysis.capacity import SUFFIX, VIEW_WORDS, VIEWS
from kernelzoo.analysis.efficiency import efficiency_order
from kernelzoo.analysis.labels import bound, cell, natural_key, size_groups

GAP = 2          # places between a configuration's best and worst rank that count as disagreement
DILUTED = 1.5    # the accuracy view's failure point over the loss view's that counts as diluted
PARTIAL = 1.25
COLLAPSE = 0.2   # relative fall of the effective rank at n_keys = d_dot
HEADLINE = "accuracy"  # the view that headlines cross-map rankings


def sizes(capacity: pd.DataFrame) -> dict[int, list[int]]:
    """Size (the smallest d_dot of its group, ``style.size_groups``) -> the d_dot levels it
    holds."""
    return size_groups(capacity["predicted_capacity"].dropna().unique())


def ranks(capacity: pd.DataFrame) -> pd.DataFrame:
    """One row per configuration with a bounded d_dot: its size and, per view, its rank within
    the size (NaN: no result in that view)."""
    frames = []
    for size, levels in sizes(capacity).items():
        mine = capacity[capacity["predicted_capacity"].isin(levels)]
        out = mine[["label"]].assign(size=size).set_index("label")
        for view in VIEWS:
            order = efficiency_order(mine, view)
            out[f"rank{SUFFIX[view]}"] = pd.Series(range(1, len(order) + 1),
                                                   index=order["label"].to_numpy())
        frames.append(out.reset_index())
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def swaps_apart(capacity: pd.DataFrame, label: str, size_rows: pd.DataFrame, a: str,
                b: str) -> list[str]:
    """The configurations that swap order with ``label`` between views ``a`` and ``b`` and
    whose efficiency interval is apart from ``label``'s in one of them (not overlapping)."""
    me = size_rows.set_index("label")
    ra, rb = me[f"rank{SUFFIX[a]}"], me[f"rank{SUFFIX[b]}"]
    mine = capacity[capacity["label"].isin(size_rows["label"])]
    intervals = {v: dict(zip(o["label"], zip(o["efficiency_low"], o["efficiency_high"])))
                 for v, o in ((v, efficiency_order(mine, v)) for v in (a, b))}
    apart = []
    for other in me.index.drop(label):
        if pd.isna(ra[other]) or pd.isna(rb[other]):
            continue
        if (ra[other] < ra[label]) == (rb[other] < rb[label]):
            continue
        close = True
        for view in (a, b):
            (lo, hi), (olo, ohi) = intervals[view][label], intervals[view][other]
            close &= not (olo > hi or ohi < lo or any(map(math.isnan, (lo, hi, olo, ohi))))
        if not close:
            apart.append(other)
    return apart


def diluted(r):
    """Whether capacity row ``r`` (or each row of a capacity table) has a diluted read-out: the
    loss view fails (fails_at) and the accuracy view's failure point is above ``DILUTED`` x the
    loss view's."""
    return (r["outcome"] == "fails_at") & (r["observed_capacity_acc"]
                                           > DILUTED * r["observed_capacity"])


def causes(r, best: str, worst: str) -> list[str]:
    """The causes of the module docstring that explain capacity row ``r`` ranking best in view
    ``best`` and worst in ``worst``."""
    found = []
    loss, acc, keys = r.observed_capacity, r.observed_capacity_acc, r.observed_capacity_keys
    if worst == "loss" and diluted(r):
        found.append(f"diluted read-out (accuracy {acc:.3g} against loss {loss:.3g})")
    if best == "keys_retrieved" and r.outcome_acc == "fails_at" and keys > PARTIAL * acc:
        found.append(f"partial retrieval ({keys:.3g} keys retrieved against accuracy {acc:.3g})")
    if getattr(r, f"outcome{SUFFIX[best]}") == "never_fails":
        found.append(f"a lower bound in {VIEW_WORDS[best]}")
    return found


def limits(r) -> list[str]:
    """What limits capacity row ``r`` in every view (module docstring)."""
    found = []
    before = getattr(r, "effective_rank_at_d_dot_initial", math.nan)
    after = getattr(r, "effective_rank_at_d_dot", math.nan)
    if before > 0 and after < (1 - COLLAPSE) * before:
        found.append(f"rank collapse (effective rank {before:.3g} -> {after:.3g} in training)")
    read, d_dot = getattr(r, "rank_bound", math.nan), r.predicted_capacity
    if not pd.isna(read) and read < 0.9 * d_dot:
        found.append(f"fewer features read than written (rank bound {int(read)} of d_dot "
                     f"{int(d_dot)})")
    return found


def pair_cause(capacity: pd.DataFrame, ranked: pd.DataFrame, x: str, y: str, a: str,
               b: str) -> tuple[str, str] | None:
    """(owner, cause) of the cause above that explains ``x`` and ``y`` swapping order between
    views ``a`` and ``b``: x's for ranking better where it does, else y's; None if none."""
    p = a if ranked.loc[x, f"rank{SUFFIX[a]}"] < ranked.loc[y, f"rank{SUFFIX[a]}"] else b
    q = b if p == a else a
    row = {label: capacity[capacity["label"] == label].iloc[0] for label in (x, y)}
    for owner, found in ((x, causes(row[x], p, q)), (y, causes(row[y], q, p))):
        if found:
            return owner, found[0].split(" (")[0]
    return None


def disagreements(capacity: pd.DataFrame) -> pd.DataFrame:
    """One row per configuration whose views' ranks differ by GAP or more: size, ranks, the
    views of its best and worst rank, and why (``causes`` or the intervals)."""
    table = ranks(capacity)
    if table.empty:
        return table
    rows = []
    for _, r in table.iterrows():
        got = {v: r[f"rank{SUFFIX[v]}"] for v in VIEWS if not pd.isna(r[f"rank{SUFFIX[v]}"])}
        if len(got) < 2 or max(got.values()) - min(got.values()) < GAP:
            continue
        best, worst = min(got, key=got.get), max(got, key=got.get)
        rows.append({"label": r["label"], "size": r["size"],
                     **{f"rank{SUFFIX[v]}": r[f"rank{SUFFIX[v]}"] for v in VIEWS},
                     "best": best, "worst": worst,
                     "why": "; ".join(causes(capacity[capacity["label"] == r["label"]].iloc[0],
                                             best, worst))})
    for row in rows:
        if row["why"]:
            continue
        same = table[table["size"] == row["size"]].set_index("label")
        apart = swaps_apart(capacity, row["label"], same.reset_index(), row["best"],
                            row["worst"])
        why = {other: pair_cause(capacity, same, row["label"], other, row["best"], row["worst"])
               for other in apart}
        if all(why.values()):
            by_cause: dict[str, list[str]] = {}
            for owner, cause in why.values():
                by_cause.setdefault(cause, []).append(owner)
            row["why"] = "within the seeds' intervals" + (
                ", but for swaps explained by the " + "; the ".join(
                    f"{cause} of {', '.join(sorted(set(owners), key=natural_key))}"
                    for cause, owners in by_cause.items()) if by_cause else "")
        else:
            row["why"] = ("no measured cause (apart from "
                          + ", ".join(o for o, cause in why.items() if not cause) + ")")
    return pd.DataFrame(rows)


def efficiency_cell(r, view: str) -> str:
    """Efficiency in ``view`` of a row of ``efficiency_order``: median [interval], or a bound."""
    s = SUFFIX[view]
    ratio, outcome = r[f"ratio{s}"], r[f"outcome{s}"]
    if outcome != "fails_at":
        return f"{'>=' if outcome == 'never_fails' else '<='} {ratio:.2f}"
    return f"{ratio:.2f} [{r['efficiency_low']:.2f}, {r['efficiency_high']:.2f}]"


def _point(r, view: str) -> str:
    s = SUFFIX[view]
    return bound(getattr(r, f"observed_capacity{s}"), getattr(r, f"outcome{s}"))


def section(capacity: pd.DataFrame, level: int = 2) -> list[str]:
    """The report's "Rankings per view" section: per size, every configuration's rank in each
    view, why its views disagree and what limits it, and the configurations without d_dot at a
    d_key of the size (softmax: the reference row) with their failure points (headings at
    markdown ``level``); [] with fewer than 3 ranked
    configurations at any size."""
    table = ranks(capacity)
    if table.empty or table.groupby("size").size().max() < 3:
        return []
    found = disagreements(capacity)
    found = found.set_index("label") if len(found) else pd.DataFrame(columns=["why"])
    lines = ["#" * level + " Rankings per view", ""]
    for size, rows in table.groupby("size"):
        if len(rows) < 3:
            continue
        levels = sizes(capacity)[size]
        span = f" to {max(levels)}" if len(levels) > 1 else ""
        lines += ["#" * (level + 1) + f" d_dot {size}{span}", "",
                  "| configuration | " + " | ".join(f"{VIEW_WORDS[v]} rank" for v in VIEWS)
                  + " | why the views disagree | what limits it |",
                  "|---|" + "---|" * (len(VIEWS) + 2)]
        for r in rows.sort_values(f"rank{SUFFIX['accuracy']}").itertuples():
            cells = ["–" if pd.isna(getattr(r, f"rank{SUFFIX[v]}")) else
                     str(int(getattr(r, f"rank{SUFFIX[v]}"))) for v in VIEWS]
            why = found.loc[r.label, "why"] if r.label in found.index else ""
            limit = "; ".join(limits(capacity[capacity["label"] == r.label].iloc[0]))
            lines.append(f"| {r.label} | " + " | ".join(cells) + f" | {why} | {limit} |")
        unbounded = capacity[capacity["predicted_capacity"].isna()
                             & capacity["d_key"].isin(levels)]
        lines += [""] + [f"Reference, no d_dot: {r.label}, failure point "
                         + "; ".join(f"{VIEW_WORDS[v]} {_point(r, v)}" for v in VIEWS) + "."
                         for r in unbounded.itertuples()]
        lines += [""] if len(unbounded) else []
    return lines


def efficiency_table(capacity: pd.DataFrame) -> list[str]:
    """Configurations ranked by capacity efficiency = failure point / d_dot in each view, the
    rank correlation between the views' orders, and where they disagree."""
    orders = {v: efficiency_order(capacity, v) for v in VIEWS}
    if len(orders[HEADLINE]) < 2:
        return []
    lines = ["## Capacity efficiency (failure point / d_dot), per view", "",
             f"Ranked by the {VIEW_WORDS[HEADLINE]} view (docs/analysis.md, \"Which view "
             "headlines the rankings\").", "",
             "| configuration | d_dot | " + " | ".join(f"{VIEW_WORDS[v]}: rank, efficiency"
                                                     for v in VIEWS) + " |",
             "|---|---|" + "---|" * len(VIEWS)]
    ranks = {v: {label: i for i, label in enumerate(o["label"], 1)} for v, o in orders.items()}
    for r in orders[HEADLINE].itertuples():
        cells = []
        for v in VIEWS:
            row = orders[v][orders[v]["label"] == r.label]
            if row.empty:
                cells.append("–")
                continue
            cells.append(f"{ranks[v][r.label]}: {efficiency_cell(row.iloc[0], v)}")
        lines.append(f"| {r.label} | {r.predicted_capacity} | " + " | ".join(cells) + " |")
    lines += ["", *view_agreement(capacity), "", *section(capacity)]
    return lines


def view_rhos(capacity: pd.DataFrame) -> list[tuple[str, str, float, int]]:
    """(view, other view, Spearman's rho of their failure point / d_dot, configurations) for
    each pair of views over the configurations with a bounded d_dot ranked in both (3 or more)."""
    rows, found = capacity[capacity["predicted_capacity"].notna()], []
    for i, v in enumerate(VIEWS):
        for w in VIEWS[i + 1:]:
            both = rows[[f"ratio{SUFFIX[v]}", f"ratio{SUFFIX[w]}"]].dropna()
            if len(both) >= 3:
                found.append((v, w, stats.spearmanr(both.iloc[:, 0], both.iloc[:, 1]).statistic,
                              len(both)))
    return found


def view_agreement(capacity: pd.DataFrame) -> list[str]:
    """Spearman's rho between each pair of views' efficiency orders (``view_rhos``), and the
    configurations whose loss view fails well before their accuracy view (dilution: the loss
    crosses tau while the keys are still answered right)."""
    lines = [f"- {VIEW_WORDS[v]} against {VIEW_WORDS[w]}: Spearman rho = {rho:.2f} over {n} "
             "configurations." for v, w, rho, n in view_rhos(capacity)]
    found = capacity[diluted(capacity)]
    if len(found):
        lines.append("- Loss view failing before the accuracy view (the read-out is diluted: the "
                     "loss crosses tau while the keys are still answered right; ratio "
                     f"accuracy / loss above {DILUTED:g}): " + "; ".join(
                         f"{r.label} {cell(r.observed_capacity)} against "
                         f"{bound(r.observed_capacity_acc, r.outcome_acc)}"
                         for r in found.itertuples()) + ".")
    return lines
