"""Stalls: runs that end with a few keys never learned although their configuration is not over
capacity there. A stall is a diagnosis, reported per point; the headline failure points count
every run as it ended. Its check (``stall_check=true``: the same run trained again with a
longer stopping rule, linked by ``stall_check_of``) clears it where the run failed a view and
the check passes it; the failure point with each checked stalled run replaced by its check is a
secondary column, which a check can move either way.

Its rule is stated once, in docs/analysis.md ("Stalls and their checks").
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from kernelzoo.analysis.capacity import accuracy_failing, failing
from kernelzoo.records.files import StoreError, one_line, read_text
from kernelzoo.records.loaders import load_json
from kernelzoo.analysis.labels import natural_key

STALL_MAX_DEAD = 3  # at most this many dead keys, and no other errors, make a stall
STALL_STATUSES = ("plateau", "max_steps")
ACCURACY_TOLERANCE = 1e-6  # the trainer's accuracy is a float32 ratio: 50/53 reads 0.9433962


def has_diagnostics(runs: pd.DataFrame) -> bool:
    """True when some run has the diagnostics' dead-key count (stores made before them lack it)."""
    return "dead_keys" in runs and bool(pd.to_numeric(runs["dead_keys"], errors="coerce")
                                        .notna().any())


def _queried(cap, n_keys: int) -> int:
    """How many key symbols an evaluation queries: n_keys, at most trainer.eval_max_queries."""
    return min(n_keys, int(cap)) if pd.notna(cap) and int(cap) > 0 else n_keys


def stalled(runs: pd.DataFrame, threshold: float) -> pd.Series:
    """The stall rule (module docstring) for every row of ``runs`` (``runs.load_runs``'s, with
    each run's trainer.eval_max_queries)."""
    if not has_diagnostics(runs):
        return pd.Series(False, index=runs.index)
    dead = pd.to_numeric(runs["dead_keys"], errors="coerce")
    few = runs["status"].isin(STALL_STATUSES) & dead.between(1, STALL_MAX_DEAD)
    for i in runs.index[few]:
        queried = _queried(runs.at[i, "eval_max_queries"], int(runs.at[i, "n_keys"]))
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
        details = load_json(read_text(path))
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


def split_checks(runs: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the ordinary runs, the stall checks: rows whose ``stall_check_of`` names a run)."""
    if "stall_check_of" not in runs:
        return runs, runs.iloc[:0]
    check = runs["stall_check_of"].notna() & runs["stall_check_of"].astype(str).ne("")
    return runs[~check].reset_index(drop=True), runs[check].reset_index(drop=True)


def check_outcomes(runs: pd.DataFrame, checks: pd.DataFrame, threshold: float,
                   accuracy_threshold: float) -> pd.DataFrame:
    """Per stalled run with a check: run_id, label, seed, n_keys, the check's run_id, whether
    the stalled run fails the loss and accuracy views (``fails_loss``, ``fails_accuracy``) and
    whether its check clears it there: the run fails the view at that n_keys and its check
    passes it (a run that passed the view had nothing to clear)."""
    columns = ["run_id", "label", "seed", "n_keys", "check", "fails_loss", "fails_accuracy",
               "clears_loss", "clears_accuracy", "final_eval_loss", "final_eval_accuracy"]
    if checks.empty:
        return pd.DataFrame(columns=columns)
    stalled_runs = runs[runs["stalled"]].set_index("run_id")
    found = checks[checks["stall_check_of"].isin(stalled_runs.index)]
    diverged = found["status"].eq("diverged")
    loss_ok = ~failing(found["final_eval_loss"], diverged, threshold)
    acc_ok = ~accuracy_failing(found["final_eval_accuracy"], diverged, accuracy_threshold)
    base = stalled_runs.loc[found["stall_check_of"]]
    was = base["status"].eq("diverged")
    fails_loss = np.asarray(failing(base["final_eval_loss"], was, threshold))
    fails_acc = np.asarray(accuracy_failing(base["final_eval_accuracy"], was, accuracy_threshold))
    return pd.DataFrame({"run_id": found["stall_check_of"].to_numpy(),
                         "label": base["label"].to_numpy(), "seed": base["seed"].to_numpy(),
                         "n_keys": base["n_keys"].to_numpy(), "check": found["run_id"].to_numpy(),
                         "fails_loss": fails_loss, "fails_accuracy": fails_acc,
                         "clears_loss": fails_loss & np.asarray(loss_ok),
                         "clears_accuracy": fails_acc & np.asarray(acc_ok),
                         "final_eval_loss": found["final_eval_loss"].to_numpy(),
                         "final_eval_accuracy": found["final_eval_accuracy"].to_numpy()})


def resting(runs: pd.DataFrame, seeds: pd.DataFrame, checked: pd.DataFrame
            ) -> tuple[int, int, int]:
    """Of the seeds' loss-view failure points (``seeds``: ``capacity.seed_table``), how many a
    failure exists for, how many the run at the first failing n_keys sets while it stalled, and
    how many of those no check has tested (``checked``: ``check_outcomes``)."""
    failing = seeds[seeds["first_failure"].notna()]
    at = runs.set_index(["label", "seed", "n_keys"])["stalled"]
    at = at[~at.index.duplicated()]
    keys = list(zip(failing["label"], failing["seed"], failing["first_failure"].astype(int)))
    stalled = [k for k in keys if bool(at.get(k, False))]
    tested = set(zip(checked["label"], checked["seed"], checked["n_keys"].astype(int)))
    return len(keys), len(stalled), sum(k not in tested for k in stalled)


def with_checks(runs: pd.DataFrame, checks: pd.DataFrame) -> pd.DataFrame:
    """``runs`` with each stalled run that has a check replaced by its check's result (status,
    steps, final eval loss and accuracy): the series the verified failure points come from."""
    if checks.empty:
        return runs
    result = checks.drop_duplicates("stall_check_of", keep="last").set_index("stall_check_of")
    runs = runs.copy()
    hit = runs["stalled"] & runs["run_id"].isin(result.index)
    for key in ("status", "steps", "final_eval_loss", "final_eval_accuracy"):
        runs.loc[hit, key] = result.loc[runs.loc[hit, "run_id"], key].to_numpy()
    return runs
