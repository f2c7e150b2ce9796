"""The report's sections on what the memory holds: the rank bound and the features a query
reads (``rank_bound.py``), the feature rank during training, the predictions of the failure
point, before training and from the n_keys = d_dot probe (``prediction.py``), and the stalls
with their checks (``stalls.py``). Each returns its markdown lines for ``report.write_report``."""

from __future__ import annotations

import pandas as pd

from kernelzoo.analysis import prediction, rank_bound
from kernelzoo.analysis.capacity import VIEW_WORDS, VIEWS, value_column
from kernelzoo.analysis.stalls import has_diagnostics, stall_rates
from kernelzoo.analysis.labels import cell, natural
from kernelzoo.config.words import plural

RANK_CHANGE = 0.1  # a relative change of the effective rank worth noting
SHOWN = 10  # rows of a long table shown in the report; the rest are in the linked file


def rank_changes(runs: pd.DataFrame) -> list[str]:
    """Per configuration, the written keys' effective feature rank at initialisation and after
    training (diagnostics; median over its runs), for those where it moved by more than 10%."""
    columns = ("phi_effective_rank_initial", "phi_effective_rank")
    if not set(columns) <= set(runs):
        return []
    rows = runs.dropna(subset=list(columns))
    lines = []
    for label in natural(rows["label"]):
        group = rows[rows["label"] == label]
        before, after = group[columns[0]].median(), group[columns[1]].median()
        if before > 0 and abs(after - before) > RANK_CHANGE * before:
            lines.append(f"| {label} | {group['d_dot'].iloc[0]} | {before:.1f} | {after:.1f} | "
                         f"{after / before - 1:+.0%} | {len(group)} |")
    if not lines:
        return []
    return ["## Feature rank during training", "",
            "Configurations whose written keys' effective feature rank (diagnostics, median over "
            "their runs) moved by more than 10% between initialisation and the end of training: "
            "trained keys, and learned maps' own parameters, reshape the state's use.", "",
            "| configuration | d_dot | at initialisation | after training | change | runs |",
            "|---|---|---|---|---|---|", *lines, ""]


def prediction_section(runs: pd.DataFrame, capacity: pd.DataFrame) -> list[str]:
    """Each predictor's score per view within this store (``prediction.score``): those made
    before training, then the early diagnostic from the trained n_keys = d_dot probe."""
    lines = ["## Predicting the failure point: before training, and an early diagnostic at the "
             "n_keys = d_dot probe", ""]
    if not has_diagnostics(runs):
        return lines + ["No diagnostics: these runs predate them (no feature ranks in their "
                        "summaries), so only d_dot predicts the failure points.", ""]
    scores = prediction.score(capacity)
    lines += ["Before training: d_dot and the untrained map's ranks on the task's keys. Early "
              "diagnostic: the ranks of the model trained at n_keys = d_dot (a trained run). "
              "c·p: p times one constant fitted on the other feature maps' configurations; "
              "mean |ln(observed / predicted)| over the configurations that fail at a point "
              "(bounds are not scored).", "",
              "| view | configurations | "
              + " | ".join(prediction.PREDICTORS) + " |", "|---|---|" + "---|"
              * len(prediction.PREDICTORS)]
    for view in VIEWS:
        by = scores.by.get(view) or {}
        lines.append(f"| {VIEW_WORDS[view]} | {scores.n.get(view, 0)} | "
                     + " | ".join(cell(by.get(p), 3) for p in prediction.PREDICTORS) + " |")
    return lines + ["", "Held out across stores (fitted on the zoo at d_dot 64 and dot_scaling, "
                    "scored on the zoo at d_dot 128): `python -m kernelzoo.analysis.prediction "
                    "results/reference/{zoo,dot_scaling}/capacity.csv`.", ""]


