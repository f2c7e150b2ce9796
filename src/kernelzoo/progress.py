"""A sweep's progress, one line per finished run, in every launcher and without a terminal.

The sweeper opens a batch (``start``: how many jobs it launches, when) in a small JSON file of
its sweep directory; each job, when it ends, counts itself in under a file lock (``finished``)
and prints ``progress: k/N runs, elapsed 3.2 min, ETA 5.1 min``. Jobs find
the file through the sweep directory Hydra gives them, so joblib workers started earlier,
submitit processes and the in-process basic launcher all count into one file.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from filelock import FileLock

from .files import atomic_write_text

FILE = "progress.json"


def start(sweep_dir: str | Path, total: int, label: str = "") -> None:
    """Open a batch of ``total`` runs in ``sweep_dir`` (each launch of a sweep or a round).
    Progress is a convenience: if the file cannot be written (a full disk), jobs print none."""
    path = Path(sweep_dir) / FILE
    try:
        with FileLock(str(path) + ".lock"):
            atomic_write_text(path, json.dumps({"total": total, "done": 0, "label": label,
                                                "started": time.time()}) + "\n")
    except OSError:
        path.unlink(missing_ok=True)


def finished(sweep_dir: str | Path) -> str | None:
    """Count one job of the open batch as done: ``progress: k/N runs, elapsed 3.2 min, ETA
    5.1 min`` (ETA from the mean time per job so far), or None without an open batch (a run
    outside a sweep)."""
    path = Path(sweep_dir) / FILE
    try:
        with FileLock(str(path) + ".lock", timeout=10):
            state = json.loads(path.read_text())
            state["done"] += 1
            atomic_write_text(path, json.dumps(state) + "\n")
        k, n, elapsed = state["done"], state["total"], time.time() - state["started"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    eta = elapsed / k * max(n - k, 0)
    where = f" of {state['label']}" if state.get("label") else ""
    return f"progress: {k}/{n} runs{where}, elapsed {_minutes(elapsed)}, ETA {_minutes(eta)}"


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"
