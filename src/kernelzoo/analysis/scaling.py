"""The d_dot law with intervals: does a family's failure point follow d_dot, in each view of
capacity (``capacity.py``), and how tightly?

A family is a configuration without what d_dot decides: the same feature_map, update_rule and
parameters but the one the map resolves from d_dot (``labels.sizing_param``: DPFP's nu, FAVOR+'s
m, ...), and the same d_key where the map keeps it, and the same setting where a configuration
was split by one (``settings.split``: tanh under memory.normalisation=none is its own family). A
map without such a parameter sets d_key from d_dot (ELU+1: d_key = d_dot), so its d_key is left
out too.

Its rule is stated once, in docs/analysis.md ("Does capacity follow d_dot?").

``table`` is ``scaling.csv`` (one row per family, view and d_dot); report.md's section and its
words are ``report.scaling``, the figure ``report.figures.capacity_scaling``. Per configuration
the same ratio is its capacity efficiency (``efficiency.py``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from kernelzoo.analysis import censored, power
from kernelzoo.analysis.capacity import POINTS, SUFFIX, VIEWS
from kernelzoo.analysis.labels import (canonical_params, format_value, map_label, natural_key,
                                       sizing_param)

MIN_D_DOTS = censored.MIN_POINTS
COLUMNS = ("family", "view", "feature_map", "params", "d_key", "update_rule", "n_points",
           "n_d_dot", "a", "a_low", "a_high", "b", "b_low", "b_high", "p_identity",
           "follows_d_dot", "n_censored", "power", "verdict", "d_dot", "configurations",
           "n_seeds", "n_bounds", "ratio", "ratio_lowest", "ratio_highest", "ratio_low",
           "ratio_high", "ratio_level")
VERDICTS = ("rejected", "consistent", "cannot tell")


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
        """The view's seeds whose failure point is a point (fails_at, plateau), with ``value``
        it."""
        s = SUFFIX[view]
        hit = self.points[self.points[f"outcome{s}"].isin(POINTS)]
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


def verdict(law: censored.CensoredLaw | None, n_points: int) -> str:
    """The law's word (VERDICTS) from its test and the levels whose median is a point: "cannot
    tell" without a test; "rejected" when the joint test rejects n* = d_dot; "consistent" only
    when it does not and the ratio n* / d_dot at the levels' centre is shown within (RATIO,
    1 / RATIO) (an equivalence test: its 95% interval inside), else "cannot tell"."""
    if law is None or n_points < censored.MIN_POINTS or pd.isna(law.p_identity):
        return VERDICTS[2]
    if law.p_identity < censored.REJECT:
        return VERDICTS[0]
    _, low, high = centre_interval(law)
    return VERDICTS[1] if power.RATIO < low and high < 1 / power.RATIO else VERDICTS[2]


def centre_interval(law: censored.CensoredLaw) -> tuple[float, float, float]:
    """n* / d_dot at the levels' centre with its 95% t interval (each end a one-sided 2.5%
    test: the equivalence test ``verdict`` reads)."""
    half = law.t * math.sqrt(max(law.cov[0][0], 0.0))
    return law.ratio_centre, law.ratio_centre * math.exp(-half), law.ratio_centre * math.exp(half)


def _keys(runs: pd.DataFrame) -> tuple[dict, dict]:
    """(label -> family key, family key -> its parameters) for the configurations with a bounded
    d_dot; a key is (feature_map, canonical params, d_key or None, update_rule, setting)."""
    keys, params = {}, {}
    for r in runs.drop_duplicates("label").dropna(subset=["d_dot"]).itertuples():
        sized = sizing_param(r.feature_map)
        rest = {k: v for k, v in json.loads(r.feature_map_params).items() if k != sized}
        key = (r.feature_map, canonical_params(rest), int(r.d_key) if sized else None,
               r.update_rule, getattr(r, "setting", ""))
        keys[r.label], params[key] = key, rest
    return keys, params


def _name(key: tuple, params: dict, rules: bool) -> str:
    """A family's name: the map, its parameters that vary among the map's families (as in the
    configuration labels), d_key where the map keeps it, the update rule where several ran, the
    setting a configuration was split by."""
    fmap, _, d_key, rule, setting = key
    dicts = [p for k, p in params.items() if k[0] == fmap]
    head, named = map_label(fmap, params[key])  # without the sizing parameter: "DPFP"
    shown = [k for k in sorted(params[key]) if k not in named
             and len({json.dumps(d.get(k)) for d in dicts}) > 1]
    parts = [head]
    parts += [v if isinstance(v, str) else f"{k}={format_value(v)}"
              for k, v in ((k, params[key][k]) for k in shown)]
    return " ".join(parts + ([f"d_key={d_key}"] if d_key is not None else [])
                    + ([rule] if rules else []) + ([setting] if setting else []))


def families(runs: pd.DataFrame, seeds: pd.DataFrame) -> list[Family]:
    """Every family with a failure point that is a point (fails_at, plateau) in some view
    (``runs``: ``runs.load_runs``; ``seeds``: ``capacity.seed_table``), in natural order of
    name, its laws where they qualify."""
    keys, params = _keys(runs)
    d_dots = runs.drop_duplicates("label").set_index("label")["d_dot"]
    points = seeds[seeds["label"].isin(keys)]
    points = points.assign(d_dot=points["label"].map(d_dots).astype(int),
                           key=points["label"].map(keys))
    rules = runs["update_rule"].nunique() > 1
    found = []
    for key, group in points.groupby("key", sort=False):
        group = group.sort_values(["d_dot", "seed"]).reset_index(drop=True)
        if not any(group[f"outcome{SUFFIX[v]}"].isin(POINTS).any() for v in VIEWS):
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
                   "verdict": verdict(law, points) if len(levels) >= MIN_D_DOTS else None}
            rows += [{**fit, **d} for d in levels.to_dict("records")]
    out = pd.DataFrame(rows, columns=list(COLUMNS))
    out["d_key"] = out["d_key"].astype("Int64")
    return out