def stall_section(runs: pd.DataFrame, capacity: pd.DataFrame, checked: pd.DataFrame) -> list[str]:
    """The stall rule, the stall rate of every point with a stalled run, the checks and what
    they cleared (``checked``: ``stalls.check_outcomes``)."""
    lines = ["## Stalls", ""]
    if not has_diagnostics(runs):
        return lines + ["No diagnostics: these runs predate them (no dead_keys in their "
                        "summaries), so no run can be told stalled; every run counts as it "
                        "ended.", ""]
    rates = stall_rates(runs)
    if rates.empty:
        return lines + ["No run stalled.", ""]
    lines += [f"{int(runs['stalled'].sum())} of {len(runs)} runs stalled, at "
              f"{plural(len(rates), 'point')} of {plural(rates['label'].nunique(), 'configuration')}"
              "; every one counts as it ended in the headline failure points (each run is listed "
              "under \"What is missing or was set aside\").", "",
              "| configuration | n_keys | stalled seeds | stall rate |", "|---|---|---|---|"]
    shown = rates.sort_values("stalled", ascending=False, kind="stable").head(SHOWN)
    lines += [f"| {r.label} | {r.n_keys} | {r.stalled} of {r.seeds} | {r.stalled / r.seeds:.0%} |"
              for r in shown.sort_index().itertuples()]
    lines += ([f"| ... {plural(len(rates) - SHOWN, 'more point')}: every stalled run is a row "
               "of `stalls.csv` | | | |"] if len(rates) > SHOWN else []) + [""]
    if checked.empty:
        return lines + ["No stall was checked (`stall_check=true` trains a check for each): no "
                        "failure point is moved by a stall.", ""]
    cleared = {v: int(checked[f"clears_{v}"].sum()) for v in ("loss", "accuracy")}
    failed = {v: int(checked[f"fails_{v}"].sum()) for v in ("loss", "accuracy")}
    lines += [f"Checks: {len(checked)} of {int(runs['stalled'].sum())} stalled runs checked. In "
              f"the loss view {failed['loss']} of them failed; their checks cleared "
              f"{cleared['loss']} (the run had stopped too soon: its check passes) and confirmed "
              f"{failed['loss'] - cleared['loss']} (its check fails too). In the accuracy view "
              f"{failed['accuracy']} failed; cleared {cleared['accuracy']}, confirmed "
              f"{failed['accuracy'] - cleared['accuracy']}. A stalled run that passed a view had "
              "nothing to clear there.",
              "",
              "| configuration | seed | n_keys | check | final eval loss | accuracy | clears "
              "loss / accuracy |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {r.label} | {r.seed} | {r.n_keys} | {r.check} | {cell(r.final_eval_loss, 4)} | "
              f"{cell(r.final_eval_accuracy, 4)} | {'yes' if r.clears_loss else 'no'} / "
              f"{'yes' if r.clears_accuracy else 'no'} |" for r in checked.head(SHOWN).itertuples()]
    if len(checked) > SHOWN:
        lines.append(f"| ... {plural(len(checked) - SHOWN, 'more check')}: the checks are the "
                     "rows of runs.parquet with a `stall_check_of` | | | | | | |")
    shown = pd.Series([cell(a) != cell(b) for a, b in zip(
        capacity["observed_capacity_verified"], capacity["observed_capacity"])],
        index=capacity.index, dtype=bool)
    moved = capacity[capacity["stalls_checked"].gt(0) & shown]
    lines += ["", "Failure points that the checks move (loss view, secondary column): "
              + ("; ".join(f"{r.label}: {cell(r.observed_capacity)} as the runs ended, "
                           f"{cell(r.observed_capacity_verified)} with each checked stall "
                           "replaced by its check" for r in moved.itertuples()) or "none") + "."]
    return lines + [""]


def query_read_lines(capacity: pd.DataFrame, runs: pd.DataFrame) -> list[str]:
    """For each configuration whose query reads fewer features than its d_dot (``read_rank``,
    ``FeatureMap.query_rank_of``: cosFormer), its loss-view failure point against that number
    (the rank bound is that of the features read) and the argmax views' in keys."""
    reads = runs.drop_duplicates("label").set_index("label")["read_rank"]
    lines = []
    for r in capacity.itertuples():
        read = reads.get(r.label)
        if pd.isna(read) or pd.isna(r.d_dot) or read >= r.d_dot:
            continue
        keys = ", ".join(f"{VIEW_WORDS[view]} {cell(getattr(r, value_column(view)))}"
                         for view in VIEWS[1:])
        lines.append(f"{r.label}: a query reads {read} of its d_dot {r.d_dot} features, so its "
                     f"read-out has rank {read} and the bound above is that of {read}; loss-view "
                     f"failure point / {read}: {r.observed_capacity / read:.2f} (the argmax "
                     f"views, not bounded by it, in keys: {keys}).")
    return ["", "Features a query reads: " + " ".join(lines)] if lines else []


def rank_bound_section(capacity: pd.DataFrame, runs: pd.DataFrame) -> list[str]:
    """The rank bound's derivation, each configuration's bound and the runs closest to it."""
    bounded = capacity[capacity["rank_bound"].notna()]
    if bounded.empty:
        return []
    lines = ["## The rank bound (loss view)", "",
             "Bounds here: " + "; ".join(f"{r.label} {r.rank_bound}"
                                         for r in bounded.itertuples()) + "."]
    lines += query_read_lines(capacity, runs)
    bounded_runs = runs[runs["rank_bound"].notna()]
    floors = pd.Series([rank_bound.floor_of(r.n_keys, r.read_rank, r.update_rule, r.eval_max_queries,
                                            r.eval_query_batch)
                        for r in bounded_runs.itertuples()], index=bounded_runs.index,
                       dtype=float)
    if len(floors):
        losses = runs.loc[floors.index, "final_eval_loss"]
        at = floors[(floors > 0) & (losses <= floors * 1.01)]
        below = floors[losses < floors * (1 - 1e-4)]
        lines += ["", f"Runs whose final eval loss lies below their floor: {len(below)} of "
                  f"{len(floors)}; within 1% above it (the memory at its rank limit): {len(at)}."]
    return lines + [""]
