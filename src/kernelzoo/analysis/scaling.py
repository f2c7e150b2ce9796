"""The d_dot law with intervals: does a family's failure point follow d_dot, in each view of
capacity (``capacity.py``), and how tightly?

A family is a configuration without what d_dot decides: the same feature_map, update_rule and
parameters but the one the map resolves from d_dot (``style.sizing_param``: DPFP's nu, FAVOR+'s
m, ...), and the same d_key where the map keeps it. A map without such a parameter sets d_key
from d_dot (ELU+1: d_key = d_dot), so its d_key is left out too.

Rule (stated again in report.md)
--------------------------------
The primary statement is the ratio failure point / d_dot at each d_dot level: the median over
the level's seeds with its order-statistic interval, every seed counted, a seed whose value is a
bound as the interval it allows (``censored.median``: the median is a point when the bounds lie
beyond it, else a half-line or an interval; the interval's level beside it: 75% for 3 seeds,
93.75% for 5). Over the levels, n* = a d_dot^b is fitted to the levels' medians in log-log, a
level whose median is a bound entering as its interval (``censored.law``: a censored normal
likelihood, t intervals with k - 2 degrees of freedom over k levels, so the levels' deviations
from the law widen them); it needs 3 levels whose median is a point. The joint test of
n* = d_dot (a = 1 and b = 1, at 5%) is secondary: "rejected" when it rejects; when it does not,
"consistent" only when its power against n* = 0.9 d_dot (``power.law_power``: the same design and
machinery on simulated studies) is 50% or more, else "cannot tell". Where too few levels'
medians are points, the verdict rests on bounds and says so ("cannot tell: bounded at 264").
A level whose ratio interval excludes 1 is named.

``table`` is ``scaling.csv`` (one row per family, view and d_dot), ``section`` report.md's
section, ``figure`` the figure ``capacity_scaling``. Per configuration the same ratio is its
capacity efficiency (``efficiency.py``). Each analysed store's answers:

    python -m kernelzoo.analysis.scaling results/reference/*/scaling.csv
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import NullFormatter

from kernelzoo.analysis import censored, power
from kernelzoo.analysis.capacity import SUFFIX, VIEW_WORDS, VIEWS
from kernelzoo.analysis.intervals import MIN_LEVELS, describe
from kernelzoo.analysis.style import (bar_handles, canonical_params, config_colors, error_bar,
                                      format_value, legend, map_label, natural_key, save,
                                      size_groups, sizing_param)

MIN_D_DOTS = MIN_LEVELS
COLUMNS = ("family", "view", "feature_map", "params", "d_key", "update_rule", "n_points",
           "n_d_dot", "a", "a_low", "a_high", "b", "b_low", "b_high", "p_identity",
           "follows_d_dot", "n_censored", "power", "verdict", "d_dot", "configurations",
           "n_seeds", "n_bounds", "ratio", "ratio_lowest", "ratio_highest", "ratio_low",
           "ratio_high", "ratio_level")
VERDICTS = ("rejected", "consistent", "cannot tell")
RULE = __doc__.partition("---\n")[2].partition("\n\n``table``")[0].strip()


@dataclass(frozen=True)
class Family:
    """One family: its configurations' seeds (``points``: label, d_dot, seed and, per view,
    outcome and value columns as in ``capacity.seed_table``) and its law per view (None:
    failure points at fewer than MIN_D_DOTS levels)."""

    name: str
    feature_map: str
    params: str        # canonical, without the parameter resolved from d_dot
    d_key: int | None  # None: the map sets d_key from d_dot
    update_rule: str
    points: pd.DataFrame = field(repr=False, compare=False)
    laws: dict = field(compare=False)  # view -> censored.CensoredLaw | None
    powers: dict = field(default_factory=dict, compare=False)  # view -> power.law_power

    def fitted(self, view: str) -> pd.DataFrame:
        """The view's seeds that fail at a point, with ``value`` their failure point."""
        s = SUFFIX[view]
        hit = self.points[self.points[f"outcome{s}"] == "fails_at"]
        return hit.assign(value=hit[f"value{s}"])

    def intervals(self, view: str) -> list[tuple[int, np.ndarray, np.ndarray]]:
        """Per d_dot with data in the view: (d_dot, lo, hi) of its seeds
        (``censored.seed_intervals``: a bound as the interval it allows)."""
        s = SUFFIX[view]
        return [(int(d_dot), *censored.seed_intervals(g[f"outcome{s}"], g[f"value{s}"]))
                for d_dot, g in self.points.groupby("d_dot")]

    def departures(self, view: str) -> pd.DataFrame:
        """Per d_dot: its configurations, seeds with a point and with a bound, and the ratio
        failure point / d_dot (``censored.median`` over every seed: ratio when a point, else
        NaN, ratio_lowest..ratio_highest the values it can take) with its interval."""
        rows = []
        labels = self.points.groupby("d_dot")["label"].apply(set)
        for d_dot, lo, hi in self.intervals(view):
            m = censored.median(lo, hi).scaled(d_dot)
            rows.append({"d_dot": d_dot,
                         "configurations": "; ".join(sorted(labels[d_dot], key=natural_key)),
                         "n_seeds": m.n - m.bounds, "n_bounds": m.bounds, "ratio": m.value,
                         "ratio_lowest": m.lowest, "ratio_highest": m.highest,
                         "ratio_low": m.low, "ratio_high": m.high, "ratio_level": m.level})
        return pd.DataFrame(rows)


