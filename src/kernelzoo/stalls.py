"""Stalls: runs that end with a few keys never learned although their configuration is not over
capacity. They are told apart from failures and set aside by the failure-point rule
(``capacity.seed_table``); the report lists them with their keys and the stall rate per point.

Stall rule (stated again in report.md)
--------------------------------------
A run stalled when all four hold: (1) it ended by the plateau rule or the step cap (status
plateau or max_steps: not converged, diverged or infeasible); (2) 1 to 3 key symbols are dead
(diagnostics: answered wrong in every evaluation sequence that queries them); (3) those keys are
its only errors: final eval accuracy >= 1 - 3 / q (to 1e-6, the trainer's float32 precision),
q the keys it queries (n_keys, at most trainer.eval_max_queries); (4) its configuration is not
over capacity there: some run of the configuration, of any seed, passes the loss criterion
(final eval loss <= tau) at this n_keys or more. Such a run failed to learn a few keys that the
state demonstrably has room for: an optimisation stall, not a capacity limit. A stalled run that
fails a criterion is left out of its seed's series for that criterion (neither a pass nor a
failure; one that passes stays a pass), so a failure point is never set by a stalled seed. The
failure point with the stalls counted as failures is kept beside
(``observed_capacity_counting_stalls``). Stall rate of a point (configuration, n_keys): its
stalled seeds / its seeds with a run there. Runs without diagnostics (stores older than them)
are never stalls.
"""

from __future__ import annotations

import json
import math

import pandas as pd

from kernelzoo.files import StoreError, one_line, read_text
from kernelzoo.search import failing
from kernelzoo.store import read_config_value
from kernelzoo.style import natural_key

STALL_MAX_DEAD = 3  # at most this many dead keys, and no other errors, make a stall
STALL_STATUSES = ("plateau", "max_steps")
ACCURACY_TOLERANCE = 1e-6  # the trainer's accuracy is a float32 ratio: 50/53 reads 0.9433962
RULE = __doc__.partition("---\n")[2].strip()


def has_diagnostics(runs: pd.DataFrame) -> bool:
    """True when some run has the diagnostics' dead-key count (stores made before them lack it)."""
    return "dead_keys" in runs and bool(pd.to_numeric(runs["dead_keys"], errors="coerce")
                                        .notna().any())


def _queried(run_dir, n_keys: int) -> int:
    """How many key symbols an evaluation queries: n_keys, at most trainer.eval_max_queries."""
    cap = read_config_value(run_dir, "trainer.eval_max_queries")
    return min(n_keys, cap) if isinstance(cap, int) and cap > 0 else n_keys


def stalled(runs: pd.DataFrame, runs_dir, threshold: float) -> pd.Series:
    """The stall rule (module docstring) for every row of ``runs``; ``runs_dir`` holds the run
    directories (their config.yaml gives trainer.eval_max_queries)."""
    if not has_diagnostics(runs):
        return pd.Series(False, index=runs.index)
    dead = pd.to_numeric(runs["dead_keys"], errors="coerce")
    few = runs["status"].isin(STALL_STATUSES) & dead.between(1, STALL_MAX_DEAD)
    for i in runs.index[few]:
        queried = _queried(runs_dir / runs.at[i, "run_dir"], int(runs.at[i, "n_keys"]))
        few[i] = (runs.at[i, "final_eval_accuracy"]
                  >= 1 - STALL_MAX_DEAD / queried - ACCURACY_TOLERANCE)
    passes = ~failing(runs["final_eval_loss"], runs["status"].eq("diverged"), threshold)
    held = runs[passes & runs["status"].ne("infeasible")].groupby("label")["n_keys"].max()
    return few & (runs["n_keys"] <= runs["label"].map(held).fillna(-1))


def dead_key_words(run_dir) -> tuple[str, str | None]:
    """("key 37, confused with 12: collides; ...", None) from the run's diagnostics.json, or
    (what is missing, the damaged file's line or None)."""
    path = run_dir / "diagnostics.json"
    try:
        details = json.loads(read_text(path))
        return "; ".join(
            f"key {d['key']}, " + (f"confused with {d['confused_with']}"
                                   if d["confused_with"] is not None
                                   else "answered with values no key holds")
            + (f": {d['cause']}" if "cause" in d else "")  # older diagnostics lack the cause
            for d in details["dead_keys"]), None
    except FileNotFoundError:
        return "which keys: no diagnostics.json", None
    except (OSError, StoreError) as err:
        return "which keys: diagnostics.json unreadable", one_line(err)
    except (ValueError, KeyError, TypeError) as err:
        return ("which keys: diagnostics.json unreadable",
                f"{path}: not the diagnostics' dead keys ({type(err).__name__}: {err})")


def stall_lines(runs: pd.DataFrame, runs_dir) -> tuple[list[str], list[str]]:
    """(one line per stalled run: "ELU+1, seed 1, n_keys 43: stalled: 1 key of 43 never
    learned (key 7, confused with 12: collides); final eval loss 0.0228", damaged files)."""
    lines, damaged = [], []
    rows = runs[runs["stalled"]]
    for r in sorted(rows.itertuples(), key=lambda r: (natural_key(r.label), r.n_keys, r.seed)):
        words, bad = dead_key_words(runs_dir / r.run_dir)
        damaged += [bad] if bad else []
        dead = int(r.dead_keys)
        lines.append(f"{r.label}, seed {r.seed}, n_keys {r.n_keys}: stalled: {dead} key"
                     f"{'' if dead == 1 else 's'} of {r.n_keys} never learned ({words}); final "
                     f"eval loss {r.final_eval_loss:.3g}")
    return lines, damaged


def stall_rates(runs: pd.DataFrame) -> pd.DataFrame:
    """Per point (label, n_keys) with a stalled run: stalled seeds, seeds with a run there."""
    feasible = runs[runs["status"] != "infeasible"]
    points = feasible.groupby(["label", "n_keys"]).agg(stalled=("stalled", "sum"),
                                                      seeds=("seed", "nunique")).reset_index()
    points = points[points["stalled"] > 0]
    order = sorted(range(len(points)), key=lambda i: (natural_key(points["label"].iloc[i]),
                                                      points["n_keys"].iloc[i]))
    return points.iloc[order].reset_index(drop=True)


def moved(capacity: pd.DataFrame, counted: pd.DataFrame) -> list[str]:
    """Configurations whose failure point differs when stalls count as failures (``counted``:
    the capacity table of the runs with no stall set aside): "ELU+1: 47.8 (fails_at) with
    stalls counted as failures, 55 (fails_at) with them set aside"."""
    before = counted.set_index("label")
    lines = []
    for r in capacity.itertuples():
        old = before.loc[r.label]
        same = old["observed_capacity"] == r.observed_capacity or (
            math.isnan(old["observed_capacity"]) and math.isnan(r.observed_capacity))
        if old["outcome"] != r.outcome or not same:
            lines.append(f"{r.label}: {old['observed_capacity']:.3g} ({old['outcome']}) with "
                         f"stalls counted as failures, {r.observed_capacity:.3g} ({r.outcome}) "
                         "with them set aside")
    return lines
