"""A Hydra sweeper over a union of grids, so one experiment can give every map its own key range.

Hydra's basic sweeper runs one Cartesian product. A capacity study needs several (the keys that
span DPFP-3's capacity are not ELU's), so ``hydra.sweeper.grids`` is a list of products in the
basic sweeper's syntax; the union of their points (duplicates dropped) goes to whichever launcher
is configured (basic, joblib for local workers, submitit for SLURM). Command-line sweeps and
overrides apply to every grid and win over it, e.g. ``seed=1,2,3`` or ``trainer=smoke``.

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

from kernelzoo.store import atomic_write_text, cpu_model, experiment_dir, point_done, sweep_file


def machine() -> str:
    """CPU model, cores and torch version of the machine running the sweep, for the report."""
    import torch

    gpu = f", {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else ""
    return f"{cpu_model()}, {os.cpu_count()} cores{gpu}, torch {torch.__version__}"


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
        todo = [p for p in points if not self._finished(p)]
        self.overrides = list(self.split_overrides_to_chunks(todo, self.max_batch_size)) if todo else []
        sweep_dir = Path(self.config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        outcomes: Counter = Counter({"skipped": len(points) - len(todo)})
        returns, first = [], 0
        print(f"sweep {self.config.experiment}: {len(points)} points, "
              f"{len(points) - len(todo)} already done")
        while not self.is_done():
            batch = self.get_job_batch()
            results = self.launcher.launch(batch, initial_job_idx=first)
            for r in results:
                if r.status == JobStatus.COMPLETED:
                    outcomes[r.return_value or "skipped"] += 1
                else:
                    outcomes["failed"] += 1
            first += len(batch)
            returns.append(results)
        wall = time.time() - start
        order = ("converged", "plateau", "max_steps", "diverged", "infeasible", "skipped", "failed")
        line = ", ".join(f"{k} {outcomes[k]}" for k in order if outcomes[k])
        print(f"sweep {self.config.experiment} finished in {wall / 60:.1f} min: {line or 'nothing'}")
        if not self.config.dry_run:
            self._record(points, outcomes, start, wall)
        return returns

    def _record(self, points, outcomes, start, wall) -> None:
        path = sweep_file(experiment_dir(self.config.results_dir, self.config.experiment))
        with FileLock(str(path) + ".lock"):  # two sweeps on one store each keep their record
            self._append(path, points, outcomes, start, wall)

    def _append(self, path, points, outcomes, start, wall) -> None:
        history = json.loads(path.read_text()) if path.is_file() else {"invocations": []}
        history["invocations"].append({
            "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(start)),
            "points": len(points), "outcomes": dict(outcomes), "wall_seconds": round(wall, 1),
            "launcher": self.config.hydra.launcher._target_.rsplit(".", 1)[-1],
            "machine": machine()})
        history["wall_seconds"] = round(sum(i["wall_seconds"] for i in history["invocations"]), 1)
        atomic_write_text(path, json.dumps(history, indent=2) + "\n")
