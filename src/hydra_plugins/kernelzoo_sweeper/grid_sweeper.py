"""A Hydra sweeper over a union of grids, so one experiment can give every map its own key range.

Hydra's basic sweeper runs one Cartesian product. A capacity study needs several (the keys that
span DPFP-3's capacity are not ELU's), so ``hydra.sweeper.grids`` is a list of products in the
basic sweeper's syntax; the union of their points (duplicates dropped) goes to whichever launcher
is configured (basic, joblib for local workers, submitit for SLURM). Command-line sweeps and
overrides apply to every grid and win over it, e.g. ``seed=1,2,3`` or ``trainer=smoke``.

With ``search=bisect`` the same grids define configurations and their n_keys ranges, and the
points are chosen round by round by the failure-point search (``search_rounds.py``) instead.

After the launch it prints one line of totals and appends this invocation to
``<results_dir>/<experiment>/sweep.json`` (points, outcomes, wall seconds).
"""

import json
import os
import time
from collections import Counter
from pathlib import Path

from filelock import FileLock
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import JobStatus
from omegaconf import OmegaConf

from kernelzoo import progress
from kernelzoo.store import atomic_write_text, cpu_model, experiment_dir, point_done, sweep_file


def machine() -> str:
    """CPU model, cores and torch version of the machine running the sweep, for the report."""
    import torch

    gpu = f", {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else ""
    return f"{cpu_model()}, {os.cpu_count()} cores{gpu}, torch {torch.__version__}"


OUTCOMES = ("converged", "plateau", "max_steps", "diverged", "infeasible", "skipped", "failed")


class GridSweeper(BasicSweeper):
    def __init__(self, max_batch_size=None, params=None, grids=None):
        super().__init__(max_batch_size=max_batch_size, params=params or {})
        self.grids = list(grids or [{}])

    def _points(self, arguments: list[str]) -> tuple[list[list[str]], list[list[str]]]:
        """All points of the union of grids, and the first point of each grid."""
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        points, firsts, seen = [], [], set()
        for grid in self.grids:
            params = [f"{k}={v}" for k, v in {**self.params, **grid}.items()] + list(arguments)
            grid_points = self.split_arguments(parser.parse_overrides(params), None)[0]
            firsts.append(grid_points[0])
            for point in grid_points:
                if tuple(point) not in seen:
                    seen.add(tuple(point))
                    points.append(point)
        return points, firsts

    def _finished(self, point: list[str]) -> bool:
        """Known finished without composing its config: the store's index names a done run."""
        if self.config.force or self.config.dry_run:
            return False
        return point_done(self.config.results_dir, self.config.experiment, point)

    def sweep(self, arguments: list[str]):
        start = time.time()
        points, firsts = self._points(arguments)
        # a typo in a grid fails here, before anything trains; each point is checked again
        # when it is composed for its job
        self.validate_batch_is_legal(firsts)
        sweep_dir = Path(self.config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        self.outcomes: Counter = Counter()
        self.first_job = 0
        if self.config.search.name == "bisect":
            from .search_rounds import SearchRounds

            returns, record = SearchRounds(self).run(points)
        else:
            returns, record = self._grid(points), {"points": len(points)}
        wall = time.time() - start
        line = ", ".join(f"{k} {self.outcomes[k]}" for k in OUTCOMES if self.outcomes[k])
        print(f"sweep {self.config.experiment} finished in {wall / 60:.1f} min: {line or 'nothing'}")
        if not self.config.dry_run:
            self._record(record, start, wall)
        return returns

    def _grid(self, points: list[list[str]]) -> list:
        """Launch every point not known to be finished, in batches of max_batch_size."""
        todo = [p for p in points if not self._finished(p)]
        self.outcomes["skipped"] += len(points) - len(todo)
        print(f"sweep {self.config.experiment}: {len(points)} points, "
              f"{len(points) - len(todo)} already done")
        return self.launch(todo)

    def launch(self, points: list[list[str]], label: str = "") -> list:
        """Run ``points`` through the launcher (batches of max_batch_size); count outcomes.
        Each job prints a progress line (k/N, elapsed, ETA) when it ends (``progress.py``)."""
        if points and not self.config.dry_run:
            progress.start(self.config.hydra.sweep.dir, len(points), label)
        returns, self.batch_index = [], 0
        self.overrides = list(self.split_overrides_to_chunks(points, self.max_batch_size)) if points else []
        while not self.is_done():
            batch = self.get_job_batch()
            results = self.launcher.launch(batch, initial_job_idx=self.first_job)
            for r in results:
                if r.status == JobStatus.COMPLETED:
                    self.outcomes[r.return_value or "skipped"] += 1
                else:
                    self.outcomes["failed"] += 1
            self.first_job += len(batch)
            returns.append(results)
        return returns

    def _record(self, record: dict, start, wall) -> None:
        path = sweep_file(experiment_dir(self.config.results_dir, self.config.experiment))
        with FileLock(str(path) + ".lock"):  # two sweeps on one store each keep their record
            self._append(path, record, start, wall)

    def _append(self, path, record: dict, start, wall) -> None:
        history = json.loads(path.read_text()) if path.is_file() else {"invocations": []}
        history["invocations"].append({
            "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(start)),
            **record, "outcomes": dict(self.outcomes), "wall_seconds": round(wall, 1),
            "launcher": self.config.hydra.launcher._target_.rsplit(".", 1)[-1],
            "machine": machine()})
        history["wall_seconds"] = round(sum(i["wall_seconds"] for i in history["invocations"]), 1)
        atomic_write_text(path, json.dumps(history, indent=2) + "\n")
