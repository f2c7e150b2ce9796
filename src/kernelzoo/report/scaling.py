"""The d_dot law (``analysis.scaling``) in words: report.md's section "Capacity against d_dot,
per view" (``section``), one family's answer in one sentence (``sentence``), and the words the
verdicts quote (``law_words``, ``short_verdict``). Each analysed store's answers:

    python -m kernelzoo.report.scaling results/reference/*/scaling.csv
"""

from __future__ import annotations

import argparse
import io
import math
from pathlib import Path

import pandas as pd

from kernelzoo.analysis import censored, power
from kernelzoo.analysis.capacity import VIEW_WORDS
from kernelzoo.analysis.scaling import MIN_D_DOTS, VERDICTS, Family, table
from kernelzoo.records import files


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


def _power_words(r) -> str:
    """"power 62%", or why there is none (one seed per level: no spread to simulate)."""
    return "power not computed" if pd.isna(r.power) else f"power {r.power:.0%}"


def law_words(r, rows: pd.DataFrame) -> str:
    """The law's verdict in words from its first row (``verdict``, its p and power)."""
    word = getattr(r, "verdict", None)
    if pd.isna(r.b):
        return f"cannot tell: {_bounded(rows)}" if word == VERDICTS[2] else "not fitted"
    if r.p_identity < censored.REJECT:
        return f"n* = d_dot rejected at {censored.REJECT:.1%} (F test {_p(r.p_identity)})"
    if not isinstance(word, str):  # a scaling.csv written before the power column
        return f"n* = d_dot not rejected (F test {_p(r.p_identity)}; its power not computed)"
    shown = (f"n* / d_dot at the levels' centre shown within {1 - power.RATIO:.0%} either way"
             if word == VERDICTS[1] else
             f"n* / d_dot at the levels' centre not shown within {1 - power.RATIO:.0%}")
    return (f"{'consistent with n* = d_dot' if word == VERDICTS[1] else 'cannot tell'} (F test "
            f"{_p(r.p_identity)}, not rejected; {shown}; {_power_words(r)} against n* = "
            f"{power.RATIO:g} d_dot)")


def short_verdict(r) -> str:
    """The law's verdict in a few words from a scaling.csv row: "rejects n* = d_dot",
    "consistent with n* = d_dot (within 10%)", "cannot tell n* = d_dot (power 29%)"."""
    word = getattr(r, "verdict", None)
    if r.p_identity < censored.REJECT:
        return "rejects n* = d_dot"
    if not isinstance(word, str):  # a scaling.csv written before the power column
        return "does not reject n* = d_dot (power not computed)"
    if word == VERDICTS[1]:
        return f"consistent with n* = d_dot (within {1 - power.RATIO:.0%}, shown)"
    return f"cannot tell n* = d_dot (not rejected, within {1 - power.RATIO:.0%} not shown; " \
        f"{_power_words(r)})"


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


def scaling_section(found: list[Family]) -> list[str]:
    """report.md's section on the d_dot law ([] when no family has two levels)."""
    shown = [f for f in found if f.points["d_dot"].nunique() >= 2]
    if not shown:
        return []
    lines = ["## Capacity against d_dot, per view", "",
             "| family | view | levels | a [95%] | b [95%] | "
             f"n* = d_dot (F test; its power against n* = {power.RATIO:g} d_dot) | "
             "failure point / d_dot per level |", "|---|---|---|---|---|---|---|"]
    rows = table(shown)
    for (_, view), group in rows.groupby(["family", "view"], sort=False):
        r = group.iloc[0]
        fitted = not pd.isna(r.b)
        lines.append(f"| {r.family} | {VIEW_WORDS[view]} | {r.n_d_dot} | "
                     + (f"{_ci(r.a, r.a_low, r.a_high, '.3g')} | "
                        f"{_ci(r.b, r.b_low, r.b_high, '.3f')}" if fitted else "– | –")
                     + f" | {law_words(r, group)} | "
                     + "; ".join(_level(x) for x in group.itertuples()) + " |")
    return lines + [""]


def main(argv=None) -> None:
    """Print each scaling.csv's families, one sentence each."""
    parser = argparse.ArgumentParser(prog="python -m kernelzoo.report.scaling",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("scaling_csv", nargs="+", help="scaling.csv files of analysed stores")
    for path in parser.parse_args(argv).scaling_csv:
        try:
            rows = pd.read_csv(io.StringIO(files.read_text(Path(path))))
        except (OSError, ValueError, files.StoreError) as err:
            print(f"{path}: unreadable ({type(err).__name__}: {err})")
            continue
        print(f"{path}:" + (" no family with a failure point" if rows.empty else ""))
        for _, group in rows.groupby(["family", "view"], sort=False):
            print(f"  {sentence(group)}")


if __name__ == "__main__":
    main()