def _law(levels: pd.DataFrame) -> censored.CensoredLaw | None:
    """The censored law over the levels with data (``censored.law``)."""
    hit = levels[levels["n_seeds"] + levels["n_bounds"] > 0]
    if len(hit) < MIN_D_DOTS:
        return None
    return censored.law(hit["d_dot"], hit["ratio_lowest"] * hit["d_dot"],
                        hit["ratio_highest"] * hit["d_dot"])


def _power(family: "Family", view: str) -> float:
    """``power.law_power`` of the family's test in ``view`` (NaN: no law)."""
    law = family.laws[view]
    if law is None:
        return math.nan
    return power.law_power(power.design(family.intervals(view), law.sd))


def verdict(law_p: float, power_: float, n_points: int) -> str:
    """The law's word (VERDICTS) from its test's p, its power and the levels whose median is a
    point: "cannot tell" without a test."""
    if n_points < censored.MIN_POINTS or pd.isna(law_p):
        return VERDICTS[2]
    if law_p < 0.05:
        return VERDICTS[0]
    return VERDICTS[1] if power_ >= power.ENOUGH else VERDICTS[2]


def _keys(runs: pd.DataFrame) -> tuple[dict, dict]:
    """(label -> family key, family key -> its parameters) for the configurations with a bounded
    d_dot; a key is (feature_map, canonical params, d_key or None, update_rule)."""
    keys, params = {}, {}
    for r in runs.drop_duplicates("label").dropna(subset=["d_dot"]).itertuples():
        sized = sizing_param(r.feature_map)
        rest = {k: v for k, v in json.loads(r.feature_map_params).items() if k != sized}
        key = (r.feature_map, canonical_params(rest), int(r.d_key) if sized else None,
               r.update_rule)
        keys[r.label], params[key] = key, rest
    return keys, params


def _name(key: tuple, params: dict, rules: bool) -> str:
    """A family's name: the map, its parameters that vary among the map's families (as in the
    configuration labels), d_key where the map keeps it, the update rule where several ran."""
    fmap, _, d_key, rule = key
    dicts = [p for k, p in params.items() if k[0] == fmap]
    head, named = map_label(fmap, params[key])  # without the sizing parameter: "DPFP"
    shown = [k for k in sorted(params[key]) if k not in named
             and len({json.dumps(d.get(k)) for d in dicts}) > 1]
    parts = [head]
    parts += [v if isinstance(v, str) else f"{k}={format_value(v)}"
              for k, v in ((k, params[key][k]) for k in shown)]
    return " ".join(parts + ([f"d_key={d_key}"] if d_key is not None else [])
                    + ([rule] if rules else []))


def families(runs: pd.DataFrame, seeds: pd.DataFrame) -> list[Family]:
    """Every family with a failure point (fails_at) in some view (``runs``: ``runs.load_runs``;
    ``seeds``: ``capacity.seed_table``), in natural order of name, its laws where they qualify."""
    keys, params = _keys(runs)
    d_dots = runs.drop_duplicates("label").set_index("label")["d_dot"]
    points = seeds[seeds["label"].isin(keys)]
    points = points.assign(d_dot=points["label"].map(d_dots).astype(int),
                           key=points["label"].map(keys))
    rules = runs["update_rule"].nunique() > 1
    found = []
    for key, group in points.groupby("key", sort=False):
        group = group.sort_values(["d_dot", "seed"]).reset_index(drop=True)
        if not any(group[f"outcome{SUFFIX[v]}"].eq("fails_at").any() for v in VIEWS):
            continue
        family = Family(_name(key, params, rules), key[0], key[1], key[2], key[3], group, {})
        family.laws.update({v: _law(family.departures(v)) for v in VIEWS})
        family.powers.update({v: _power(family, v) for v in VIEWS})
        found.append(family)
    return sorted(found, key=lambda f: natural_key(f.name))


