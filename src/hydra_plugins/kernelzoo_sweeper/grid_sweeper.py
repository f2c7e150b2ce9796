"""A Hydra sweeper over a union of grids, so one experiment can give every map its own key range.

Hydra's basic sweeper runs one Cartesian product. A capacity study needs several (the keys that
span DPFP-3's capacity are not ELU's), so ``hydra.sweeper.grids`` is a list of products in the
basic sweeper's syntax; the union of their points (duplicates dropped) goes to whichever launcher
is configured (basic, joblib for local workers, submitit for SLURM). Command-line sweeps and
overrides apply to every grid and win over it, e.g. ``seed=1,2,3`` or ``trainer=smoke``;
``grids=[1]`` runs only the second grid, and its points are those of a sweep of every grid.

With ``search=bisect`` the same grids define configurations and their n_keys ranges, and the
points are chosen round by round by the failure-point search (``search_rounds.py``) instead.
With ``stall_check=true``, the sweep's stalled runs are then retrained with a longer stopping rule
(``stall_checks.py``), as one more launcher batch.

Before anything is written, every point not known finished is composed and checked
(``points.py``): a bad value anywhere ends the sweep with one line. Points that differ only in
n_keys and seed are launched as one job, a pack (``packs.py``: ``Job``). SIGTERM, SIGINT or SIGHUP
stops the workers and records the interruption, and a SIGKILL takes the workers with it
(``kernelzoo.training.interrupt``). After the launch it prints one
line of totals and appends this invocation to ``<results_dir>/<experiment>/sweep.json``
(points, outcomes, wall seconds, and ``interrupted`` with the signal when it was stopped).
"""

import contextlib
import importlib.metadata
import json
import os
import sys
import time
from collections import Counter
from concurrent.futures import BrokenExecutor
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import JobStatus
from hydra.errors import HydraException
from omegaconf import OmegaConf

from kernelzoo import config
from kernelzoo.config.hydra_internals import sweeper_base
from kernelzoo.records import files, history, progress, store, tracking
from kernelzoo.training import interrupt, shm
from kernelzoo.config.words import plural

from .packs import Point, jobs
from .points import check_launcher, check_points, fail, override_key


GPU_DEVICES = ("/dev/nvidiactl", "/dev/kfd")  # CUDA's and ROCm's: torch sees no GPU without one


def machine() -> str:
    """CPU model, cores, GPU and torch version of the machine running the sweep, for the
    report. torch is loaded to name the GPU only where one may be: a sweep whose every point
    is done loads none."""
    if "torch" in sys.modules or any(map(os.path.exists, GPU_DEVICES)):
        import torch

        gpu = f", {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else ""
        version = torch.__version__
    else:
        gpu, version = "", importlib.metadata.version("torch")
    return f"{history.cpu_model()}, {os.cpu_count()} cores{gpu}, torch {version}"


def batch_size(max_batch_size: int | None, launcher) -> int | None:
    """Jobs launched at once: ``max_batch_size`` when set; for submitit's local executor, which
    starts every job it is given at once, as many as the cores hold (cores over
    ``cpus_per_task``); otherwise all (the launcher keeps its own parallelism)."""
    if max_batch_size is not None or not str(launcher.get("_target_", "")).endswith(
            ".LocalLauncher"):
        return max_batch_size
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cores or 1) // max(1, launcher.get("cpus_per_task") or 1))


def private_job_folder(launcher) -> None:
    """A submitit launcher's job folder (``submitit_folder`` up to its ``%j``: this sweep's
    own, under its sweep directory), made owner-only before anything is submitted: the pickles
    in it are what a job runs, as the sweep's owner, so nobody else may write, rename or read
    there whatever the umask (a group-shared store's 002)."""
    folder = launcher.get("submitit_folder")
    if folder:
        path = Path(str(folder).split("%j")[0])
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(path, 0o700)


def launcher_words(cfg) -> str:
    """How the jobs run, for the sweep's log line: the launcher and its parallelism."""
    launcher = cfg.hydra.launcher
    name = launcher._target_.rsplit(".", 1)[-1]
    threads = plural(cfg.trainer.threads, "thread")
    if name == "JoblibLauncher" and launcher.n_jobs == -1:
        from kernelzoo.training.workers import usable_cores

        return (f"{name}, one worker per usable core: up to {usable_cores()} of "
                f"{plural(os.cpu_count() or 1, 'core')}, {threads} each")
    if name == "JoblibLauncher":
        from joblib import effective_n_jobs

        return f"{name}, {plural(effective_n_jobs(launcher.n_jobs), 'worker')} " \
               f"(n_jobs={launcher.n_jobs}), {threads} each"
    return name


