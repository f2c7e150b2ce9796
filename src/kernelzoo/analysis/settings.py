"""Which runs of a store the analysis takes together, and what it sets aside, each said.

A label names a configuration by CONFIG_KEYS alone, so the runs of one label may differ in how
they were trained: a sweep's extra overrides apply to every point, and one configuration may
have been trained twice under different settings (``trainer.max_steps=500``, then ``2000``: two
run ids for one (configuration, seed, n_keys) point), or an experiment may vary a setting
itself (``lr_patience``: ``trainer.patience``), its runs at whatever n_keys its search
probes. ``split`` makes each such configuration one per setting: the settings
(a dotted key of ``trainer``, ``task`` or ``memory`` in their config.yaml,
``SETTING_SECTIONS``) that differ between the runs of a doubly trained point, or whose recorded
values differ among the configuration's runs (a run whose config.yaml lacks the key does not
count), are added to the label of every run of that configuration, so each setting gets its
own failure point; the added words are the run's ``setting`` ("" where nothing was split), so
a family (``scaling.py``) keeps them too.

``set_aside`` leaves out, with one line each, the runs that do not belong: a run whose summary
names another experiment (copied in from elsewhere), a directory whose summary names another
run id, and, once split, a point that still has more than one run (the first by directory name
is kept).
"""

from __future__ import annotations

import json

import pandas as pd

from kernelzoo.records.store import config_value
from kernelzoo.analysis.labels import format_value
from kernelzoo.config.words import escaped

SETTING_SECTIONS = ("trainer", "task", "memory")
# how a run was trained, not what: never a reason to split (NOT_IN_IDENTITY of
# training/plan.py), and lr, which every label already shows where it varies
NOT_SETTINGS = {"trainer.device", "trainer.threads", "trainer.progress", "trainer.pack",
                "trainer.compile", "trainer.checkpoint_minutes", "trainer.flush_denormal",
                "trainer.lr", "task.seq_len", "task.eval_seq_len"}
POINT = ["label", "seed", "n_keys"]


def of_config(cfg: dict) -> str:
    """A run's settings (``SETTING_SECTIONS`` of its config.yaml, flattened to dotted keys, but
    ``NOT_SETTINGS``) as JSON; "" without a config (an infeasible point has none)."""
    flat = {}

    def walk(prefix: str, value) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}", v)
        elif prefix not in NOT_SETTINGS:
            flat[prefix] = value

    for section in SETTING_SECTIONS:
        value = config_value(cfg, section)
        if value is not None:
            walk(section, value)
    return json.dumps(flat, sort_keys=True, default=str) if flat else ""


def set_aside(runs: pd.DataFrame, experiment: str) -> tuple[pd.DataFrame, list[str]]:
    """``runs`` without those of another experiment or under another run id's directory, and
    one line per run left out."""
    foreign = runs["experiment"] != experiment
    renamed = runs["run_id"] != runs["run_dir"]
    lines = [f"{r.run_dir}: a run of experiment {r.experiment!r}, not {experiment!r} (copied "
             "in?); left out" for r in runs[foreign].itertuples()]
    lines += [f"{r.run_dir}: its summary is run {r.run_id!r}, another directory's id (a "
              "duplicate or a renamed copy); left out" for r in runs[renamed & ~foreign].itertuples()]
    return runs[~(foreign | renamed)], lines


def split(runs: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """``runs`` (labelled) with each configuration trained under different settings split by
    those settings (module docstring), and one line per configuration split or run left out."""
    runs, lines = runs.copy(), []
    runs["setting"] = ""
    trained = runs[runs["settings"] != ""]
    doubled = trained[trained.duplicated(POINT, keep=False)]
    for label, group in trained.groupby("label", sort=True):
        twice = doubled[doubled["label"] == label]
        keys = {k for _, point in twice.groupby(["seed", "n_keys"])
                for k in _differing([json.loads(s) for s in point["settings"]])}
        keys = sorted(keys | _recorded([json.loads(s) for s in group["settings"].unique()]))
        if not keys:
            continue
        mine = (runs["label"] == label) & (runs["settings"] != "")
        suffix = {s: escaped(" ".join(f"{k}={_value(json.loads(s).get(k))}" for k in keys))
                  for s in runs.loc[mine, "settings"].unique()}
        runs.loc[mine, "label"] = [f"{label} {suffix[s]}" for s in runs.loc[mine, "settings"]]
        runs.loc[mine, "setting"] = [suffix[s] for s in runs.loc[mine, "settings"]]
        lines.append(f"{label}: trained under {len(set(suffix.values()))} settings of "
                     f"{escaped(', '.join(keys))}; analysed as one configuration each: "
                     + "; ".join(sorted(f"{label} {v}" for v in set(suffix.values()))))
    extra = runs.sort_values("run_dir").duplicated(POINT, keep="first")
    extra = extra.reindex(runs.index)
    lines += [f"{r.run_dir}: a second run of {r.label}, seed {r.seed}, n_keys {r.n_keys} under "
              "the same settings; left out" for r in runs[extra].itertuples()]
    return runs[~extra], lines


def _differing(settings: list[dict]) -> set[str]:
    keys = set().union(*settings)
    return {k for k in keys if len({json.dumps(s.get(k), default=str) for s in settings}) > 1}


def _recorded(settings: list[dict]) -> set[str]:
    """The keys with two different values among the ``settings`` that record them."""
    keys = set().union(*settings)
    return {k for k in keys
            if len({json.dumps(s[k], default=str) for s in settings if k in s}) > 1}


def _value(value) -> str:
    return "none" if value is None else format_value(value)