def table(found: list[Family]) -> pd.DataFrame:
    """``scaling.csv``: one row per family, view and d_dot, the family's law in that view
    (blank when not fitted) repeated on each of its rows; columns COLUMNS."""
    rows = []
    for f in found:
        for view in VIEWS:
            law, levels = f.laws[view], f.departures(view)
            points = int(levels["ratio"].notna().sum()) if len(levels) else 0
            fit = {"family": f.name, "view": view, "feature_map": f.feature_map,
                   "params": f.params, "d_key": f.d_key, "update_rule": f.update_rule,
                   "n_points": len(f.fitted(view)), "n_d_dot": f.fitted(view)["d_dot"].nunique(),
                   **({k: getattr(law, k) for k in ("a", "a_low", "a_high", "b", "b_low",
                                                    "b_high", "p_identity")} if law else {}),
                   "follows_d_dot": law.follows if law else None,
                   "n_censored": law.censored if law else None, "power": f.powers[view],
                   "verdict": verdict(law.p_identity if law else math.nan, f.powers[view],
                                      points) if len(levels) >= MIN_D_DOTS else None}
            rows += [{**fit, **d} for d in levels.to_dict("records")]
    out = pd.DataFrame(rows, columns=list(COLUMNS))
    out["d_key"] = out["d_key"].astype("Int64")
    return out


def _ci(value, low, high, spec: str) -> str:
    """"0.9 [0.8, 1]": a value with its interval, or alone without one."""
    return (f"{value:{spec}}" if pd.isna(low) else
            f"{value:{spec}} [{low:{spec}}, {high:{spec}}]")


def _p(p: float) -> str:
    """A p value as the report writes it: 3 digits, or "< 0.0001"."""
    return "p < 0.0001" if p < 1e-4 else f"p = {p:.3g}"


def _median(r) -> censored.Median:
    """A level's ratio as ``censored.Median`` from its row (a scaling.csv without the
    ratio_lowest and ratio_highest columns: the ratio over its points)."""
    lowest = getattr(r, "ratio_lowest", r.ratio)
    highest = getattr(r, "ratio_highest", r.ratio)
    n = int(r.n_seeds) + (int(r.n_bounds) if hasattr(r, "ratio_lowest") else 0)
    return censored.Median(lowest, highest, r.ratio_low, r.ratio_high, r.ratio_level, n,
                           n - int(r.n_seeds))


def _level(r) -> str:
    """One level's ratio: "64: 0.91 [0.84, 0.97] (94%)", "256: >= 1.03 [0.95, inf) (94%; 3 of
    5 seeds bounds)"."""
    m = _median(r)
    if not m.n:
        return f"{r.d_dot}: –"
    notes = ["one seed" if m.n == 1 else f"{m.level:.0%}"]
    if m.bounds:
        notes.append(f"{m.bounds} of {m.n} seeds bounds")
    return f"{r.d_dot}: {m.words()} ({'; '.join(notes)})"


def _bounded(rows: pd.DataFrame) -> str:
    """"bounded at 264 (d_dot 256), ...": the levels whose median is a bound, at the failure
    point it is bounded at."""
    parts = []
    for x in rows.itertuples():
        m = _median(x)
        if m.n and not m.point:
            lowest, highest = m.lowest * x.d_dot, m.highest * x.d_dot
            parts.append((f">= {lowest:.4g}" if highest == math.inf else
                          f"<= {highest:.4g}" if lowest == 0 else
                          f"in [{lowest:.4g}, {highest:.4g}]") + f" (d_dot {x.d_dot})")
    return "bounded at " + ", ".join(parts) if parts else "no law"


