"""The d_dot law with intervals (issue #13): does the observed failure point follow d_dot, and
how tightly, with seeds? Per family, n* = a d_dot^b fitted over its seeds' failure points.

A family is a configuration without what d_dot decides: the same feature_map, update_rule and
parameters but the one the map resolves from d_dot (``style.D_DOT_PARAMS``: DPFP's nu, FAVOR+'s
m, ...), and the same d_key where the map keeps it. A map without such a parameter sets d_key
from d_dot (ELU+1: d_key = d_dot), so its d_key is left out too.

Fit (``power_law``): least squares of log n* on log d_dot over every seed whose loss criterion
outcome is fails_at (``capacity.seed_table``, stalls set aside); bounds (never_fails,
fails_everywhere) are left out and counted. Only families with such points at ``MIN_D_DOTS`` or
more distinct d_dot values are fitted. a = exp(intercept), b = the slope.

Interval: 95% percentile bootstrap, ``capacity.BOOTSTRAP_SAMPLES`` resamples (RNG seed 0) of the
seeds within each d_dot. The d_dot values are the experiment's design and the seeds its
replicates, so every resample keeps each d_dot with its number of points and redraws which
seeds' failure points sit there; resampling (d_dot, seed) points instead would draw resamples
with fewer d_dot values, some with one and no slope at all. A d_dot with one point adds no
spread; with one point at every d_dot there is no interval. With k seeds per d_dot the
resampled spread is sqrt((k - 1) / k) of the seeds' (0.89 at k = 5), so the interval is a little
narrow: on simulated studies of 5 seeds at each of 5 d_dot values (log-normal noise) it covers
the true b in about 88% of them (3 seeds: 82%). A family follows d_dot when b = 1 lies in b's
interval.

Departures: per d_dot, ``ratio`` = failure point / d_dot, the median over its seeds' points.

``table`` is ``scaling.csv`` (one row per family and d_dot), ``section`` report.md's section,
``figure`` the figure ``capacity_scaling``. Each analysed store's answers, one line per family:

    python -m kernelzoo.scaling results/reference/*/scaling.csv
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

from kernelzoo.capacity import BOOTSTRAP_SAMPLES, OUTCOMES
from kernelzoo.style import (BASE_LABELS, D_DOT_PARAMS, canonical_params, config_colors,
                             format_value, legend, log_square, natural_key, save)

MIN_D_DOTS = 3
COLUMNS = ("family", "feature_map", "params", "d_key", "update_rule", "n_points", "n_d_dot",
           "a", "a_low", "a_high", "b", "b_low", "b_high", "follows_d_dot",
           "d_dot", "configurations", "n_seeds", "n_bounds", "ratio")
METHOD = (
    "Per family (a configuration without what d_dot decides: the parameter the map resolves "
    "from d_dot, DPFP's nu or FAVOR+'s m, and d_key where the map sets d_key from d_dot), least "
    "squares of log n* on log d_dot over every seed that fails at a point, for families with such "
    f"points at {MIN_D_DOTS} or more d_dot values; bounds are left out.\n"
    f"Interval: 95% percentile bootstrap, {BOOTSTRAP_SAMPLES} resamples (RNG seed 0) of the seeds "
    "within each d_dot (d_dot is the design, seeds its replicates); a family follows d_dot when "
    "b = 1 lies in b's interval. Rows per family and d_dot: `scaling.csv`.")


@dataclass(frozen=True)
class Law:
    """n* = a d_dot^b by least squares in log-log, its 95% intervals (NaN: none) and the
    resampled (log a, b) pairs they come from."""

    a: float
    b: float
    a_low: float
    a_high: float
    b_low: float
    b_high: float
    draws: np.ndarray = field(repr=False, compare=False)  # (samples, 2): log a, b

    @property
    def follows(self) -> bool | None:
        """True when b = 1 lies in b's interval; None without an interval."""
        return None if math.isnan(self.b_low) else bool(self.b_low <= 1 <= self.b_high)

    def band(self, d_dot) -> tuple[np.ndarray, np.ndarray]:
        """The 95% percentile band of the resampled laws at ``d_dot``."""
        curves = self.draws[:, :1] + self.draws[:, 1:] * np.log(np.asarray(d_dot, float))
        low, high = np.exp(np.percentile(curves, [2.5, 97.5], axis=0))
        return low, high