def slurm_array(cfg, jobs: list[list[str]], label: str = "") -> str:
    """A dry run's listing of the SLURM array a launch would submit: its settings and each
    job's overrides (a pack of runs), without SLURM."""
    lc = cfg.hydra.launcher
    keys = ("partition", "account", "qos", "cpus_per_task", "gpus_per_node", "mem_gb",
            "timeout_min", "signal_delay_s", "max_num_timeout", "array_parallelism")
    head = (f"slurm array {lc.name}{f' ({label})' if label else ''}: "
            f"{plural(len(jobs), 'job')}, " + " ".join(f"{k}={lc.get(k)}" for k in keys)
            + f", setup {list(lc.get('setup') or [])}")
    listed = [[o for o in job if override_key(o) != "dry_run"] for job in jobs]
    return "\n".join([head, *(f"  job {i}: {' '.join(job)}" for i, job in enumerate(listed))])


def job_errors() -> tuple[type, ...]:
    """submitit's errors for a job that ended without its result (killed: SIGKILL, the OOM
    killer, a node lost), where submitit is installed."""
    try:
        from submitit.core.utils import FailedJobError, UncompletedJobError
    except ImportError:
        return ()
    return (FailedJobError, UncompletedJobError)


OUTCOMES = ("converged", "plateau", "max_steps", "diverged", "infeasible", "skipped", "failed")