def law_words(r, rows: pd.DataFrame) -> str:
    """The law's verdict in words from its first row (``verdict``, its p and power)."""
    word = getattr(r, "verdict", None)
    if pd.isna(r.b):
        return f"cannot tell: {_bounded(rows)}" if word == VERDICTS[2] else "not fitted"
    if r.p_identity < 0.05:
        return f"n* = d_dot rejected at 5% (F test {_p(r.p_identity)})"
    if not isinstance(word, str):  # a scaling.csv written before the power column
        return f"n* = d_dot not rejected (F test {_p(r.p_identity)}; its power not computed)"
    return (f"{'consistent with n* = d_dot' if word == VERDICTS[1] else 'cannot tell'} (F test "
            f"{_p(r.p_identity)}, not rejected; power {r.power:.0%} against n* = {power.RATIO:g}"
            " d_dot)")


def short_verdict(r) -> str:
    """The law's verdict in a few words from a scaling.csv row: "rejects n* = d_dot",
    "consistent with n* = d_dot (power 62%)", "cannot tell n* = d_dot (power 29%)"."""
    word = getattr(r, "verdict", None)
    if r.p_identity < 0.05:
        return "rejects n* = d_dot"
    if not isinstance(word, str):  # a scaling.csv written before the power column
        return "does not reject n* = d_dot (power not computed)"
    return (f"{'consistent with' if word == VERDICTS[1] else 'cannot tell'} n* = d_dot "
            f"(power {r.power:.0%})")


def sentence(rows: pd.DataFrame) -> str:
    """One family's answer in one view from its rows of ``table`` (or a scaling.csv read back):
    the ratio per level first, then the law and its test."""
    r = rows.iloc[0]
    ratios = "; ".join(_level(x) for x in rows.itertuples())
    at = (f"failure point / d_dot per level (median over seeds, bounds as the intervals they "
          f"allow [interval] (its level)): {ratios}")
    name = f"{r.family} ({VIEW_WORDS[r.view]} view)"
    if pd.isna(r.b):
        if getattr(r, "verdict", None) == VERDICTS[2]:
            return f"{name}: {at}; n* = d_dot: {law_words(r, rows)}."
        return (f"{name}: {at}; not fitted, failure points at {r.n_d_dot} d_dot level"
                f"{'' if r.n_d_dot == 1 else 's'} (fewer than {MIN_D_DOTS}).")
    censored_levels = getattr(r, "n_censored", 0)
    law = (f"n* = {_ci(r.a, r.a_low, r.a_high, '.3g')} d_dot^{_ci(r.b, r.b_low, r.b_high, '.3f')}"
           f" over {r.n_d_dot if pd.isna(censored_levels) else int(r.n_d_dot)} levels"
           + (f" ({int(censored_levels)} of them bounds)" if censored_levels > 0 else ""))
    outside = [str(x.d_dot) for x in rows.itertuples()
               if _median(x).n > 1 and not _median(x).low <= 1 <= _median(x).high]
    return (f"{name}: {at}"
            + (f" (ratio interval excludes 1 at d_dot {', '.join(outside)})" if outside else "")
            + f"; {law}; {law_words(r, rows)}.")


def section(found: list[Family]) -> list[str]:
    """report.md's section on the d_dot law ([] when no family has two levels)."""
    shown = [f for f in found if f.points["d_dot"].nunique() >= 2]
    if not shown:
        return []
    lines = ["## Capacity against d_dot, per view", "", RULE, "",
             "| family | view | failure point / d_dot per level | levels | a [95%] | b [95%] | "
             f"n* = d_dot (F test; its power against n* = {power.RATIO:g} d_dot) |",
             "|---|---|---|---|---|---|---|"]
    rows = table(shown)
    for (_, view), group in rows.groupby(["family", "view"], sort=False):
        r = group.iloc[0]
        fitted = not pd.isna(r.b)
        lines.append(f"| {r.family} | {VIEW_WORDS[view]} | "
                     + "; ".join(_level(x) for x in group.itertuples()) + f" | {r.n_d_dot} | "
                     + (f"{_ci(r.a, r.a_low, r.a_high, '.3g')} | "
                        f"{_ci(r.b, r.b_low, r.b_high, '.3f')}" if fitted else "– | –")
                     + f" | {law_words(r, group)} |")
    return lines + [""]


def _ticks(levels: list[int]) -> dict[int, str]:
    """One tick per size (``style.size_groups``: 64, 65 and 66 are one), at its smallest
    level, labelled with its range."""
    return {head: f"{head}-{g[-1]}" if len(g) > 1 else str(head)
            for head, g in size_groups(levels).items()}