def power_law(d_dot, observed, samples: int = BOOTSTRAP_SAMPLES) -> Law:
    """The fit and interval of the module docstring over the points (d_dot[i], observed[i]),
    which lie at two or more distinct d_dot values."""
    x, y = np.log(np.asarray(d_dot, float)), np.log(np.asarray(observed, float))
    order = np.argsort(x, kind="stable")
    x, y = x[order], y[order]
    centred = x - x.mean()
    slope = centred / (centred @ centred)  # b = slope @ y for any y at these x
    _, starts, counts = np.unique(x, return_index=True, return_counts=True)
    rng = np.random.default_rng(0)
    index = np.concatenate([start + rng.integers(0, count, (samples, count))
                            for start, count in zip(starts, counts)], axis=1)
    resampled = y[index]  # each row: the same x, seeds redrawn within each d_dot
    b = resampled @ slope
    draws = np.column_stack([resampled.mean(axis=1) - b * x.mean(), b])
    low, high = (np.percentile(draws, [2.5, 97.5], axis=0) if counts.max() > 1
                 else np.full((2, 2), math.nan))
    fit_b = float(y @ slope)
    return Law(math.exp(y.mean() - fit_b * x.mean()), fit_b, math.exp(low[0]),
               math.exp(high[0]), float(low[1]), float(high[1]), draws)


@dataclass(frozen=True)
class Family:
    """One family: its configurations' seeds with a result (``points``: label, d_dot, seed,
    outcome, value) and its law (None: points at fewer than MIN_D_DOTS d_dot values)."""

    name: str
    feature_map: str
    params: str        # canonical, without the parameter resolved from d_dot
    d_key: int | None  # None: the map sets d_key from d_dot
    update_rule: str
    points: pd.DataFrame = field(repr=False, compare=False)
    law: Law | None

    def fitted(self) -> pd.DataFrame:
        """The points the law is fitted over: the seeds that fail at a point."""
        return self.points[self.points["outcome"] == "fails_at"]

    def departures(self) -> pd.DataFrame:
        """Per d_dot: its configurations, seeds with a point (n_seeds) and with a bound
        (n_bounds), ratio = median over the points of failure point / d_dot."""
        rows = []
        for d_dot, group in self.points.groupby("d_dot"):
            hit = group[group["outcome"] == "fails_at"]
            rows.append({"d_dot": int(d_dot),
                         "configurations": "; ".join(sorted(set(group["label"]), key=natural_key)),
                         "n_seeds": len(hit), "n_bounds": len(group) - len(hit),
                         "ratio": float(np.median(hit["value"] / d_dot)) if len(hit) else math.nan})
        return pd.DataFrame(rows)

    def words(self) -> str:
        """The answer in one sentence (``sentence`` of its scaling.csv rows)."""
        return sentence(table([self]))


def _keys(runs: pd.DataFrame) -> tuple[dict, dict]:
    """(label -> family key, family key -> its parameters) for the configurations with a bounded
    d_dot; a key is (feature_map, canonical params, d_key or None, update_rule)."""
    keys, params = {}, {}
    for r in runs.drop_duplicates("label").dropna(subset=["d_dot"]).itertuples():
        sized = D_DOT_PARAMS.get(r.feature_map, ())
        rest = {k: v for k, v in json.loads(r.feature_map_params).items() if k not in sized}
        key = (r.feature_map, canonical_params(rest), int(r.d_key) if sized else None,
               r.update_rule)
        keys[r.label], params[key] = key, rest
    return keys, params


