"""The d_dot law with intervals: does a family's failure point follow d_dot, in each view of
capacity (``capacity.py``), and how tightly?

A family is a configuration without what d_dot decides: the same feature_map, update_rule and
parameters but the one the map resolves from d_dot (``labels.sizing_param``: DPFP's nu, FAVOR+'s
m, ...), and the same d_key where the map keeps it. A map without such a parameter sets d_key
from d_dot (ELU+1: d_key = d_dot), so its d_key is left out too.

Its rule is stated once, in docs/analysis.md ("Does capacity follow d_dot?").

``table`` is ``scaling.csv`` (one row per family, view and d_dot), ``section`` report.md's
section (the figure is ``report.figures.capacity_scaling``). Per configuration the same ratio is its
capacity efficiency (``efficiency.py``). Each analysed store's answers:

    python -m kernelzoo.analysis.scaling results/reference/*/scaling.csv
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field

import pandas as pd

from kernelzoo.analysis.capacity import SUFFIX, VIEW_WORDS, VIEWS
from kernelzoo.analysis.intervals import MIN_LEVELS, LevelLaw, level_law, median_interval
from kernelzoo.analysis.labels import (canonical_params, format_value, map_label, natural_key,
                                       sizing_param)


MIN_D_DOTS = MIN_LEVELS
COLUMNS = ("family", "view", "feature_map", "params", "d_key", "update_rule", "n_points",
           "n_d_dot", "a", "a_low", "a_high", "b", "b_low", "b_high", "p_identity",
           "follows_d_dot", "d_dot", "configurations", "n_seeds", "n_bounds", "ratio",
           "ratio_low", "ratio_high", "ratio_level")


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
    laws: dict = field(compare=False)  # view -> LevelLaw | None

    def fitted(self, view: str) -> pd.DataFrame:
        """The view's seeds that fail at a point, with ``value`` their failure point."""
        s = SUFFIX[view]
        hit = self.points[self.points[f"outcome{s}"] == "fails_at"]
        return hit.assign(value=hit[f"value{s}"])

    def departures(self, view: str) -> pd.DataFrame:
        """Per d_dot: its configurations, seeds with a point and with a bound, and the ratio
        failure point / d_dot with its interval over seeds."""
        s, rows = SUFFIX[view], []
        for d_dot, group in self.points.groupby("d_dot"):
            hit = group[group[f"outcome{s}"] == "fails_at"]
            ratio, low, high, level = median_interval(hit[f"value{s}"] / d_dot)
            rows.append({"d_dot": int(d_dot),
                         "configurations": "; ".join(sorted(set(group["label"]), key=natural_key)),
                         "n_seeds": len(hit), "n_bounds": int((group[f"outcome{s}"] != "no_data")
                                                              .sum()) - len(hit),
                         "ratio": ratio, "ratio_low": low, "ratio_high": high,
                         "ratio_level": level})
        return pd.DataFrame(rows)


def _law(levels: pd.DataFrame) -> LevelLaw | None:
    hit = levels[levels["n_seeds"] > 0]
    if len(hit) < MIN_D_DOTS:
        return None
    return level_law(hit["d_dot"], hit["ratio"] * hit["d_dot"])


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
        found.append(family)
    return sorted(found, key=lambda f: natural_key(f.name))


def table(found: list[Family]) -> pd.DataFrame:
    """``scaling.csv``: one row per family, view and d_dot, the family's law in that view
    (blank when not fitted) repeated on each of its rows; columns COLUMNS."""
    rows = []
    for f in found:
        for view in VIEWS:
            law = f.laws[view]
            fit = {"family": f.name, "view": view, "feature_map": f.feature_map,
                   "params": f.params, "d_key": f.d_key, "update_rule": f.update_rule,
                   "n_points": len(f.fitted(view)), "n_d_dot": f.fitted(view)["d_dot"].nunique(),
                   **({k: getattr(law, k) for k in ("a", "a_low", "a_high", "b", "b_low",
                                                    "b_high", "p_identity")} if law else {}),
                   "follows_d_dot": law.follows if law else None}
            rows += [{**fit, **d} for d in f.departures(view).to_dict("records")]
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


def _level(r) -> str:
    """One level's ratio: "64: 0.91 [0.84, 0.97] (94%)"."""
    if not r.n_seeds:
        return f"{r.d_dot}: –"
    if pd.isna(r.ratio_level):  # one seed: no interval
        return f"{r.d_dot}: {r.ratio:.2f} (one seed)"
    return f"{r.d_dot}: {_ci(r.ratio, r.ratio_low, r.ratio_high, '.2f')} ({r.ratio_level:.0%})"


def sentence(rows: pd.DataFrame) -> str:
    """One family's answer in one view from its rows of ``table`` (or a scaling.csv read back)."""
    r = rows.iloc[0]
    ratios = "; ".join(_level(x) for x in rows.itertuples())
    at = f"failure point / d_dot per level (median over seeds [interval] (its level)): {ratios}"
    name = f"{r.family} ({VIEW_WORDS[r.view]} view)"
    if pd.isna(r.b):
        return (f"{name}: not fitted, failure points at {r.n_d_dot} d_dot level"
                f"{'' if r.n_d_dot == 1 else 's'} (fewer than {MIN_D_DOTS}); {at}.")
    law = (f"n* = {_ci(r.a, r.a_low, r.a_high, '.3g')} d_dot^{_ci(r.b, r.b_low, r.b_high, '.3f')}"
           f" over {r.n_d_dot} levels")
    outside = [str(x.d_dot) for x in rows.itertuples()
               if x.n_seeds and pd.notna(x.ratio_level) and not x.ratio_low <= 1 <= x.ratio_high]
    verdict = ("consistent with n* = d_dot" if r.p_identity >= 0.05
               else "n* = d_dot rejected at 5%")
    return (f"{name}: {law}; n* = d_dot: F test {_p(r.p_identity)}, {verdict}"
            + (f" (ratio interval excludes 1 at d_dot {', '.join(outside)})" if outside else "")
            + f"; {at}.")


def section(found: list[Family]) -> list[str]:
    """report.md's section on the d_dot law ([] when no family has two levels)."""
    shown = [f for f in found if f.points["d_dot"].nunique() >= 2]
    if not shown:
        return []
    lines = ["## Capacity against d_dot, per view", "",
             "| family | view | levels | a [95%] | b [95%] | consistent with n* = d_dot (F test p) | "
             "failure point / d_dot per level |", "|---|---|---|---|---|---|---|"]
    rows = table(shown)
    for (_, view), group in rows.groupby(["family", "view"], sort=False):
        r = group.iloc[0]
        fitted = not pd.isna(r.b)
        test = (f"{'yes' if r.follows_d_dot else 'no'} ({_p(r.p_identity)})" if fitted
                else "not fitted")
        lines.append(f"| {r.family} | {VIEW_WORDS[view]} | {r.n_d_dot} | "
                     + (f"{_ci(r.a, r.a_low, r.a_high, '.3g')} | "
                        f"{_ci(r.b, r.b_low, r.b_high, '.3f')}" if fitted else "– | –")
                     + f" | {test} | " + "; ".join(_level(x) for x in group.itertuples()) + " |")
    return lines + [""]


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
