"""Every point of a sweep composed and checked before the first one trains, and the launcher.

``check_points`` composes each point's config as its job will see it and plans it as a single
run is planned (``kernelzoo.training.plan``: the schema, the device, the feature map, the memory
estimate). A bad value anywhere fails the whole sweep with one line naming the point, before a
directory is made; a point that is merely infeasible (a d_dot its map cannot reach) passes, as
its ``Infeasible`` record, and its job records it with the reason.

Hydra composes a config from scratch for every point (~50 ms). A grid varies mostly plain
values, so ``Composer`` composes once per choice of config groups and applies a point's plain
``key=value`` overrides to a copy, as Hydra applies them: the 240 points of figure2 take four
compositions.
"""

from __future__ import annotations

import copy
import shutil
import sys
from typing import TYPE_CHECKING

from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import DictConfig, open_dict
from omegaconf.errors import OmegaConfBaseException

from kernelzoo import config
from kernelzoo.config import UsageError
from kernelzoo.config.hydra_internals import apply_overrides

if TYPE_CHECKING:  # imported where used: torch loads only once a sweep checks its points
    from kernelzoo.training.plan import Infeasible, Plan


def override_key(override: str) -> str:
    """The key of a ``key=value`` override, without Hydra's ``+``."""
    return override.split("=", 1)[0].lstrip("+")


def override_value(point: list[str], key: str, default) -> str:
    """The value a point's overrides give ``key``, else ``default``."""
    return next((o.split("=", 1)[1] for o in point if override_key(o) == key), default)


def fail(message: str) -> None:
    """End the sweep before anything is written: one line, exit code 2."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


class Composer:
    """Each point's config as its job sees it (no hydra node), with HydraConfig set to the
    point's hydra node so that ``${hydra:...}`` resolves as in the job; ``close`` restores it."""

    def __init__(self, sweeper):
        self.loader, self.master = sweeper.hydra_context.config_loader, sweeper.config
        self.parser = OverridesParser.create(config_loader=self.loader)
        self.composed: dict[tuple, tuple[DictConfig, DictConfig]] = {}
        self.saved = self.current = HydraConfig.instance().cfg

    def _chooses(self, override) -> bool:
        """True for an override that changes the defaults list (a config group, Hydra's own;
        a group of a ``hydra.searchpath`` entry is known by the sweep's choices)."""
        return override.is_hydra_override() or \
            self.loader.repository.group_exists(override.key_or_group) or \
            override.key_or_group in self.master.hydra.runtime.choices

    def __call__(self, point: list[str]) -> DictConfig:
        parsed = self.parser.parse_overrides(point)
        choices = tuple(o.input_line for o in parsed if self._chooses(o))
        if choices not in self.composed:
            full = self.loader.load_sweep_config(self.master, list(choices))
            job = full.copy()
            with open_dict(job):
                del job["hydra"]
            self.composed[choices] = full, job
        full, job = self.composed[choices]
        if self.current is not full:
            HydraConfig.instance().set_config(full)
            self.current = full
        job = copy.deepcopy(job)
        apply_overrides([o for o in parsed if not self._chooses(o)], job)
        return job

    def close(self) -> None:
        HydraConfig.instance().cfg = self.saved


def check_launcher(cfg: DictConfig) -> None:
    """The launcher settings that would fail only at launch, once directories exist: joblib's
    n_jobs, a SLURM launcher where there is no SLURM (a dry run submits nothing: it may)."""
    launcher = cfg.hydra.launcher
    name = launcher._target_.rsplit(".", 1)[-1]
    if name == "JoblibLauncher":
        from joblib import effective_n_jobs

        try:
            effective_n_jobs(launcher.n_jobs)
        except (TypeError, ValueError) as err:
            fail(f"hydra.launcher.n_jobs={launcher.n_jobs} is invalid ({err}); valid: -1 (a "
                 "worker per core) or an integer >= 1")
    if name == "SlurmLauncher" and shutil.which("srun") is None and not cfg.dry_run:
        fail("launcher=slurm but there is no srun here (not a SLURM cluster); valid: "
             "launcher=basic, local or submitit_local, or dry_run=true to list the array")


def check_points(sweeper, points: list[list[str]]) -> dict[tuple, Plan | Infeasible]:
    """{sorted point: its Plan, or the Infeasible record its job will store}; ends the sweep
    with one line at the first point that has a bad value, named by what sets it apart."""
    if not points:  # every point is done: nothing to check, and torch stays unloaded
        return {}
    from kernelzoo.training import loading

    try:
        torch = loading.load()
    except UsageError as err:
        fail(str(err))
    from kernelzoo.training.plan import resolve

    compose, plans, threads = Composer(sweeper), {}, torch.get_num_threads()
    common = set.intersection(*map(set, points)) if len(points) > 1 else set()
    torch.set_num_threads(1)  # tiny tensors (a map's projection): threads only cost here
    try:
        for point in points:
            name = " ".join(o for o in point if o not in common)
            try:
                plans[tuple(sorted(point))] = resolve(compose(point))
            except (HydraException, OmegaConfBaseException) as err:
                fail(f"point {name}: {config.describe(err, point)}")
            except UsageError as err:
                fail(f"point {name}: {err}")
    finally:
        compose.close()
        torch.set_num_threads(threads)
    return plans