def _name(key: tuple, params: dict, rules: bool) -> str:
    """A family's name: the map, its parameters that vary among the map's families (as in the
    configuration labels), d_key where the map keeps it, the update rule where several ran."""
    fmap, _, d_key, rule = key
    dicts = [p for k, p in params.items() if k[0] == fmap]
    shown = [k for k in sorted(params[key]) if len({json.dumps(d.get(k)) for d in dicts}) > 1]
    parts = [BASE_LABELS.get(fmap, fmap)]
    parts += [v if isinstance(v, str) else f"{k}={format_value(v)}"
              for k, v in ((k, params[key][k]) for k in shown)]
    return " ".join(parts + ([f"d_key={d_key}"] if d_key is not None else [])
                    + ([rule] if rules else []))


def families(runs: pd.DataFrame, seeds: pd.DataFrame) -> list[Family]:
    """Every family with a failure point (``runs``: ``analyze.load_runs``; ``seeds``:
    ``capacity.seed_table``), in natural order of name, fitted where it qualifies."""
    keys, params = _keys(runs)
    d_dots = runs.drop_duplicates("label").set_index("label")["d_dot"]
    points = seeds[seeds["label"].isin(keys) & seeds["outcome"].isin(OUTCOMES)]
    points = points.assign(d_dot=points["label"].map(d_dots).astype(int),
                           key=points["label"].map(keys))
    rules = runs["update_rule"].nunique() > 1
    found = []
    for key, group in points.groupby("key", sort=False):
        group = group.sort_values(["d_dot", "seed"])[["label", "d_dot", "seed", "outcome", "value"]]
        hit = group[group["outcome"] == "fails_at"]
        if hit.empty:
            continue
        law = (power_law(hit["d_dot"], hit["value"]) if hit["d_dot"].nunique() >= MIN_D_DOTS
               else None)
        found.append(Family(_name(key, params, rules), key[0], key[1], key[2], key[3],
                            group.reset_index(drop=True), law))
    return sorted(found, key=lambda f: natural_key(f.name))


def table(found: list[Family]) -> pd.DataFrame:
    """``scaling.csv``: one row per family and d_dot with a result, the family's fit (blank when
    not fitted) repeated on each of its rows; columns COLUMNS."""
    rows = []
    for f in found:
        law = f.law
        fit = {"family": f.name, "feature_map": f.feature_map, "params": f.params,
               "d_key": f.d_key, "update_rule": f.update_rule, "n_points": len(f.fitted()),
               "n_d_dot": f.fitted()["d_dot"].nunique(),
               **({k: getattr(law, k) for k in ("a", "a_low", "a_high", "b", "b_low", "b_high")}
                  if law else {}), "follows_d_dot": law.follows if law else None}
        rows += [{**fit, **d} for d in f.departures().to_dict("records")]
    out = pd.DataFrame(rows, columns=list(COLUMNS))
    out["d_key"] = out["d_key"].astype("Int64")
    return out


def sentence(rows: pd.DataFrame) -> str:
    """One family's answer from its rows of ``table`` (or of a scaling.csv read back)."""
    r = rows.iloc[0]
    ratios = ", ".join(f"{x.ratio:.2f} at d_dot {x.d_dot}" for x in rows.itertuples()
                       if x.n_seeds > 0)
    at = f"failure point / d_dot {ratios} (median over seeds)"
    if pd.isna(r.b):
        return (f"{r.family}: not fitted, failure points at {r.n_d_dot} d_dot value"
                f"{'' if r.n_d_dot == 1 else 's'} (fewer than {MIN_D_DOTS}); {at}.")
    law = f"n* = {r.a:.3g} d_dot^{r.b:.3f} over {r.n_points} failure points"
    if pd.isna(r.b_low):
        return f"{r.family}: {law}, no interval (one seed per d_dot); {at}."
    interval = f"b in [{r.b_low:.3f}, {r.b_high:.3f}]"
    if r.b_low <= 1 <= r.b_high:
        return f"{r.family}: {law}; {interval} contains 1: it follows d_dot; {at}."
    pace = "slower" if r.b_high < 1 else "faster"
    return f"{r.family}: {law}; {interval} excludes 1: it grows {pace} than d_dot; {at}."


