"""The report's rankings: the efficiency heading with the views' agreement
(``efficiency_section``), the tiers per size with each configuration's measured flags
(``tier_section``) and the rankings between sizes (``between_sizes_section``), from the rules
of ``analysis.rankings``, ``analysis.tiers`` and ``analysis.between_sizes``."""

from __future__ import annotations

import pandas as pd

from kernelzoo.analysis.capacity import VIEW_WORDS, VIEWS, by_view
from kernelzoo.analysis.efficiency import efficiency_order
from kernelzoo.analysis.labels import bound, cell, natural_key, rho_words
from kernelzoo.analysis.rankings import GAP, HEADLINE, LOSS_FIRST, loss_first, sizes, view_rhos
from kernelzoo.analysis.tiers import Placed


def efficiency_section(capacity: pd.DataFrame) -> list[str]:
    """The report's failure point / d_dot heading: what the ratio is in each view, the rank
    correlation between the views' orders, and where the loss view fails well before the
    accuracy view; the tiers follow (``tier_section``)."""
    if len(efficiency_order(capacity, HEADLINE)) < 2:
        return []
    return ["## Failure point / d_dot, per view", "",
            "No view headlines the others: the loss view's n* / d_dot is the rank theory's "
            "ratio, bounded by 1; accuracy and keys retrieved decode by argmax, and their keys / "
            "d_dot is not bounded by 1 (docs/analysis.md, \"What each view measures\").", "",
            *view_agreement(capacity), ""]


def view_agreement(capacity: pd.DataFrame) -> list[str]:
    """Spearman's rho between each pair of views' efficiency orders (``view_rhos``), and the
    configurations whose loss view fails first (``loss_first``: the loss crosses tau while the
    keys are still answered right)."""
    lines = [f"- {VIEW_WORDS[v]} against {VIEW_WORDS[w]}: Spearman rho = {rho_words(rho)} "
             f"over {n} configurations." for v, w, rho, n in view_rhos(capacity)]
    found = capacity[loss_first(capacity)]
    if len(found):
        lines.append("- Loss view failing first (the loss crosses tau while the keys are still "
                     "answered right: the accuracy view's failure point over the loss view's "
                     f"above {LOSS_FIRST:g}): " + "; ".join(
                         f"{r.label} {cell(r.observed_capacity)} against "
                         f"{bound(r.observed_capacity_acc, r.outcome_acc)}"
                         for r in found.itertuples()) + ".")
    return lines


def flag_words(f) -> str:
    """A configuration's flags (a row of ``tiers.flags``) as one table cell ("" for none)."""
    words = (["diluted read-out"] if f.diluted else []) + \
        (["partial retrieval"] if f.partial else []) + \
        (["loss passes wrong keys"] if getattr(f, "lenient", False) else []) + \
        ([f"bound in {', '.join(f.bound)}"] if f.bound else []) + list(f.limits)
    for key, name in (("blew_up", "denominator near zero"),
                      ("learned_then_lost", "learned then lost"),
                      ("never_learned", "never learned")):
        n = getattr(f, key)
        if not pd.isna(n) and n:
            words.append(f"{name} ({int(n)} run{'s' * (int(n) > 1)})")
    return "; ".join(words)


def _headline_key(p: Placed | None) -> tuple:
    """Rows in accuracy-view order: by tier, then efficiency; bounds and the rest after."""
    if p is None:
        return (2, 0.0)
    return (0, p.tier, -p.efficiency) if p.tier is not None else (1, -p.efficiency)


def tier_section(capacity: pd.DataFrame, placed: tuple[Placed, ...],
                 flag_rows: pd.DataFrame | None, level: int = 2) -> list[str]:
    """The report's tiers per size (``placed``: ``tiers.tiers``), one column per view (tier and
    efficiency, or why it is apart), and each configuration's flags (none without
    ``flag_rows``)."""
    if not placed:
        return []
    by = {(p.label, p.view): p for p in placed}
    flagged = {} if flag_rows is None else {f.label: flag_words(f)
                                            for f in flag_rows.itertuples()}
    lines = ["#" * level + " Tiers per view", ""]
    for size in sorted({p.size for p in placed}):
        labels = sorted({p.label for p in placed if p.size == size}, key=natural_key)
        if len(labels) < 2:
            continue
        labels.sort(key=lambda x: _headline_key(by.get((x, "accuracy"))))
        lines += ["#" * (level + 1) + f" d_dot {size}", "",
                  "| configuration | " + " | ".join(
                      f"{VIEW_WORDS[v]}: tier, " + ("n* / d_dot" if v == "loss" else
                                                    "keys / d_dot (argmax)") for v in VIEWS)
                  + " | measured flags |",
                  "|---|" + "---|" * (len(VIEWS) + 1)]
        for label in labels:
            cells = []
            for view in VIEWS:
                p = by.get((label, view))
                if p is None:
                    cells.append("–")
                elif p.apart == "bound":
                    sign = ">=" if p.outcome == "never_fails" else "<="
                    cells.append(f"bound: {sign} {p.efficiency:.2f}")
                elif p.tier is None:
                    cells.append(f"apart ({p.apart}): {p.efficiency:.2f}")
                else:
                    cells.append(f"{p.tier}: {'plateau ' * (p.outcome == 'plateau')}"
                                 f"{p.efficiency:.2f} [{p.low:.2f}, {p.high:.2f}]")
            lines.append(f"| {label} | " + " | ".join(cells) + f" | {flagged.get(label, '')} |")
        unbounded = capacity[capacity["predicted_capacity"].isna()
                             & capacity["d_key"].isin(sizes(capacity)[size])]
        lines += [""] + [f"Reference, no d_dot: {label}, failure point " + "; ".join(
            f"{VIEW_WORDS[r.view]} {bound(r.failure_point, r.outcome)}" for r in rows.itertuples())
            + "." for label, rows in by_view(unbounded).groupby("label", sort=False)]
        lines += [""] if len(unbounded) else []
    return lines


def _rank_cell(ranked: tuple[int, int] | None) -> str:
    """A family's ranks at the two sizes, in bold where they moved by ``GAP`` or more."""
    if ranked is None:
        return "–"
    small, large = ranked
    return f"**{small} -> {large}**" if abs(small - large) >= GAP else f"{small} -> {large}"


def between_sizes_section(size_pairs, level: int = 2) -> list[str]:
    """The rankings between sizes (``size_pairs``: ``between_sizes.pairs``) as markdown headed
    at ``level`` + 1."""
    lines = []
    for pair in size_pairs:
        lines += ["#" * (level + 1) + f" Between sizes: d_dot {pair.small} and {pair.large}", "",
                  f"The {len(pair.families)} families present at both sizes, ranked among "
                  "themselves at each (efficiency = failure point / d_dot); a rank in bold "
                  f"moved by {GAP} places or more.", ""]
        lines += [f"- {VIEW_WORDS[v]}: Spearman rho = {r:.2f} over {n} families."
                  for v, (r, n) in pair.rho.items()]
        lines += ["", "| family | " + " | ".join(f"{VIEW_WORDS[v]} rank" for v in VIEWS)
                  + " | what changes |", "|---|" + "---|" * (len(VIEWS) + 1)]
        lines += [f"| {name} | " + " | ".join(map(_rank_cell, ranked)) + f" | {why} |"
                  for name, ranked, why in pair.rows]
        lines.append("")
    return lines