def figure(found: list[Family], out_dir: Path) -> Path:
    """``capacity_scaling``: one panel per view, failure point / d_dot against d_dot (log x, the
    levels as ticks): each seed's ratio (small dots), each level's median with its
    order-statistic interval (bars, their levels in the legend; a level of one seed has none),
    the fitted law's ratio a d_dot^(b-1) with its 95% band where fitted, and 1 (dotted). The y
    range is the points' and intervals', so a wide band is cut at the edge."""
    shown = [f for f in found if f.points["d_dot"].nunique() >= 2]
    colors = config_colors([f.name for f in shown])
    fig = Figure(figsize=(13, 4.8))
    axes = fig.subplots(1, len(VIEWS), sharey=True)
    kinds, drawn = set(), [1.0]
    for ax, view in zip(axes, VIEWS):
        ax.set_title(f"{VIEW_WORDS[view]} view", fontsize=10)
        if not any(len(f.fitted(view)) for f in shown):
            ax.text(0.5, 0.5, "no seed fails at a point in this view", ha="center",
                    va="center", transform=ax.transAxes, fontsize=8)
            continue
        levels = set()
        for i, f in enumerate(shown):
            color, pts, lv = colors[f.name], f.fitted(view), f.departures(view)
            shift = 2.0 ** (0.03 * (i - (len(shown) - 1) / 2))
            ax.scatter(pts["d_dot"] * shift, pts["value"] / pts["d_dot"], s=9, alpha=0.5,
                       linewidths=0, color=color)
            lv = lv[lv["ratio"].notna()]
            levels |= set(lv["d_dot"])
            drawn += [*pts["value"] / pts["d_dot"], *lv["ratio_low"], *lv["ratio_high"]]
            for j, r in enumerate(lv.itertuples()):
                kind = describe(r.n_seeds + r.n_bounds)
                kinds.add(kind)
                high = r.ratio_high if math.isfinite(r.ratio_high) else r.ratio  # a half-line
                error_bar(ax, r.d_dot * shift, r.ratio, r.ratio_low, high, kind, color,
                          fmt="o", ms=4, lw=1, label=None if j else f.name)
            law = f.laws[view]
            if law is not None and not math.isnan(law.b_low):
                grid = np.geomspace(lv["d_dot"].min(), lv["d_dot"].max(), 50)
                low, high = law.band(grid)
                ax.plot(grid, law.curve(grid) / grid, lw=1.2, color=color)
                ax.fill_between(grid, low / grid, high / grid, color=color, alpha=0.15, lw=0)
        ax.axhline(1.0, color="black", ls=":", lw=1)
        ax.set_xscale("log")
        ticks = _ticks(sorted(levels))
        ax.set_xticks(list(ticks), list(ticks.values()), fontsize=8)
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("d_dot (log)")
    finite = [v for v in drawn if np.isfinite(v)]
    span = max(finite) - min(finite)
    axes[0].set_ylim(min(finite) - 0.08 * span, max(finite) + 0.08 * span)
    axes[0].set_ylabel("failure point / d_dot")
    fig.suptitle("Failure point / d_dot per d_dot level, per view", fontsize=10)
    families = {h.get_label(): h for ax in axes for h in ax.get_legend_handles_labels()[0]}
    legend(axes[-1], list(families.values()) + [
        Line2D([], [], ls="none", marker="o", ms=3, alpha=0.5, color="grey",
               label="each seed that fails at a point"),
        Line2D([], [], ls="none", marker="o", ms=4, color="grey",
               label="marker: the level's median over those seeds"),
        *bar_handles(kinds),
        Line2D([], [], color="grey", lw=1.2, label="line and band: n* = a d_dot^b fitted to the\n"
                                                  "    level medians, its 95% t band"),
        Line2D([], [], color="black", ls=":", lw=1, label="1: n* = d_dot")])
    return save(fig, out_dir / "capacity_scaling.png")


def main(argv=None) -> None:
    """Print each scaling.csv's families, one sentence each."""
    parser = argparse.ArgumentParser(prog="python -m kernelzoo.analysis.scaling",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("scaling_csv", nargs="+", help="scaling.csv files of analysed stores")
    for path in parser.parse_args(argv).scaling_csv:
        try:
            rows = pd.read_csv(path)
        except (OSError, ValueError) as err:
            print(f"{path}: unreadable ({type(err).__name__}: {err})")
            continue
        print(f"{path}:" + (" no family with a failure point" if rows.empty else ""))
        for _, group in rows.groupby(["family", "view"], sort=False):
            print(f"  {sentence(group)}")


if __name__ == "__main__":
    main()