def _ci(value, low, high, spec: str) -> str:
    """"0.9 [0.8, 1]": a value with its interval, or alone without one."""
    return (f"{value:{spec}}" if math.isnan(low) else
            f"{value:{spec}} [{low:{spec}}, {high:{spec}}]")


def section(found: list[Family]) -> list[str]:
    """report.md's section on the fitted families ([] when none is)."""
    fitted = [f for f in found if f.law]
    if not fitted:
        return []
    lines = ["## Capacity against d_dot: n* = a d_dot^b per family", "", *METHOD.split("\n"), "",
             "| family | points | d_dot | a [95%] | b [95%] | follows d_dot | failure point / "
             "d_dot (median over seeds; bounds left out) |", "|---|---|---|---|---|---|---|"]
    for f in fitted:
        law, rows = f.law, f.departures()
        ratios = "; ".join(f"{r.d_dot}: " + ("–" if r.n_seeds == 0 else f"{r.ratio:.2f}")
                           + (f" ({r.n_bounds} bound{'' if r.n_bounds == 1 else 's'})"
                              if r.n_bounds else "") for r in rows.itertuples())
        follows = {True: "yes", False: "no", None: "no interval"}[law.follows]
        lines.append(f"| {f.name} | {len(f.fitted())} | {rows['d_dot'].min()}–"
                     f"{rows['d_dot'].max()} | {_ci(law.a, law.a_low, law.a_high, '.3g')} | "
                     f"{_ci(law.b, law.b_low, law.b_high, '.3f')} | {follows} | {ratios} |")
    lines += ["", *(f"- {f.words()}" for f in found)]
    return lines + [""]


def figure(found: list[Family], out_dir: Path) -> Path:
    """``capacity_scaling``: log-log, per fitted family its seeds' failure points against d_dot
    (spread sideways by seed, a few percent), the fitted law with its 95% band, and y = x
    (dotted)."""
    fitted = [f for f in found if f.law]
    colors = config_colors([f.name for f in fitted])
    fig = Figure(figsize=(8, 5.5))
    ax = fig.add_subplot()
    span = []
    for f in fitted:
        points, law, color = f.fitted(), f.law, colors[f.name]
        rank = points.groupby("d_dot").cumcount()
        count = points.groupby("d_dot")["d_dot"].transform("size")
        ax.scatter(points["d_dot"] * 2.0 ** (0.04 * (rank - (count - 1) / 2)), points["value"],
                   s=14, alpha=0.75, linewidths=0, color=color)
        grid = np.geomspace(points["d_dot"].min(), points["d_dot"].max(), 60)
        ax.plot(grid, law.a * grid ** law.b, color=color, lw=1.5,
                label=f"{f.name}: b = {_ci(law.b, law.b_low, law.b_high, '.3f')}"
                + (" (no interval: one seed per d_dot)" if law.follows is None else ""))
        if law.follows is not None:
            ax.fill_between(grid, *law.band(grid), color=color, alpha=0.2, lw=0)
        span += [points["d_dot"].astype(float), points["value"]]
    log_square(ax, pd.concat(span))
    ax.set_xlabel("d_dot (log)")
    ax.set_ylabel("failure point n* (log), one point per seed")
    ax.set_title("Failure point against d_dot per family: n* = a d_dot^b by least squares,\n"
                 "band: 95% bootstrap over seeds; dotted: y = x (n* = d_dot)", fontsize=10)
    legend(ax)
    return save(fig, out_dir / "capacity_scaling.png")


def main(argv=None) -> None:
    """Print each scaling.csv's families, one sentence each."""
    parser = argparse.ArgumentParser(prog="python -m kernelzoo.scaling",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("scaling_csv", nargs="+", help="scaling.csv files of analysed stores")
    for path in parser.parse_args(argv).scaling_csv:
        try:
            rows = pd.read_csv(path)
        except (OSError, ValueError) as err:
            print(f"{path}: unreadable ({type(err).__name__}: {err})")
            continue
        print(f"{path}:" + (" no family with a failure point" if rows.empty else ""))
        for _, group in rows.groupby("family", sort=False):
            print(f"  {sentence(group)}")


if __name__ == "__main__":
    main()
