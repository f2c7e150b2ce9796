"""Every verdict of one store as facts (verdicts.csv): one row per verdict, with a stable id, the
verdict kind, what it is about, the number it rests on with its interval, and its outcome from a
small closed vocabulary. report.md and README format these rows; nothing is parsed back from
prose. Pure: it reads no file.

Columns (``COLUMNS``): ``id`` (``<kind's word>.<subject>[.<view>][.<what>]``, stable across
analyses of the same store), ``kind`` (``KINDS``), ``subject`` (a configuration, family, design or pair of sizes),
``view``, ``size`` (d_dot, where the verdict is about one size), ``estimate``, ``low`` and
``high`` (its interval, at ``level``), ``against`` (what it is tested against: d_dot's ratio 1,
b = 1, the margin in keys, the authors' value), ``p`` (the test's p, where it has one), ``n``
(seeds, levels or families), ``outcome`` and ``calibration``: how the kind's known-truth
simulation came out for data like this (docs/analysis.md, "Calibration"): ``met``, ``not run``
(the data is of a kind the simulation leaves out: bounded levels), ``not harnessed`` (no
simulation yet: the outcome is the rule's, its error rate unmeasured) or ``missed``; a decisive
outcome of a missed kind reads ``uncalibrated``, its estimate and interval kept.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from kernelzoo.analysis import factorial, optimisation, published, scaling
from kernelzoo.analysis.capacity import VIEWS
from kernelzoo.analysis.tiers import ALPHA as TIERS_ALPHA, Placed

COLUMNS = ("id", "kind", "subject", "view", "size", "estimate", "low", "high", "level",
           "against", "p", "n", "outcome", "calibration")
# each verdict kind and the first part of its facts' ids
KINDS = {"n* <= d_dot": "paper_bound", "published comparison": "published", "d_dot law": "law",
         "tiers": "tier", "between sizes": "between_sizes", "optimisation": "optimisation",
         "factorial effects": "factorial", "stall clearance": "stall"}
# each kind's calibration where its data is like the simulation's (results/calibration.md;
# tests/test_verdicts.py holds it to the committed table)
CALIBRATION = {"n* <= d_dot": "not harnessed", "published comparison": "met", "d_dot law": "met",
               "tiers": "met", "between sizes": "not harnessed", "optimisation": "met",
               "factorial effects": "not harnessed", "stall clearance": "not harnessed"}
UNCALIBRATED = "uncalibrated"
UNDECIDED = ("cannot tell", "one seed", "one configuration")  # outcomes that decide nothing


def _fact(kind: str, subject: str, view: str = "", size=None, estimate=math.nan, low=math.nan,
          high=math.nan, level=math.nan, against=math.nan, p=math.nan, n=0, outcome: str = "",
          calibration: str | None = None, tag: str = "") -> dict:
    """One row of verdicts.csv (module docstring); ``calibration`` None: the kind's own."""
    calibration = calibration or CALIBRATION[kind]
    if calibration == "missed" and outcome not in UNDECIDED:
        outcome = UNCALIBRATED
    return {"id": ".".join(x for x in (KINDS[kind], subject, view, tag) if x),
            "kind": kind, "subject": subject, "view": view,
            "size": None if size is None or pd.isna(size) else int(size), "estimate": estimate,
            "low": low, "high": high, "level": level, "against": against, "p": p, "n": int(n),
            "outcome": outcome, "calibration": calibration}


def paper_bound(capacity: pd.DataFrame) -> list[dict]:
    """n* <= d_dot in the loss view, per configuration with a d_dot, from its median's interval
    [ci_low, ci_high] (a bound's open end at 0 or inf): ``below`` (the interval under d_dot),
    ``above`` (its lower end over d_dot), ``at`` (a failure point whose finite interval covers
    d_dot), else ``cannot tell`` (a bound, or seeds that disagree, allowing both sides)."""
    rows = capacity[capacity["predicted_capacity"].notna()
                    & ~capacity["outcome"].isin(("no_data", "not_searched"))]
    out = []
    for r in rows.itertuples():
        d = float(r.predicted_capacity)
        low, high = float(r.ci_low), float(r.ci_high)
        if low > d:
            word = "above"
        elif high < d:
            word = "below"
        elif r.outcome == "fails_at" and low > 0 and math.isfinite(high):
            word = "at"
        else:
            word = "cannot tell"
        out.append(_fact("n* <= d_dot", r.label, "loss", d, r.ratio, low / d, high / d,
                         r.ci_level, 1.0, n=r.n_seeds, outcome=word))
    return out


def published_comparison(capacity: pd.DataFrame, seeds: pd.DataFrame) -> list[dict]:
    """The authors' one run against one new seed's prediction interval (``published.compare``),
    per configuration they published, in the loss view."""
    out = []
    for r in capacity[capacity["published_outcome"].notna()].itertuples():
        c = published.compare(r.published_capacity, r.published_outcome,
                              seeds[seeds["label"] == r.label],
                              (r.published_last_pass, r.published_first_failure))
        out.append(_fact("published comparison", r.label, "loss", r.predicted_capacity,
                         r.observed_capacity, c.low, c.high, published.PREDICTION,
                         r.published_capacity, n=c.n, outcome=c.word))
    return out


