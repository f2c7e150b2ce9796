"""Factorial effects: what each change of a map's settings does to its failure point, alone and
in combination (the ``favor_diagnosis`` design). Pure: it reads no file.

Its rule is stated once, in docs/analysis.md ("Factorial effects").
"""

from __future__ import annotations

import functools
import itertools
import math
from collections import Counter
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

from kernelzoo.analysis.capacity import SUFFIX, VIEWS
from kernelzoo.analysis.labels import natural_key

LEVEL = 0.95
GROUP_KEYS = ("feature_map", "d_key", "d_dot", "update_rule", "lr")
BOUNDS = ("never_fails", "fails_everywhere")


@dataclass(frozen=True)
class Design:
    """A 2^k factorial: its ``factors`` (name, (low, high)) and per cell (a tuple of 0/1 per
    factor) the configuration's label."""

    title: str
    factors: tuple[tuple[str, tuple[str, str]], ...]
    cells: dict[tuple[int, ...], str]


def parse_params(params: str) -> dict[str, str]:
    """``capacity.params`` ("k=v,k=v") as a dict."""
    return dict(item.split("=", 1) for item in params.split(",") if "=" in item) \
        if isinstance(params, str) else {}


def _group_design(title: str, configs: pd.DataFrame) -> Design | None:
    params = [parse_params(p) for p in configs["params"]]
    keys = sorted({k for p in params for k in p})
    levels = {k: Counter(p.get(k, "-") for p in params) for k in keys}
    chosen = {k: tuple(sorted((v for v, _ in c.most_common(2)), key=natural_key))
              for k, c in levels.items() if len(c) >= 2}
    rows = [i for i, p in enumerate(params)
            if all(p.get(k, "-") in two for k, two in chosen.items())]
    factors, patterns = [], set()
    for k in sorted(chosen, key=lambda k: (any(k not in params[i] for i in rows), k)):
        pattern = tuple(params[i].get(k, "-") == chosen[k][1] for i in rows)
        if pattern in patterns or tuple(not x for x in pattern) in patterns:
            continue  # the same split of the configurations as a factor already kept
        patterns.add(pattern)
        factors.append(k)
    if len(factors) < 2:
        return None
    cells = {}
    for i in rows:
        cell = tuple(int(params[i].get(k, "-") == chosen[k][1]) for k in factors)
        if cell in cells:
            return None  # two configurations in one cell: the parameters left out differ
        cells[cell] = configs["label"].iloc[i]
    if len(cells) != 2 ** len(factors):
        return None
    return Design(title, tuple((k, chosen[k]) for k in factors), cells)


def designs(capacity: pd.DataFrame) -> list[Design]:
    """The 2^k factorials among ``capacity``'s configurations (module docstring)."""
    found = []
    for key, group in capacity.groupby(list(GROUP_KEYS), dropna=False, sort=True):
        if len(group) < 4:
            continue
        fmap, d_key, d_dot = key[0], key[1], key[2]
        title = f"{fmap} d_key={d_key}" + ("" if pd.isna(d_dot) else f" d_dot={int(d_dot)}")
        design = _group_design(title, group.reset_index(drop=True))
        if design is not None:
            found.append(design)
    return found


def contrast_names(k: int) -> list[tuple[int, ...]]:
    """Every non-empty subset of the k factors, main effects first."""
    return [s for r in range(1, k + 1) for s in itertools.combinations(range(k), r)]


@functools.cache
def _t(level: float, dof: int) -> float:
    return float(stats.t.ppf(0.5 + level / 2, dof))


def estimate(cells: list[tuple[int, ...]], y: list[np.ndarray], level: float = LEVEL):
    """(effect, low, high) per contrast of ``contrast_names`` on the log scale, from the values
    ``y[i]`` of cell ``cells[i]``; NaN intervals without residual degrees of freedom."""
    k = len(cells[0])
    means = np.array([v.mean() for v in y])
    n = np.array([len(v) for v in y], float)
    dof = int(n.sum() - len(cells))
    s = math.sqrt(sum(((v - v.mean()) ** 2).sum() for v in y) / dof) if dof > 0 else math.nan
    t = _t(level, dof) if dof > 0 else math.nan
    out = []
    for subset in contrast_names(k):
        c = np.array([np.prod([2 * cell[j] - 1 for j in subset]) for cell in cells], float)
        c /= 2 ** (k - 1)
        e = float(c @ means)
        half = t * s * math.sqrt(float((c ** 2 / n).sum()))
        out.append((e, e - half, e + half))
    return out


