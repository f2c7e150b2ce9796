"""How the maps' rankings move between sizes: the families present at two sizes, ranked per
view at each, and why a family moves (the report's subsection after "Rankings per view" is
``report.rankings.between_sizes``). Pure: it reads no file.

Its rule is stated once, in docs/analysis.md ("Rankings between sizes").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd
from scipy import stats

from kernelzoo.analysis.capacity import POINTS, VIEW_WORDS, VIEWS
from kernelzoo.analysis.rankings import GAP, HEADLINE, efficiency_cell, limits, loss_first, ranks
from kernelzoo.analysis.efficiency import efficiency_order
from kernelzoo.analysis.labels import natural_key


def _arm(name: str) -> tuple[str, dict[str, str]]:
    """A family name as its map and its settings ("tanh memory.normalisation=none" ->
    ("tanh", {"memory.normalisation": "none"})): the tokens "key=value" are settings."""
    tokens = name.split()
    settings = dict(t.split("=", 1) for t in tokens if "=" in t)
    return " ".join(t for t in tokens if "=" not in t), settings


def _arms(name: str, common: list[str], rows: dict, small: int, large: int,
          views: list[str]) -> list[str]:
    """What the arms of a one-setting comparison measure: for each family of ``common`` that
    is ``name`` but for one setting's value (tanh under normalisation none beside attention),
    its efficiency over ``name``'s at both sizes in each of ``views``, where both are numbers
    (failure points, not bounds): that setting's measured share of ``name``'s change."""
    mine, settings = _arm(name)
    found = []
    for other in common:
        theirs, their_settings = _arm(other)
        changed = [k for k in {*settings, *their_settings}
                   if settings.get(k) != their_settings.get(k)]
        if other == name or theirs != mine or len(changed) != 1:
            continue
        shares = []
        for view in views:
            pair = [(rows[n, view].loc[other], rows[n, view].loc[name]) for n in (small, large)]
            if all(a["outcome"] in POINTS and b["outcome"] in POINTS and b["ratio"] > 0
                   for a, b in pair):
                shares.append(f"x{pair[0][0]['ratio'] / pair[0][1]['ratio']:.2f} at d_dot {small}"
                              f", x{pair[1][0]['ratio'] / pair[1][1]['ratio']:.2f} at {large} in "
                              f"{VIEW_WORDS[view]}")
        if shares:
            key = changed[0]
            found.append(f"{key}={their_settings.get(key, 'its default')} beside it holds "
                         + "; ".join(shares)
                         + f" (its efficiency over this one's: {key}'s measured share)")
    return found


def _span(r) -> tuple[float, float]:
    """The efficiencies a row of ``efficiency_order`` allows: its interval, or from a lower
    bound up, or up to an upper bound."""
    outcome, ratio = r["outcome"], r["ratio"]
    if outcome == "never_fails":
        return ratio, math.inf
    if outcome == "fails_everywhere":
        return 0.0, ratio
    return r["efficiency_low"], r["efficiency_high"]


def _change(a, b) -> str | None:
    """"falls" or "rises" where efficiency rows ``a`` (smaller size) and ``b`` of one view are
    apart (``_span``); None where they overlap."""
    (alo, ahi), (blo, bhi) = _span(a), _span(b)
    if bhi < alo:
        return "falls"
    return "rises" if blo > ahi else None


def _features(r) -> dict[str, str]:
    """What the store measured of capacity row ``r`` that can limit it: kind -> the words."""
    found = limits(r) + ([f"loss view first (accuracy {r.observed_capacity_acc:.3g} against "
                          f"loss {r.observed_capacity:.3g})"] if loss_first(r) else [])
    return {words.split(" (")[0]: words for words in found}


def _differences(a, b, small: int, large: int) -> list[str]:
    """The features (``_features``) of capacity rows ``a`` and ``b`` found at one size only."""
    fa, fb = _features(a), _features(b)
    return ([f"{fb[k]} at d_dot {large} only" for k in fb if k not in fa]
            + [f"{fa[k]} at d_dot {small} only" for k in fa if k not in fb])


def _row(name: str, common: list[str], orders: dict, rows: dict, small: int,
         large: int) -> tuple[tuple, str, list[str]]:
    """Family ``name``'s row: per view its ranks at both sizes ((small, large); None where it is
    not ranked at both), why it moved (module docstring), and the views where its own efficiency
    change moved it, each as "<view> <falls|rises>". ``orders[size, view]``: family -> rank;
    ``rows[size, view]``: its ``efficiency_order`` rows by family; ``rows[size]``: its capacity
    rows by family."""
    ranked, own, other, changed = [], [], [], []
    for view in VIEWS:
        ra, rb = orders[small, view].get(name), orders[large, view].get(name)
        if ra is None or rb is None:
            ranked.append(None)
            continue
        ranked.append((ra, rb))
        if abs(ra - rb) < GAP:
            continue
        a, b = rows[small, view].loc[name], rows[large, view].loc[name]
        change = _change(a, b)
        words = f"{efficiency_cell(a)} -> {efficiency_cell(b)}"
        if change and (change == "falls") == (rb > ra):  # its own change moves it
            own.append(f"{VIEW_WORDS[view]} efficiency {change}, {words}")
            changed.append(f"{VIEW_WORDS[view]} {change}")
            continue
        swapped = [o for o in common if o != name and o in orders[small, view]
                   and o in orders[large, view]
                   and (orders[small, view][o] < ra) != (orders[large, view][o] < rb)
                   and _change(rows[small, view].loc[o], rows[large, view].loc[o])]
        other.append(f"{VIEW_WORDS[view]} efficiency {change or 'held'}, {words}: "
                     + (f"it swaps with {', '.join(swapped)}, whose efficiency changed"
                        if swapped else "within the seeds' intervals"))
    if own:
        found = _differences(rows[small].loc[name], rows[large].loc[name], small, large)
        arms = _arms(name, common, rows, small, large,
                     [v for v in VIEWS if any(c.startswith(f"{VIEW_WORDS[v]} ") for c in changed)])
        if found:
            own.append("; ".join(found + arms))
        elif arms:
            own.append("the same diagnostics at both sizes; " + "; ".join(arms))
        else:
            own.append("no measured cause (the same diagnostics at both sizes)")
    return tuple(ranked), "; ".join(own + other), changed


@dataclass(frozen=True)
class SizePair:
    """Two neighbouring sizes compared: their families, each view's rank correlation between
    the sizes (Spearman's rho, over how many families), one row per family in the large size's
    headline order (family, its ranks per view as ``_row`` gives them, what changes), and the
    families their own efficiency change moved (family -> "<view> <falls|rises>" per view)."""

    small: int
    large: int
    families: list[str]
    rho: dict[str, tuple[float, int]]
    rows: list[tuple[str, tuple, str]]
    moved: dict[str, list[str]]


def pairs(capacity: pd.DataFrame, family: dict[str, str]) -> list[SizePair]:
    """Each pair of neighbouring sizes with more than 2 x GAP families ranked at both in the
    headline view (module docstring); ``family``: configuration label -> its family's name
    (``scaling.families``, or scaling.csv's configurations column)."""
    table = ranks(capacity)
    if table.empty:
        return []
    table = table.assign(family=table["label"].map(family)).dropna(subset=["family"])
    configs = table.drop_duplicates("label")
    shared = configs.loc[configs.duplicated(["size", "family"], keep=False), "label"]
    table = table[~table["label"].isin(shared) & (table["view"] == HEADLINE)]
    found, compared = sorted(table["size"].unique()), []
    for small, large in zip(found, found[1:]):
        at = {n: table[(table["size"] == n) & table["rank"].notna()].set_index("family")
              for n in (small, large)}
        common = sorted(set(at[small].index) & set(at[large].index), key=natural_key)
        if len(common) <= 2 * GAP:
            continue
        rows, orders = {}, {}
        for n in (small, large):
            mine = capacity[capacity["label"].isin(at[n].loc[common, "label"])]
            rows[n] = mine.set_index(mine["label"].map(family))
            for view in VIEWS:
                order = efficiency_order(mine, view)
                orders[n, view] = pd.Series(range(1, len(order) + 1),
                                            index=order["label"].map(family).to_numpy())
                rows[n, view] = order.set_index(order["label"].map(family))
        rho = {}
        for view in VIEWS:
            both = pd.concat([orders[small, view], orders[large, view]], axis=1).dropna()
            if len(both) >= 3:
                rho[view] = (float(stats.spearmanr(both.iloc[:, 0], both.iloc[:, 1]).statistic),
                             len(both))
        done = {name: _row(name, common, orders, rows, int(small), int(large))
                for name in sorted(common, key=lambda f: (orders[large, HEADLINE].get(f, math.inf),
                                                         natural_key(f)))}
        compared.append(SizePair(int(small), int(large), common, rho,
                                 [(name, ranked, why) for name, (ranked, why, _) in done.items()],
                                 {name: moved for name, (_, _, moved) in done.items() if moved}))
    return compared
