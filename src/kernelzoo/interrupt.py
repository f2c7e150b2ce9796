"""SIGTERM and SIGINT stop a run or a sweep cleanly, with one line.

``handled()`` turns the first of either signal into ``Interrupted`` (a KeyboardInterrupt) in the
main thread, wherever it is: in the training loop, or in a launcher waiting for its workers.
Every layer then unwinds as it does for Ctrl-C: the run in flight writes no summary (a rerun
continues it from its last checkpoint, ``checkpoint.py``, or starts it over) and releases its
claim. The sweeper stops its workers with ``stop_workers`` (every
descendant process: the launcher's workers, their helpers), records the interruption in
``sweep.json`` and says what was stopped; ``train.main`` prints that one line and exits with
128 + the signal number. Further signals are ignored while this happens.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Interrupted(KeyboardInterrupt):
    """A signal asked this process to stop; ``str`` is the one line to print."""

    def __init__(self, signum: int, message: str | None = None):
        self.signum, self.name = signum, signal.Signals(signum).name
        super().__init__(message or f"stopped by {self.name}; the run in flight has no summary "
                                    "and a rerun continues it from its checkpoint, if any")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


@contextlib.contextmanager
def handled():
    """Within this block, SIGTERM and SIGINT raise Interrupted (once) in the main thread."""
    stopping = []

    def handler(signum, frame):
        if not stopping:
            stopping.append(signum)
            raise Interrupted(signum)

    previous = {s: signal.signal(s, handler) for s in SIGNALS}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def descendants(pid: int | None = None) -> list[int]:
    """Every process below ``pid`` (default: this one), parents before children; from /proc,
    so empty where there is none (there, launchers stop their own workers)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [os.getpid() if pid is None else pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def stop_workers(grace: float = 1.5) -> None:
    """SIGTERM every descendant process, SIGKILL whatever is left after ``grace`` seconds (some
    catch SIGTERM and go on: submitit's tasks). A process that
    ignores SIGTERM is left alone: the resource trackers of loky and multiprocessing do, to
    release shared resources after the workers are gone, and they exit when this process does."""
    pids = [pid for pid in descendants() if not _ignores(pid, signal.SIGTERM)]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        end = time.monotonic() + grace
        while time.monotonic() < end and any(_alive(pid) for pid in pids):
            time.sleep(0.05)


def _status(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return ""


def _ignores(pid: int, sig: int) -> bool:
    """True when ``pid`` ignores ``sig`` (the SigIgn mask of /proc/<pid>/status)."""
    mask = next((line.split()[1] for line in _status(pid).splitlines()
                 if line.startswith("SigIgn:")), "0")
    return bool(int(mask, 16) >> (sig - 1) & 1)


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, dead but not yet reaped, counts as gone)."""
    state = next((line.split()[1] for line in _status(pid).splitlines()
                  if line.startswith("State:")), "Z")
    return state != "Z"
