"""A sweep's progress, one line per finished job, in every launcher and without a terminal.

The sweeper opens a batch (``start``: how many runs it launches, their work, when) in a small
JSON file of its sweep directory; each job, when it ends, counts its runs in under a file lock
(``finished``) and prints the last count, ``progress: k/N runs, elapsed 3.2 min, ETA 5.1 min``
(a pack's runs advance k together). A run's work is its step cost (S + 64)^2
(``kernelzoo.training.packing.step_cost``), which the ETA weighs by. Jobs find
the file through the sweep directory Hydra gives them, so joblib workers started earlier,
submitit processes and the in-process basic launcher all count into one file.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from kernelzoo.records.files import StoreError, atomic_write_text, lock, read_text
from kernelzoo.records.loaders import load_json

FILE = "progress.json"


def start(sweep_dir: str | Path, total: int, label: str = "", work: float | None = None,
          workers: str = "") -> None:
    """Open a batch of ``total`` runs in ``sweep_dir`` (each launch of a sweep or a round),
    ``work`` their summed cost (default: one per run), ``workers`` how they run ("2 workers x
    1 thread"). Progress is a convenience: if the file cannot be written (a full disk), jobs
    print none."""
    path = Path(sweep_dir) / FILE
    try:
        with lock(str(path) + ".lock"):
            atomic_write_text(path, json.dumps({
                "total": total, "done": 0, "work": total if work is None else work,
                "work_done": 0.0, "label": label, "workers": workers,
                "started": time.time()}) + "\n")
    except OSError:
        path.unlink(missing_ok=True)


def finished(sweep_dir: str | Path, work: float = 1.0) -> str | None:
    """Count one run of the open batch, of cost ``work``, as done: ``progress: k/N runs,
    elapsed 3.2 min, ETA 5.1 min``, or None without an open batch (a run outside a sweep).
    The ETA scales the time so far by the work left over the work done: a sweep trains its
    largest runs first, so a mean time per run would overstate it."""
    path = Path(sweep_dir) / FILE
    try:
        with lock(str(path) + ".lock", timeout=10):
            state = load_json(read_text(path))
            state["done"] += 1
            state["work_done"] += work
            atomic_write_text(path, json.dumps(state) + "\n")
        k, n, elapsed = state["done"], state["total"], time.time() - state["started"]
        done, left = state["work_done"], max(state["work"] - state["work_done"], 0.0)
    except (OSError, StoreError, ValueError, KeyError, TypeError):
        return None
    eta = elapsed / done * left if done > 0 else 0.0
    where = f" of {state['label']}" if state.get("label") else ""
    how = f" ({state['workers']})" if state.get("workers") else ""
    return (f"progress: {k}/{n} runs{where}{how}, elapsed {_minutes(elapsed)}, "
            f"ETA {_minutes(eta)}")


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"
