"""Shared fixtures and helpers for the end-to-end tests (tests/test_sweep.py, test_reliability.py).

Everything here drives the real command lines (``python -m kernelzoo.train``, ``kernelzoo.sweep``,
``kernelzoo.analyze``, ``make sweep``) in subprocesses, with an environment that keeps wandb
offline and silent and its files in a temporary directory, and one torch thread per process.

The smoke sweep is the most expensive fixture, so it runs once per test session, shared by the
pytest-xdist workers (``smoke_results``); tests that change a results store work on a copy
(``copy_results``). ``slow_but`` keeps a parametrized check's representative cases in
``make test`` and moves the others to ``make test-slow``.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src"
PYTHON = sys.executable
SMOKE_POINTS = 6        # experiments/smoke.yaml: 6 points, one of them infeasible
SMOKE_INFEASIBLE = 1
# the fast defaults of a single run: tiny model, 300 steps at most, no tracking, one thread
TINY = ["trainer=smoke", "logger=none", "trainer.threads=1", "d_key=4", "n_keys=3"]

DONE = re.compile(r"^done (\S+): (\S+)", re.M)
SKIP = re.compile(r"^skip (\S+):", re.M)
INFEASIBLE = re.compile(r"^infeasible (\S+): (.*)$", re.M)


def base_env(tmp: Path) -> dict:
    """The environment of every CLI call: offline, silent wandb under ``tmp``; unbuffered output
    (so a SIGKILLed process loses no printed line); one thread; no Hydra full tracebacks."""
    env = dict(os.environ)
    for key in ("WANDB_API_KEY", "WANDB_BASE_URL", "WANDB_ENTITY", "WANDB_PROJECT",
                "HYDRA_FULL_ERROR", "WANDB_INIT_TIMEOUT"):
        env.pop(key, None)
    wandb_dir = tmp / "wandb-home"
    wandb_dir.mkdir(parents=True, exist_ok=True)
    env.update({
        "PYTHONPATH": os.pathsep.join(p for p in (str(SRC), env.get("PYTHONPATH")) if p),
        "PYTHONUNBUFFERED": "1",
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(wandb_dir),
        "WANDB_CONFIG_DIR": str(wandb_dir / "config"),
        "WANDB_CACHE_DIR": str(wandb_dir / "cache"),
        "WANDB_DATA_DIR": str(wandb_dir / "data"),
        "WANDB_SILENT": "true",
        "OMP_NUM_THREADS": "1",
        # pytest-xdist runs a test per core: a sweep in a test gets one worker, in its process
        # (joblib's own limit; a test of the workers sets its own)
        "LOKY_MAX_CPU_COUNT": "1",
        "MKL_NUM_THREADS": "1",
        "TQDM_DISABLE": "1",
    })
    return env


@pytest.fixture
def cli_env(tmp_path) -> dict:
    return base_env(tmp_path)


@dataclass
class Result:
    """A finished CLI call."""

    args: list
    returncode: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    def explain(self) -> str:
        return (f"$ {' '.join(map(str, self.args))}\nexit {self.returncode} after "
                f"{self.seconds:.1f} s\n--- stdout\n{self.stdout[-4000:]}\n"
                f"--- stderr\n{self.stderr[-4000:]}")


def run_cmd(args: list, env: dict, timeout: float = 300, cwd: Path = REPO) -> Result:
    start = time.monotonic()
    proc = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)
    return Result(args, proc.returncode, proc.stdout, proc.stderr, time.monotonic() - start)


def train(overrides: list, env: dict, timeout: float = 300) -> Result:
    """``python -m kernelzoo.train <overrides>`` (one run, or a --multirun sweep)."""
    return run_cmd([PYTHON, "-m", "kernelzoo.train", *overrides], env, timeout)


def sweep(experiment: str, overrides: list, env: dict, timeout: float = 300,
          analysis: bool = False) -> Result:
    """``python -m kernelzoo.sweep <experiment> <overrides>``, without the analysis that follows
    a sweep unless ``analysis`` (the tests of sweeping read the store, not the report)."""
    return run_cmd([PYTHON, "-m", "kernelzoo.sweep", experiment, *overrides,
                    *([] if analysis else ["--no-analysis"])], env, timeout)


def analyze(overrides: list, env: dict, timeout: float = 300) -> Result:
    return run_cmd([PYTHON, "-m", "kernelzoo.analyze", *overrides], env, timeout)


def slow_but(keep, values) -> list:
    """Parameters for ``pytest.mark.parametrize``: the values in ``keep`` run in ``make test``,
    the others, the same check on more cases, under ``make test-slow``. A tuple value is a
    row of several arguments, kept when the row or its first argument is in ``keep``."""
    def param(v):
        args = v if isinstance(v, tuple) else (v,)
        fast = v in keep or args[0] in keep
        return pytest.param(*args, marks=() if fast else pytest.mark.slow)
    return [param(v) for v in values]


def cgroup_tree(tmp: Path, lines: str, files: dict) -> tuple[Path, Path]:
    """A fake /proc/self/cgroup (``lines``) and cgroup mount (``files``: path -> text) under
    ``tmp``: the (proc, root) that the readers of cgroup limits take."""
    tmp.mkdir(parents=True, exist_ok=True)
    proc = tmp / "cgroup"
    proc.write_text(lines)
    for name, value in files.items():
        (tmp / "sys" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp / "sys" / name).write_text(value)
    return proc, tmp / "sys"


def smoke_args(results: Path, *extra) -> list:
    return [f"results_dir={results}", "trainer.threads=1", *extra]


# ------------------------------------------------------------------ background runs and kills

class Background:
    """A CLI call in its own session (process group), output to files, killable as a group."""

    def __init__(self, args: list, env: dict, log_dir: Path, name: str):
        log_dir.mkdir(parents=True, exist_ok=True)
        self.args = [str(a) for a in args]
        self.out_path, self.err_path = log_dir / f"{name}.out", log_dir / f"{name}.err"
        self._out, self._err = open(self.out_path, "w"), open(self.err_path, "w")
        self.proc = subprocess.Popen(self.args, cwd=REPO, env=env, stdout=self._out,
                                     stderr=self._err, start_new_session=True)
        self.pgid = self.proc.pid  # start_new_session: the leader's pid is the group id
        self.killed = False

    @property
    def stdout(self) -> str:
        return self.out_path.read_text()

    @property
    def stderr(self) -> str:
        return self.err_path.read_text()

    def done_ids(self) -> list[str]:
        return [m.group(1) for m in DONE.finditer(self.stdout)]

    def wait_for(self, predicate, timeout: float, poll: float = 0.05) -> bool:
        """Poll until ``predicate(self)`` or the process ends or ``timeout``; True if it held."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if predicate(self):
                return True
            if self.proc.poll() is not None:
                return predicate(self)
            time.sleep(poll)
        return predicate(self)

    def kill(self) -> None:
        """SIGKILL the whole process group and wait until none of its processes is left."""
        self.killed = True
        with _suppress(ProcessLookupError):
            os.killpg(self.pgid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        end = time.monotonic() + 30
        while time.monotonic() < end and _group_alive(self.pgid):
            with _suppress(ProcessLookupError):
                os.killpg(self.pgid, signal.SIGKILL)
            time.sleep(0.05)
        assert not _group_alive(self.pgid), f"processes of group {self.pgid} survived SIGKILL"
        self.close()

    def wait(self, timeout: float = 300) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            self.close()

    def close(self) -> None:
        for f in (self._out, self._err):
            if not f.closed:
                f.close()

    def ensure_dead(self) -> None:
        if self.proc.poll() is None or _group_alive(self.pgid):
            self.kill()
        self.close()


class _suppress:
    def __init__(self, *exc):
        self.exc = exc

    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        return kind is not None and issubclass(kind, self.exc)


def _group_alive(pgid: int) -> bool:
    """True while some process (not a zombie) of group ``pgid`` is left."""
    return bool(group_members(pgid))


def group_members(pgid: int) -> list[str]:
    """The live processes (not zombies) of group ``pgid``, each as "pid: command line", for an
    assertion's message."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text.rsplit(")", 1)[-1].split()
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z":
            try:
                line = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                line = "?"
            found.append(f"{stat.parent.name}: {line[:200]}")
    return found


@pytest.fixture
def background(tmp_path):
    """Factory of Background processes; whatever is still running at teardown is killed."""
    started: list[Background] = []

    def start(args, env, name="run"):
        bg = Background(args, env, tmp_path / "logs", f"{name}-{len(started)}")
        started.append(bg)
        return bg

    yield start
    for bg in started:
        bg.ensure_dead()


# ------------------------------------------------------------------ reading a results store

def runs_dir(results: Path, experiment: str) -> Path:
    return Path(results) / experiment / "runs"


def run_ids(results: Path, experiment: str) -> list[str]:
    d = runs_dir(results, experiment)
    return sorted(p.name for p in d.iterdir() if p.is_dir()) if d.is_dir() else []


def read_all(results: Path, experiment: str) -> dict:
    """run_id -> summary for every run directory; fails if one lacks a valid summary."""
    from kernelzoo.records import store

    out = {}
    for rid in run_ids(results, experiment):
        summary = store.read_summary(runs_dir(results, experiment) / rid)
        assert summary["run_id"] == rid, (rid, summary["run_id"])
        out[rid] = summary
    return out


def done_counts(*texts: str) -> dict:
    counts: dict = {}
    for text in texts:
        for m in DONE.finditer(text):
            counts[m.group(1)] = counts.get(m.group(1), 0) + 1
    return counts


def leftover_temp_files(root: Path) -> list[Path]:
    """Temp files of atomic writes (``.<name>.<random>``) left under the runs directories."""
    return sorted(p for p in Path(root).rglob(".*.*") if p.is_file()
                  and p.name != ".claim" and "wandb" not in p.parts)


def snapshot(path: Path) -> dict:
    """relative path -> (bytes, mtime_ns) of every file under ``path`` (to prove it untouched)."""
    return {str(p.relative_to(path)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(Path(path).rglob("*")) if p.is_file()}


def copy_results(src: Path, dst: Path) -> Path:
    """A copy of a results store without Hydra's logs (so the copy is cheap)."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("hydra", "wandb"))
    return dst


# ------------------------------------------------------------------ the session's smoke sweep

@dataclass
class SmokeSweep:
    results: Path
    result: Result
    env: dict


def once_per_session(tmp_path_factory, worker_id: str, name: str, make):
    """``make(root)`` once per test session, shared by the pytest-xdist workers: the first
    worker to need it calls it, under a file lock, with a directory ``name`` in the base
    temporary directory they share, and pickles what it returns beside it; the others load
    that. What ``make`` writes must stay as it left it (tests copy before changing)."""
    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    root = (base.parent if worker_id != "master" else base) / name
    record = root.with_name(name + ".pickle")
    with FileLock(str(root) + ".lock"):
        if record.exists():
            return pickle.loads(record.read_bytes())
        root.mkdir(parents=True, exist_ok=True)
        value = make(root)
        record.write_bytes(pickle.dumps(value))
        return value


@pytest.fixture(scope="session")
def smoke_results(tmp_path_factory, worker_id) -> SmokeSweep:
    """``python -m kernelzoo.sweep smoke`` once per test session (``once_per_session``) into a
    fresh results directory.

    Tests must not modify it: copy it with ``copy_results`` first.
    """
    def make(root):
        env = base_env(root)
        results = root / "results"
        return SmokeSweep(results, sweep("smoke", smoke_args(results), env, timeout=300), env)

    return once_per_session(tmp_path_factory, worker_id, "smoke", make)


def json_file(path: Path):
    return json.loads(Path(path).read_text())


# ------------------------------------------------------------------ the repository stays clean

def _git_status():
    try:
        return subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=REPO,
                              capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None


@pytest.fixture(scope="session", autouse=True)
def repository_unchanged():
    """The suite writes only under temporary directories: ``git status`` of the repository is
    the same after it as before (a new user's `make test` leaves a clean clone clean)."""
    before = _git_status()
    yield
    after = _git_status()
    if before is not None and after != before:
        changed = sorted(set(after.splitlines()) ^ set(before.splitlines()))
        pytest.fail("the tests changed the repository's files: " + "; ".join(changed[:10]),
                    pytrace=False)


def legend_labels(ax) -> list[str]:
    """The texts of a matplotlib axes' legend, top to bottom ([] without a legend)."""
    found = ax.get_legend()
    return [] if found is None else [text.get_text() for text in found.get_texts()]
