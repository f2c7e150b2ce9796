"""The experiment's history files beside its runs: the sweeper's ``sweep.json`` (one entry per
invocation: points, outcomes, wall time, machine) and the failure-point search's ``search.json``
(each series' probes in the order they were asked for), with the counts the report reads from
them. Both are written whole (``files.atomic_write_text``); a damaged one is set aside, never
deleted (``set_aside``).
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

from kernelzoo.records.files import StoreError, read_json


def sweep_file(exp_dir: str | Path) -> Path:
    """The sweeper's record of an experiment's invocations: ``{"invocations": [{"points",
    "outcomes", "wall_seconds", "launcher", "machine", ...}], "wall_seconds": total}``."""
    return Path(exp_dir) / "sweep.json"


def read_sweep(exp_dir: str | Path) -> dict | None:
    """The sweep record of ``exp_dir``, or None when there is none; StoreError when damaged."""
    file = sweep_file(exp_dir)
    history = read_json(file)
    problem = None if history is None else _sweep_problem(history)
    if problem:
        raise StoreError(f"{file}: not a sweep record ({problem})")
    return history


def _sweep_problem(history) -> str | None:
    """What keeps ``history`` from being a sweep record with the fields the report reads."""
    number = (int, float)
    if not isinstance(history, dict) or not isinstance(history.get("invocations"), list):
        return "no list of invocations"
    if not isinstance(history.get("wall_seconds"), number):
        return "no total wall_seconds"
    for n, i in enumerate(history["invocations"], 1):
        outcomes = i.get("outcomes", {}) if isinstance(i, dict) else None
        search = i.get("search", {"rounds": 0}) if isinstance(i, dict) else None
        if not (isinstance(i, dict) and isinstance(i.get("points"), int)
                and isinstance(i.get("wall_seconds"), number)
                and isinstance(outcomes, dict) and all(isinstance(v, int) for v in outcomes.values())
                and isinstance(search, dict) and isinstance(search.get("rounds"), int)):
            return f"invocation {n} lacks points, wall_seconds, outcomes or search rounds"
    return None


def search_file(exp_dir: str | Path) -> Path:
    """The failure-point search's record (``search=bisect``): ``{"series": {key: {"overrides",
    "d_dot", "spec", "probes", "verdict"}}}``, probes ``{"n_keys", "round", "why", "run_id",
    "fails"}`` in the order they were asked for."""
    return Path(exp_dir) / "search.json"


def read_search(exp_dir: str | Path) -> dict | None:
    """The search record of ``exp_dir``: {series key: series}, or None when there is none;
    StoreError when damaged."""
    file = search_file(exp_dir)
    record = read_json(file)
    if record is None:
        return None
    try:
        return {k: v for k, v in record["series"].items() if isinstance(v.get("probes"), list)}
    except (KeyError, TypeError, AttributeError) as err:
        raise StoreError(f"{file}: not a search record ({type(err).__name__}: {err})") from None


def set_aside(file: Path, problem: StoreError) -> str:
    """Rename a damaged record out of the way (never delete it); the warning to print."""
    aside = file.with_name(file.name + ".damaged")
    os.replace(file, aside)
    return f"warning: {problem}; kept as {aside.name}, starting a new record"


def trained_points(invocation: dict) -> int:
    """Points an invocation ran rather than skipped (all of them for a record without outcomes)."""
    return invocation["points"] - invocation.get("outcomes", {}).get("skipped", 0)


def finished_points(invocation: dict) -> int:
    """Runs an invocation's outcomes count as ended, skipped and failed ones aside. For an
    interrupted one, the jobs that ended before the signal (records older than that count only
    whole launcher batches or search rounds)."""
    return sum(n for k, n in invocation.get("outcomes", {}).items()
               if k not in ("skipped", "failed"))


def experiment_points(history: dict | None) -> int | None:
    """The experiment's size (every grid's points) as its sweep records state it, or None when
    no record does (a search, or records older than ``experiment_points``)."""
    known = [i["experiment_points"] for i in (history or {}).get("invocations", [])
             if "experiment_points" in i]
    return max(known) if known else None


def cpu_model() -> str:
    """The CPU's model name, recorded with sweeps and benchmarks."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine() or "unknown"