def law(families, grid: bool) -> list[dict]:
    """Per family and view with a verdict: the exponent b of n* = a d_dot^b [95%] and its F
    test of n* = d_dot (``.b``), and n* / d_dot at the levels' centre with the equivalence
    interval "consistent" needs (``.ratio``). Calibration: ``missed`` on a grid's readings (a
    true n* = d_dot rejected in 59 of 100 simulated families), ``not run`` where a level's
    median is a bound (the simulation's bounded scenarios are too slow to run)."""
    out = []
    for f in families:
        found = scaling.table([f])
        for view in VIEWS:
            fit = found[found["view"] == view]
            if fit.empty or pd.isna(fit["verdict"].iloc[0]):
                continue
            r, fitted = fit.iloc[0], f.laws[view]
            calibration = "missed" if grid else \
                "not run" if fitted is not None and fitted.censored else None
            levels = int(r["n_d_dot"])
            out.append(_fact("d_dot law", f.name, view, None, r["b"], r["b_low"], r["b_high"],
                             0.95, 1.0, r["p_identity"], levels, r["verdict"], calibration,
                             "b"))
            if fitted is not None:
                ratio, low, high = scaling.centre_interval(fitted)
                out.append(_fact("d_dot law", f.name, view, None, ratio, low, high, 0.95, 1.0,
                                 n=levels, outcome=r["verdict"], calibration=calibration,
                                 tag="ratio"))
    return out


def tiers(placed: tuple[Placed, ...], n_seeds: pd.Series) -> list[dict]:
    """Each configuration's place per view and size (``tiers.tiers``): ``tier k`` (Tukey's HSD
    at ``tiers.ALPHA`` familywise), or apart with the reason (a bound, a seed is a bound, one
    seed, no spread)."""
    return [_fact("tiers", p.label, p.view, p.size, p.efficiency, p.low, p.high,
                  1 - TIERS_ALPHA, n=n_seeds.get(p.label, 0),
                  outcome=f"tier {p.tier}" if p.tier is not None else f"apart: {p.apart}")
            for p in placed]


def sizes(size_pairs) -> list[dict]:
    """Per pair of neighbouring sizes (``between_sizes.pairs``): each view's Spearman rho of the
    families' ranks (``.rho``), and each family its own efficiency change moved
    (``moved: <view> <falls|rises>``)."""
    out = []
    for p in size_pairs:
        pair = f"{p.small}-{p.large}"
        for view, (rho, n) in p.rho.items():
            out.append(_fact("between sizes", pair, view, estimate=rho, n=n,
                             outcome="rank correlation", tag="rho"))
        for name, moved in p.moved.items():
            for words in moved:
                view_words, _, change = words.rpartition(" ")
                out.append(_fact("between sizes", f"{pair}.{name}", view_words, n=2,
                                 outcome=f"moved by its own change: {change}"))
    return out


def moves(tables) -> list[dict]:
    """Per setting, configuration and view (``optimisation.tables``): the level whose lower
    bound is highest (its difference and that bound) and the largest upper bound over the
    levels (``high``), the margin in keys, the verdict; on a grid's readings ``missed`` (a
    20-key grid read a rise of the margin as "beyond" in 24% of simulated studies)."""
    out = []
    for setting, found in tables:
        for r in found.itertuples():
            tested = [(d, low) for _, d, low, _ in r.differences]
            d, low = max(tested, key=lambda t: -math.inf if math.isnan(t[1]) else t[1])
            out.append(_fact("optimisation", r.label, r.view, None, d, low, r.decided_at,
                             1 - optimisation.ALPHA, r.margin, n=min(r.n), outcome=r.verdict,
                             calibration="missed" if r.grid else None,
                             tag=setting.keys[0]))
    return out


def effects(table: pd.DataFrame) -> list[dict]:
    """Each factorial effect (``factorial.table``): its ratio on the failure point [95%];
    ``raises`` or ``lowers`` where the interval excludes 1, ``cannot tell`` otherwise."""
    out = []
    for r in table.itertuples():
        word = ("raises" if r.ci_low > 1 else "lowers" if r.ci_high < 1 else "cannot tell") \
            if np.isfinite([r.ci_low, r.ci_high]).all() else "cannot tell"
        out.append(_fact("factorial effects", f"{r.design}.{r.effect}", r.view, None, r.ratio,
                         r.ci_low, r.ci_high, factorial.LEVEL, 1.0, n=r.seeds, outcome=word))
    return out


def clearances(checked: pd.DataFrame) -> list[dict]:
    """Each stalled run with a check (``stalls.check_outcomes``), loss view: ``cleared`` (it
    failed the view and its check passes), ``still fails``, or ``passed before its check``."""
    return [_fact("stall clearance", f"{r.label}.seed{r.seed}.{r.n_keys}", "loss", n=1,
                  estimate=r.final_eval_loss,
                  outcome="cleared" if r.clears_loss else "still fails" if r.fails_loss
                  else "passed before its check") for r in checked.itertuples()]


def facts(capacity: pd.DataFrame, seeds: pd.DataFrame, families, placed, size_pairs, tables,
          effect_table: pd.DataFrame, checked: pd.DataFrame, grid: bool) -> pd.DataFrame:
    """verdicts.csv: every kind's facts (module docstring), in KINDS order; ``grid``: the
    failure points are read on a grid's probes (not a search's)."""
    if capacity.empty:
        return pd.DataFrame(columns=list(COLUMNS))
    n_seeds = capacity.set_index("label")["n_seeds"]
    rows = (paper_bound(capacity) + published_comparison(capacity, seeds) + law(families, grid)
            + tiers(placed, n_seeds) + sizes(size_pairs) + moves(tables)
            + (effects(effect_table) if len(effect_table) else [])
            + clearances(checked))
    out = pd.DataFrame(rows, columns=list(COLUMNS))
    out["size"] = out["size"].astype("Int64")
    return out

