"""The runs table of one experiment's store: one row per readable summary, with its label.

``load_runs`` reads every ``<exp_dir>/runs/*/summary.json`` (``store.read_summary``) with a few
values of the run's config.yaml, and the search record's probe rounds; ``add_labels`` names each
configuration as figures and reports show it. The analysis (``kernelzoo.analyze``) and the
sweeper's stall checks read a store through ``load_runs``.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import pandas as pd

from kernelzoo import config
from kernelzoo.analysis import settings
from kernelzoo.analysis.capacity import CONFIG_KEYS, VIEWS
from kernelzoo.analysis.labels import canonical_params, format_value, map_label, query_rank, sizing_param
from kernelzoo.records.files import StoreError
from kernelzoo.records.history import read_search
from kernelzoo.records.store import config_value, read_config, read_summary
from kernelzoo.records.summary import is_run_id
from kernelzoo.config.words import escaped


def number(value) -> float:
    """A summary number as float: null -> NaN, the store's "inf" strings -> inf."""
    return math.nan if value is None else float(value)


def _row(summary: dict, run_dir: str) -> dict:
    """One row of ``runs`` from a summary whose types ``read_summary`` checked."""
    params = summary["feature_map_params"]
    row = dict(summary, run_dir=run_dir, params=canonical_params(params),
               feature_map_params=json.dumps(params, sort_keys=True))
    for key in ("final_eval_loss", "best_eval_loss", "final_eval_accuracy", "wall_seconds"):
        row[key] = number(summary[key])
    if "numerics" in summary:  # one text column, as the map's parameters: runs.parquet's type
        row["numerics"] = json.dumps(summary["numerics"], sort_keys=True)
    return row


def load_runs(exp_dir: Path) -> tuple[pd.DataFrame, list[str], list[str]]:
    """(one row per readable summary, run dirs without summary, one line per damaged file:
    a bad summary, something in runs/ that is no run directory, an unreadable search.json).
    Hidden entries (a forced rerun in progress) are not runs."""
    rows, missing, damaged = [], [], []
    for path in sorted(p for p in (exp_dir / "runs").iterdir() if not p.name.startswith(".")):
        if path.is_symlink():  # the store follows no link (store.guard)
            damaged.append(f"{path}: a symbolic link, not a run directory; left unread")
        elif not is_run_id(path.name):  # shown, never printed raw (words.escaped)
            damaged.append(f"{path.parent / escaped(path.name)}: not a run directory (a run "
                           "id is letters, digits, '-', '_' and '.'); left unread")
        elif not path.is_dir():
            damaged.append(f"{path}: not a run directory")
        elif not (path / "summary.json").exists():
            missing.append(path.name)
        else:
            try:
                row = _row(read_summary(path), path.name)
                cfg = read_config(path)
                lr = config_value(cfg, "trainer.lr")  # a configuration's too: lr_robustness
                task = cfg.get("task") or {}  # update_rules counts the distinct keys evaluated
                _, eval_len = config.sequence_lengths(row["n_keys"], bool(task.get("replacement")),
                                                      task.get("seq_len"), task.get("eval_seq_len"))
                trainer = cfg.get("trainer") or {}
                rows.append({**row, "lr": "" if lr is None else format_value(lr),
                             "eval_seq_len": eval_len,
                             "replacement": bool(task.get("replacement")),
                             "eval_max_queries": trainer.get("eval_max_queries", 200),
                             "eval_query_batch": trainer.get("eval_query_batch", 32),
                             "stop_loss": number(trainer.get("stop_loss")),
                             "settings": settings.of_config(cfg)})
            except StoreError as err:
                damaged.append(str(err))
    runs = pd.DataFrame(rows)
    if runs.empty:
        return runs, missing, damaged
    try:
        search = read_search(exp_dir) or {}
    except StoreError as err:
        damaged.append(str(err))
        search = {}
    probes = {p["run_id"]: p for series in search.values()
              for p in series["probes"] if isinstance(p, dict) and "run_id" in p}
    runs["probe_round"] = [probes.get(r, {}).get("round") for r in runs["run_id"]]
    runs["probe_round"] = runs["probe_round"].astype("Int64")
    runs["probe_why"] = [probes.get(r, {}).get("why") for r in runs["run_id"]]
    asked = {p["run_id"]: ",".join((series.get("spec") or {}).get("views") or VIEWS)
             for series in search.values() for p in series["probes"]
             if isinstance(p, dict) and "run_id" in p}  # search.views: the views it located
    runs["search_views"] = [asked.get(r) for r in runs["run_id"]]
    for key in ("d_dot", "predicted_capacity"):
        runs[key] = runs[key].astype("Int64")
    runs["read_rank"] = pd.Series(
        [None if pd.isna(r.d_dot) else query_rank(r.feature_map, int(r.d_key), int(r.d_dot),
                                                  json.loads(r.feature_map_params))
         for r in runs.itertuples()], index=runs.index, dtype="Int64")
    return add_labels(runs), missing, damaged


def add_labels(runs: pd.DataFrame) -> pd.DataFrame:
    """Add ``label``: a short human name per configuration, unique within the experiment.

    The map's own head (``style.map_label``: "ELU+1", "DPFP-2"), then the parameter the map
    resolves from d_dot (nu, m: ``style.sizing_param``) and the parameters that vary among its
    configurations, those the head shows aside, and d_key / update_rule / d_dot only where
    needed to tell them apart.
    """
    configs = runs.drop_duplicates(list(CONFIG_KEYS))
    feasible = runs[runs["status"] != "infeasible"]  # an infeasible point has no lr to show
    across = [k for k in ("d_key", "update_rule", "lr") if feasible[k].nunique() > 1]
    labels = {}
    for fmap, group in configs.groupby("feature_map"):
        dicts = [json.loads(p) for p in group["feature_map_params"]]
        keys = sorted(set().union(*dicts))
        shown = [k for k in keys if k == sizing_param(fmap)
                 or len({json.dumps(d.get(k)) for d in dicts}) > 1]
        for (_, row), params in zip(group.iterrows(), dicts):
            head, named = map_label(fmap, params)
            parts = [head]
            for k in shown:
                if k in params and k not in named:
                    v = params[k]
                    parts.append(v if isinstance(v, str) else f"{k}={format_value(v)}")
            parts += [f"{k}={row[k]}" if k in ("d_key", "lr") else str(row[k]) for k in across]
            labels[tuple(row[k] for k in CONFIG_KEYS)] = escaped(" ".join(map(str, parts)))
    counts = Counter(labels.values())
    labels = {key: f"{lab} d_dot={key[3]}" if counts[lab] > 1 else lab
              for key, lab in labels.items()}
    runs = runs.copy()
    runs["label"] = [labels[key] for key in zip(*(runs[k] for k in CONFIG_KEYS))]
    return runs