class GridSweeper(sweeper_base()):
    def __init__(self, max_batch_size=None, params=None, grids=None):
        super().__init__(max_batch_size=max_batch_size, params=params or {})
        self.grids = list(grids or [{}])
        self.warned: set[str] = set()

    def _points(self, arguments: list[str]) -> tuple[list[list[str]], int]:
        """The points of the union of the selected grids (``grids``; null: all), in order, each
        once, and how many points all grids hold. The ``grids=`` override itself is no part of
        a point, so a point runs and is indexed as in a sweep of every grid."""
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        for override in parser.parse_overrides(arguments):
            if override.key_or_group == "grids" and override.is_sweep_override():
                fail(f"{override.input_line} is a sweep, not a selection; valid: a list, "
                     "e.g. grids=[0,2]")
            if override.key_or_group == "stall_check" and override.is_sweep_override():
                fail(f"{override.input_line} is a sweep, not a setting; valid: stall_check=true "
                     "or false")
        # what the sweeper does, not what a point is: points run and are indexed as without them
        arguments = [a for a in arguments if override_key(a) not in ("grids", "stall_check")]
        selected = self._selected()
        points, seen, total = [], set(), set()
        for index, grid in enumerate(self.grids):
            params = [f"{k}={v}" for k, v in {**self.params, **grid}.items()] + list(arguments)
            for point in self.split_arguments(parser.parse_overrides(params), None)[0]:
                total.add(tuple(point))
                if index in selected and tuple(point) not in seen:
                    seen.add(tuple(point))
                    points.append(point)
        return points, len(total)

    def _selected(self) -> list[int]:
        """The indices ``grids`` selects, checked against the experiment's grids."""
        chosen = self.config.grids
        if chosen is None:
            return list(range(len(self.grids)))
        bad = [i for i in chosen if not 0 <= i < len(self.grids)]
        if bad or not chosen:
            what = f": {self.config.experiment} has no grid {bad[0]}" if bad else " selects no grid"
            listing = "; ".join(f"{i}: " + " ".join(f"{k}={v}" for k, v in g.items())
                                for i, g in enumerate(self.grids))
            fail(f"grids={list(chosen)}{what}; valid: indices from 0 to {len(self.grids) - 1}"
                 f", e.g. grids=[0] ({listing})")
        return list(chosen)

    def indexed(self, point: list[str]) -> dict | None:
        """The summary of the finished run the store's index names for ``point``, or None; a
        damaged index entry is named once and the point goes through the normal path."""
        try:
            return store.point_summary(self.config.results_dir, self.config.experiment, point)
        except store.StoreError as err:
            if str(err) not in self.warned:
                self.warned.add(str(err))
                print(f"warning: {err}; the point is checked and run again", file=sys.stderr)
            return None

    def sweep(self, arguments: list[str]):
        start = time.time()
        try:
            points, grid_points = self._points(arguments)
        except HydraException as err:
            fail(config.describe(err, arguments))
        try:  # nothing is read or written through a link out of the store
            store.guard_experiment(self.config.results_dir, self.config.experiment)
            if self.config.logger.name == "wandb":
                tracking.guard_wandb(self.config.results_dir)
        except store.StoreError as err:
            fail(str(err))
        search = self.config.search.name == "bisect"
        chosen = {"grids": list(self.config.grids)} if self.config.grids is not None else {}
        planned = {"points": len(points), "experiment_points": grid_points, **chosen}
        known = not (search or self.config.force or self.config.dry_run)  # finished: skipped
        todo = [p for p in points if not known or self.indexed(p) is None]
        self.plans = check_points(self, todo)
        check_launcher(self.config)
        try:
            config.writable(self.config.results_dir)
        except config.UsageError as err:
            fail(str(err))
        if self.config.logger.name == "wandb" and not self.config.dry_run:
            tracking.check_server(self.config.results_dir)
            print(tracking.where(self.config.results_dir, self.config.logger.project))
        interrupt.mark_sweep()  # its workers die with it, however it ends
        leftovers = shm.clean()
        if leftovers:
            print(f"removed {len(leftovers)} files and folders of {shm.SHM} "
                  "left by killed sweeps' workers")
        owner = shm.Owner()  # what its workers keep in /dev/shm is known as this sweep's
        sweep_dir = Path(self.config.hydra.sweep.dir)
        self.outcomes: Counter = Counter({"skipped": len(points) - len(todo)} if not search else {})
        self.first_job = 0
        self.stall_checks: dict | None = None  # stall_check=true: its counts (stall_checks.py)
        rounds = None
        try:
            try:  # a new directory: never one planted under the name (a link) followed
                store.make_dir(self.config.results_dir, sweep_dir)
            except store.StoreError as err:
                fail(str(err))
            OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
            if not self.config.dry_run:  # a dry run submits nothing and logs nothing
                private_job_folder(self.config.hydra.launcher)
                print(f"logs: {sweep_dir}/<job>/train.log ({launcher_words(self.config)})")
            if search:
                from .search_rounds import SearchRounds

                rounds = SearchRounds(self)
                returns = rounds.run(points)
            else:
                part = (f", grids {list(self.config.grids)}: {len(points)} of its "
                        f"{plural(grid_points, 'point')}" if self.config.grids is not None
                        else f": {plural(len(points), 'point')}")
                print(f"sweep {self.config.experiment}{part}, " +
                      (f"a dry run: each is named below, done or to train (launcher: "
                       f"{launcher_words(self.config)})" if self.config.dry_run
                       else f"{len(points) - len(todo)} already done"))
                returns = self.launch(self.checked(todo))
            if self.config.stall_check:
                from . import stall_checks

                probes = [(s.point(p["n_keys"]), p.get("run_id")) for s in rounds.series
                          for p in s.probes] if rounds else [(p, None) for p in points]
                returns += stall_checks.run(self, [p for p, run_id in probes if not run_id],
                                            {run_id: p for p, run_id in probes if run_id})
        except interrupt.Interrupted as stop:
            interrupt.stop_workers()
            if self.config.hydra.launcher._target_.endswith(".SlurmLauncher"):
                cancelled = interrupt.cancel_slurm_jobs(self.config.hydra.launcher.submitit_folder)
                if cancelled:
                    print(f"cancelled SLURM {plural(len(cancelled), 'job')} (scancel "
                          f"{' '.join(cancelled)})", file=sys.stderr)
            record = {**rounds.record(), **chosen} if rounds else planned
            wall = time.time() - start
            self._record({**record, "interrupted": stop.name}, start, wall)
            raise interrupt.Interrupted(stop.signum, (
                f"sweep {self.config.experiment} stopped by {stop.name} after "
                f"{wall / 60:.1f} min ({self._totals() or 'nothing finished'}); its workers are "
                "stopped, runs in flight have no summary and a rerun continues them from their "
                "checkpoints, if any")) from None
        except (OSError, BrokenExecutor, *job_errors()) as err:
            # a full disk or a read-only store, here or in a worker (Hydra's job directories
            # included); a worker killed (loky names the signal); a submitit job killed
            interrupt.stop_workers()
            record = {**rounds.record(), **chosen} if rounds else planned
            why = [w.strip() for w in str(err).splitlines() if "exit code" in w] \
                or str(err).splitlines()[:1] or ["no reason given"]
            line = files.one_line(err) if isinstance(err, OSError) else (
                f"a worker of the sweep ended by itself ({type(err).__name__}: {why[0]}); its "
                "other workers are stopped, runs in flight have no summary and a rerun continues "
                "them")
            with contextlib.suppress(OSError):
                self._write_record({**record, "failed": line}, start, time.time() - start)
            print(f"error: {line}", file=sys.stderr)
            sys.exit(1)
        finally:
            owner.close()
        wall = time.time() - start
        print(f"sweep {self.config.experiment}: a dry run, nothing trained" if self.config.dry_run
              else f"sweep {self.config.experiment} finished in {wall / 60:.1f} min: "
                   f"{self._totals() or 'nothing'}")
        self._record({**rounds.record(), **chosen} if rounds else planned, start, wall)
        return returns

    def _totals(self) -> str:
        return ", ".join(f"{k} {self.outcomes[k]}" for k in OUTCOMES if self.outcomes[k])

    def launch(self, points: list[Point], label: str = "") -> list:
        """Run ``points`` through the launcher, packed (``packs.jobs``), in batches of
        max_batch_size jobs; count outcomes (in a batch a signal stopped, the jobs that ended
        before it, as the store's index has them: a pack still in flight counts none of its runs,
        not even those that had left it). Each run prints a progress line (k/N, elapsed, ETA)
        when its job ends (``progress.py``)."""
        returns, self.batch_index = [], 0
        packed = jobs(points)
        how = self.fill(packed) if points else ""
        if points and not self.config.dry_run:
            from kernelzoo.training.packing import step_cost

            progress.start(self.config.hydra.sweep.dir, len(points), label,
                           sum(step_cost(p.n_keys) for p in points), how)
        self.jobs = {tuple(j.overrides()): j for j in packed}  # a job's overrides: the job
        overrides = [j.overrides() for j in packed]
        batch = batch_size(self.max_batch_size, self.config.hydra.launcher)
        self.overrides = list(self.split_overrides_to_chunks(overrides, batch)) if overrides else []
        if self.config.dry_run and self.config.hydra.launcher._target_.endswith(".SlurmLauncher"):
            print(slurm_array(self.config, overrides, label))  # submits nothing
            return returns
        while not self.is_done():
            batch = self.get_job_batch()
            try:
                results = self.launcher.launch(batch, initial_job_idx=self.first_job)
            except interrupt.Interrupted:  # the batch's jobs that ended before it: indexed
                self.outcomes.update(s["status"] for job in batch
                                     for point in self.jobs[tuple(job)].points
                                     if (s := self.indexed(list(point.overrides))) is not None)
                raise
            for r, job in zip(results, batch):
                if r.status == JobStatus.COMPLETED:
                    for status in r.return_value:
                        self.outcomes[status or "skipped"] += 1
                else:
                    self.outcomes["failed"] += self.jobs[tuple(job)].runs
            self.first_job += len(batch)
            returns.append(results)
        return returns

    def fill(self, packed: list) -> str:
        """Under joblib with n_jobs=-1, set the workers of this launch to
        ``workers.workers`` of its jobs (one per usable core, at most one per job, as many as
        memory holds at the largest job's estimate; one on a GPU; one, in this process, for a
        dry run, which only plans); the words for the progress line: "2 workers x 1 thread" (""
        for other launchers, whose parallelism is their own)."""
        launcher = self.config.hydra.launcher
        threads = plural(self.config.trainer.threads, "thread")
        if not launcher._target_.endswith(".JoblibLauncher"):
            return ""
        if launcher.n_jobs != -1:
            from joblib import effective_n_jobs

            return f"{plural(effective_n_jobs(launcher.n_jobs), 'worker')} x {threads}"
        import torch
        from kernelzoo.training import devices, workers

        gpu = any(p.gpu for j in packed for p in j.points)
        n = 1 if self.config.dry_run else workers.workers(
            len(packed), workers.usable_cores(), max(j.memory for j in packed),
            devices.device_memory(torch.device("cpu")), gpu)
        self.launcher.joblib["n_jobs"] = n
        return f"{plural(n, 'worker')} x {threads}"

    def checked(self, points: list[list[str]]) -> list[Point]:
        """``points`` as the launcher's records, each from its check (``self.plans``)."""
        return [Point.of(p, self.plans[tuple(sorted(p))]) for p in points]

    def _record(self, record: dict, start, wall) -> None:
        """Append this invocation to sweep.json (``_write_record``); one line and exit code 1
        when it cannot be written."""
        try:
            self._write_record(record, start, wall)
        except OSError as err:
            print(f"error: {files.one_line(err)}", file=sys.stderr)
            sys.exit(1)

    def _write_record(self, record: dict, start, wall) -> None:
        """Append this invocation to sweep.json (a damaged one is kept aside, never lost);
        OSError naming the file when it cannot be written."""
        if self.config.dry_run:
            return
        if self.stall_checks is not None:  # its checks are points of this invocation too
            record = {**record, "points": record["points"] + self.stall_checks["launched"],
                      "stall_checks": self.stall_checks}
        path = history.sweep_file(store.experiment_dir(self.config.results_dir,
                                                     self.config.experiment))
        with files.lock(str(path) + ".lock"):  # two sweeps on one store each keep their record
            try:
                past = history.read_sweep(path.parent) or {"invocations": []}
            except store.StoreError as err:
                print(history.set_aside(path, err), file=sys.stderr)
                past = {"invocations": []}
            past["invocations"].append({
                "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(start)),
                **record, "outcomes": dict(self.outcomes), "wall_seconds": round(wall, 1),
                "launcher": self.config.hydra.launcher._target_.rsplit(".", 1)[-1],
                "machine": machine()})
            past["wall_seconds"] = round(sum(i["wall_seconds"]
                                              for i in past["invocations"]), 1)
            files.atomic_write_text(path, json.dumps(past, indent=2) + "\n")
