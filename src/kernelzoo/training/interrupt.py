"""SIGTERM, SIGINT and SIGHUP stop a run or a sweep cleanly, with one line; a sweep's workers
die with it however it ends; a reader that goes away (``sweep | head -1``) costs output, never
a run (``survive_closed_output``).

``handled()`` turns the first of these signals into ``Interrupted`` (a KeyboardInterrupt) in the
main thread, wherever it is: in the training loop, or in a launcher waiting for its workers.
Every layer then unwinds as it does for Ctrl-C: the run in flight writes no summary (a rerun
continues it from its last checkpoint, ``checkpoint.py``, or starts it over) and releases its
claim. The sweeper stops its workers with ``stop_workers`` (every
descendant process: the launcher's workers, their helpers) and cancels the SLURM jobs it
submitted (``cancel_slurm_jobs``), records the interruption in
``sweep.json`` and says what was stopped; ``train.main`` prints that one line and exits with
128 + the signal number. Further signals are ignored while this happens. A sweep killed
outright (SIGKILL) runs none of this: its workers, marked at their start (``die_with_sweep``),
are killed as it dies, and the next sweep removes what they left in /dev/shm
(``shm.clean``).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import subprocess
import signal
import sys
import threading
import time
from pathlib import Path

SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP")
                if hasattr(signal, name))
SWEEP_PID = "KERNELZOO_SWEEP_PID"  # the sweep's main process, in its workers' environment
SWEEP_PLACE = "KERNELZOO_SWEEP_PLACE"  # where that pid means that process (``place``)


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
    """Within this block, SIGTERM, SIGINT and SIGHUP raise Interrupted (once) in the main
    thread; so does SIGUSR2, a scheduler's warning before a time limit, where nothing else
    handles it (a sweep inside a job: its default ended the process, exit 140, without a
    line; a submitit job's own handler, which requeues it, is left in place)."""
    stopping = []

    def handler(signum, frame):
        if not stopping:
            stopping.append(signum)
            raise Interrupted(signum)

    usr2 = getattr(signal, "SIGUSR2", None)
    taken = SIGNALS + ((usr2,) if usr2 and signal.getsignal(usr2) in (signal.SIG_DFL, None)
                       else ())
    previous = {s: signal.signal(s, handler) for s in taken}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def place() -> str:
    """Where a pid names one process: this machine's boot (its boot id: another host, or this
    one rebooted, has another) and this process's PID namespace (a container's, or a task's
    under ``unshare -p``, has its own). "" where neither can be read."""
    parts = []
    with contextlib.suppress(OSError):
        parts.append(Path("/proc/sys/kernel/random/boot_id").read_text().strip())
    with contextlib.suppress(OSError):
        parts.append(os.readlink("/proc/self/ns/pid"))
    return " ".join(parts)


def mark_sweep() -> None:
    """Name this process, in the environment its workers inherit, as their sweep, with the
    place where its pid names it (``place``)."""
    os.environ[SWEEP_PID] = str(os.getpid())
    os.environ[SWEEP_PLACE] = place()


def die_with_sweep() -> None:
    """In a worker of a sweep (``mark_sweep``): end this process as soon as the sweep's main
    process is gone, however it ended (kill -9 included), so that no worker trains on or waits
    forever on its pipes. A worker the sweep started itself (loky's) asks the kernel for a
    SIGKILL when its parent dies (Linux prctl PR_SET_PDEATHSIG); any worker, however deep
    (submitit's tasks run under a controller process), also has a thread that watches the
    sweep's process and SIGKILLs this one once it is gone. Only a worker in the sweep's place
    (same boot, same PID namespace) can see the sweep's pid: a job on another node, or in a
    PID namespace of its own, watches nothing and is stopped by the scheduler (scancel, the
    requeue of a time limit). In the sweep's own process, nothing."""
    pid = os.environ.get(SWEEP_PID)
    if not (pid and pid.isdigit()) or int(pid) == os.getpid() or _WATCHED:
        return
    if not os.environ.get(SWEEP_PLACE) or os.environ[SWEEP_PLACE] != place():
        return
    pid = int(pid)
    if sys.platform.startswith("linux") and os.getppid() == pid:
        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    started = _started(pid)
    if started is None:  # the sweep died before this worker got here
        os.kill(os.getpid(), signal.SIGKILL)
    _WATCHED.append(pid)
    threading.Thread(target=_watch, args=(pid, started), name="kernelzoo-sweep-watch",
                     daemon=True).start()


_WATCHED: list[int] = []


def _watch(pid: int, started, every: float = 0.5) -> None:
    while _started(pid) == started:
        time.sleep(every)
    os.kill(os.getpid(), signal.SIGKILL)


def _started(pid: int):
    """When ``pid`` started (its /proc start time; elsewhere True), None once it is gone or a
    zombie: with the start time, a pid reused by another process counts as gone."""
    if not Path("/proc/self/stat").exists():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return True
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else fields[19]


class _Unread:
    """A text stream whose reader may go away: a write that meets a broken pipe (``sweep |
    head -1``) is dropped and the stream's descriptor pointed at /dev/null, so that no later
    write, nor the flush at exit, meets it again."""

    def __init__(self, stream):
        self._stream = stream

    def _gone(self) -> None:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, self._stream.fileno())
            os.close(null)

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._gone()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._gone()

    def __getattr__(self, name):
        return getattr(self._stream, name)


def survive_closed_output() -> None:
    """From now on, a closed stdout or stderr costs this process its output, never a run
    (``_Unread``)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, _Unread):
            setattr(sys, name, _Unread(stream))


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


_WARNED: list = []  # the scheduler's handler of its warning, once the warning came


def checkpoint_on_warning() -> None:
    """In a job whose scheduler warns it before its time limit or a preemption (SIGUSR2, which
    submitit handles by requeueing the job): take the warning over, so that the runs checkpoint
    at their next evaluation (``warned``), then hand it to submitit (``requeue``). Elsewhere
    (no handler of SIGUSR2 installed) nothing changes."""
    previous = signal.getsignal(signal.SIGUSR2)
    if not callable(previous):
        return

    def handler(signum, frame):
        if not _WARNED:
            _WARNED.append(lambda: previous(signum, frame))

    signal.signal(signal.SIGUSR2, handler)


def warned() -> bool:
    """True once the scheduler has warned this job (``checkpoint_on_warning``)."""
    return bool(_WARNED)


def requeue() -> None:
    """Hand the warning to submitit's handler: it requeues the job and ends this process."""
    _WARNED[0]()


def cancel_slurm_jobs(folder: str | Path) -> list[str]:
    """``scancel`` the SLURM jobs a sweep submitted: the job ids that name the folders submitit
    made under ``folder`` (``submitit_folder`` up to its ``%j``: the sweep's own, in its sweep
    directory, so no other sweep's job is there; an array task's folder, ``<array id>_<task>``,
    names its array). The ids cancelled; none without scancel."""
    root = Path(str(folder).split("%j")[0])
    ids = sorted({d.name.split("_")[0] for d in (root.iterdir() if root.is_dir() else [])
                  if d.is_dir() and d.name.split("_")[0].isdigit()})
    if ids and shutil.which("scancel"):
        subprocess.run(["scancel", *ids], check=False, timeout=60)
        return ids
    return []


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