def _log_values(design: Design, seeds: pd.DataFrame, view: str) -> tuple[list, int]:
    """(ln n* of each cell's seeds in ``view``, cell by cell as ``design.cells``, the count of
    those values that are bounds)."""
    s, y, bounds = SUFFIX[view], [], 0
    for cell in design.cells:
        mine = seeds[(seeds["label"] == design.cells[cell]) & seeds[f"value{s}"].notna()]
        y.append(np.log(np.maximum(mine[f"value{s}"].to_numpy(float), 1e-9)))
        bounds += int(mine[f"outcome{s}"].isin(BOUNDS).sum())
    return y, bounds


@dataclass(frozen=True)
class SimpleEffect:
    """One factor's effect at one level of another with which it interacts: the ratio on the
    failure point, its 95% interval, and the interaction that called for it."""

    design: str
    view: str
    factor: str
    change: str        # "1 -> performer"
    at: str            # the other factor at one level: "redraw=every_call"
    ratio: float
    low: float
    high: float
    interaction: str   # "input_scale x redraw x1.91 [1.62, 2.25]"
    bounds: int


def simple_effects(design: Design, seeds: pd.DataFrame,
                   level: float = LEVEL) -> list[SimpleEffect]:
    """The simple effects of the module docstring, for every two-factor interaction of
    ``design`` whose interval excludes 1, in every view."""
    cells, names = list(design.cells), [name for name, _ in design.factors]
    k, found = len(names), []
    for view in VIEWS:
        y, bounds = _log_values(design, seeds, view)
        if min(len(v) for v in y) < 1:
            continue
        named = dict(zip(contrast_names(k), estimate(cells, y, level)))
        means = np.array([v.mean() for v in y])
        n = np.array([len(v) for v in y], float)
        dof = int(n.sum() - len(cells))
        if dof <= 0:
            continue
        sd = math.sqrt(sum(((v - v.mean()) ** 2).sum() for v in y) / dof)
        for (i, j), (e, low, high) in ((key, v) for key, v in named.items() if len(key) == 2):
            if low <= 0 <= high:
                continue
            words = (f"{names[i]} x {names[j]} x{math.exp(e):.3g} "
                     f"[{math.exp(low):.3g}, {math.exp(high):.3g}]")
            for a, b in ((i, j), (j, i)):
                for side in (0, 1):
                    c = np.array([(2 * cell[a] - 1) * (cell[b] == side) for cell in cells],
                                 float) / 2 ** (k - 2)
                    est = float(c @ means)
                    half = _t(level, dof) * sd * math.sqrt(float((c ** 2 / n).sum()))
                    lows, highs = design.factors[a][1], design.factors[b][1]
                    found.append(SimpleEffect(
                        design.title, view, names[a], f"{lows[0]} -> {lows[1]}",
                        f"{names[b]}={highs[side]}", math.exp(est), math.exp(est - half),
                        math.exp(est + half), words, bounds))
    return found


def simple_table(capacity: pd.DataFrame, seeds: pd.DataFrame) -> list[SimpleEffect]:
    """``simple_effects`` of every design of ``capacity``."""
    return [e for d in designs(capacity) for e in simple_effects(d, seeds)]


def effects(design: Design, seeds: pd.DataFrame) -> pd.DataFrame:
    """One row per view and effect of ``design``: the effect's name, ratio (exp of the log
    effect), interval, the seeds in all, and how many of its values are bounds."""
    rows = []
    names = [name for name, _ in design.factors]
    cells = list(design.cells)
    for view in VIEWS:
        y, bounds = _log_values(design, seeds, view)
        if min(len(v) for v in y) < 1:
            continue
        for subset, (e, low, high) in zip(contrast_names(len(names)), estimate(cells, y)):
            rows.append({"design": design.title, "view": view,
                         "effect": " x ".join(names[j] for j in subset), "order": len(subset),
                         "ratio": math.exp(e), "ci_low": math.exp(low), "ci_high": math.exp(high),
                         "seeds": sum(len(v) for v in y), "bounds": bounds})
    return pd.DataFrame(rows)


def table(capacity: pd.DataFrame, seeds: pd.DataFrame) -> pd.DataFrame:
    """``effects`` of every design of ``capacity`` in one table (``factorial.csv``), each row
    with its design's factors as "name low -> high; ..."; empty without a design."""
    frames = [effects(d, seeds).assign(factors="; ".join(f"{name} {low} -> {high}"
                                                         for name, (low, high) in d.factors))
              for d in designs(capacity)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
