"""A run's directory, ``<results_dir>/<experiment>/runs/<run_id>/``, and the one writer of its
files: ``config.yaml`` (the resolved config), ``curve.csv`` (``store.CURVE_COLUMNS``, a row per
evaluation), ``checkpoint.pt`` (``training/checkpoint.py`` says what it holds),
``diagnostics.json`` (``core/diagnostics.py``), ``summary.json`` (its fields: ``summary.py``)
and the claim lock ``.claim``.

``summary.json`` is written last, by atomic rename, so its presence means "this run is done"; a
directory without it is an interrupted run: a rerun continues it from its checkpoint or starts
it over (``reset``). Concurrent workers claim a run with an OS file lock (``claim``), which the
kernel releases when a worker dies. A forced rerun of a finished run is trained beside it
(``stage``: ``runs/.<run_id>.next``, hidden from readers) and swapped in whole when complete
(``finish``). Every file is written whole through ``files.py``; deletion removes a link, never
what it points to (``store.remove``).
"""

from __future__ import annotations

import csv
import ctypes
import errno
import io
import json
import math
import os
from pathlib import Path
from typing import BinaryIO, Callable

from filelock import Timeout

from kernelzoo.records import summary as summary_schema
from kernelzoo.records import files
from kernelzoo.records.files import atomic_write, atomic_write_text, read_text
from kernelzoo.records.store import CURVE_COLUMNS, is_done, read_summary, remove, run_dir

CHECKPOINT = "checkpoint.pt"
PROGRESS = ("curve.csv", CHECKPOINT)  # what a run continued from its checkpoint keeps


class RunDir:
    """The directory of one run: ``home``, its place in the store, and ``path``, where this
    attempt writes (``home``, or beside it for a forced rerun once ``stage`` is called)."""

    def __init__(self, home: str | Path):
        self.home = self.path = Path(home)

    @classmethod
    def of(cls, results_dir: str | Path, experiment: str, rid: str) -> RunDir:
        return cls(run_dir(results_dir, experiment, rid))

    def __truediv__(self, name: str) -> Path:
        """The file ``name`` of this attempt's directory."""
        return self.path / name

    def is_done(self) -> bool:
        return is_done(self.home)

    def read_summary(self) -> dict:
        return read_summary(self.home)

    def claim(self) -> Claim:
        """The run's claim: ``with run.claim() as claimed``, True when this worker holds it."""
        return Claim(self.home)

    def reset(self, keep_progress: bool = False) -> None:
        """Remove what an interrupted attempt left at ``home`` but its claim lock (and its
        curve and checkpoint when ``keep_progress``: the run continues from them)."""
        keep = PROGRESS if keep_progress else ()
        for child in self.home.iterdir():
            if child.name != ".claim" and child.name not in keep:
                remove(child)

    def stage(self) -> None:
        """Write this attempt beside the finished run, in an empty directory (what an
        interrupted forced rerun left there is removed), until ``finish`` swaps it in."""
        new = self.home.parent / f".{self.home.name}.next"
        remove(new)
        new.mkdir()
        self.path = new

    def write_config(self, text: str) -> None:
        atomic_write_text(self / "config.yaml", text)

    def curve(self, after: int | None = None) -> CurveWriter:
        """The writer of ``curve.csv``: a new one, or, continuing from the checkpoint at step
        ``after``, the rows up to that step kept and the next appended."""
        return CurveWriter(self / "curve.csv", after)

    def write_diagnostics(self, details: dict) -> None:
        atomic_write_text(self / "diagnostics.json", json.dumps(details, indent=1) + "\n")

    def write_checkpoint(self, save: Callable[[BinaryIO], object]) -> None:
        """Write ``checkpoint.pt`` whole: ``save(f)`` writes its bytes (``checkpoint.write``)."""
        atomic_write(self / CHECKPOINT, save)

    def write_summary(self, summary: dict) -> None:
        """Write ``summary.json`` (built by ``summary.new``) at ``path``: ValueError, before
        anything is written, when it is not one (``summary.problem``)."""
        data = _json_safe(summary)
        problem = summary_schema.problem(data)
        if problem:
            raise ValueError(problem)
        atomic_write_text(self / "summary.json", json.dumps(data, indent=2) + "\n")

    def finish(self, summary: dict) -> None:
        """The run is done: its summary written, its checkpoint removed, and a staged rerun
        put in the place of the run it replaces."""
        self.write_summary(summary)
        (self / CHECKPOINT).unlink(missing_ok=True)
        if self.path != self.home:
            swap_in(self.path, self.home)
            self.path = self.home


def _json_safe(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


class CurveWriter:
    """Append rows to ``curve.csv``, flushed per row so a killed run leaves a readable prefix.
    A run continued from its checkpoint at step ``after`` keeps the rows up to that step."""

    def __init__(self, file: Path, after: int | None = None):
        if after is not None:  # whole rows up to ``after`` (a kill may have cut the last row)
            rows = [row for row in csv.reader(read_text(file).splitlines()[1:])
                    if len(row) == len(CURVE_COLUMNS) and row[0].isdigit() and int(row[0]) <= after]
            text = io.StringIO()
            csv.writer(text).writerows([CURVE_COLUMNS, *rows])
            atomic_write_text(file, text.getvalue())
        self.file = open(file, "w" if after is None else "a", newline="")
        self.writer = csv.writer(self.file)
        if after is None:
            self.writer.writerow(CURVE_COLUMNS)

    def write(self, step: int, train_loss: float, eval_loss: float, eval_accuracy: float) -> None:
        self.writer.writerow([step, f"{train_loss:.6g}", f"{eval_loss:.6g}", f"{eval_accuracy:.6g}"])
        self.file.flush()

    def close(self) -> None:
        self.file.close()


class Claim:
    """An exclusive, non-blocking claim on a run directory.

    Uses an OS-level lock (``fcntl.flock`` through ``filelock``), so a worker killed with
    SIGKILL releases it at once; two sweeps on one results directory never train a run twice.
    """

    def __init__(self, path: Path):
        path.mkdir(parents=True, exist_ok=True)
        self.lock = files.lock(path / ".claim", timeout=0)  # never through a planted link

    def __enter__(self) -> bool:
        try:
            self.lock.acquire()
        except Timeout:
            return False
        return True

    def __exit__(self, *exc) -> None:
        if self.lock.is_locked:
            self.lock.release()


def swap_in(new: Path, path: Path) -> None:
    """Put the complete run directory ``new`` in the place of ``path`` and remove the replaced
    one. On Linux the two trade places in one step (renameat2 RENAME_EXCHANGE); where that is
    not available, ``path`` is renamed aside first, so for an instant neither is in place (a
    rerun then trains it again; nothing is lost)."""
    try:
        _exchange(new, path)
    except OSError:
        aside = path.parent / f".{path.name}.old"
        os.replace(path, aside)
        os.replace(new, path)
        new = aside
    remove(new)


def _exchange(a: Path, b: Path) -> None:
    """Swap two directory entries atomically (Linux renameat2 with RENAME_EXCHANGE)."""
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if renameat2 is None:
        raise OSError(errno.ENOSYS, "renameat2 is not available")
    at_cwd, exchange = -100, 2  # AT_FDCWD, RENAME_EXCHANGE
    if renameat2(at_cwd, os.fsencode(a), at_cwd, os.fsencode(b), exchange) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), str(a))
