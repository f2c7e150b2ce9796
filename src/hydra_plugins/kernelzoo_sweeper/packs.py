"""The sweeper's jobs as records: the points to launch (``Point``), the jobs they form (``Job``).

A ``Point`` holds its overrides, the strings Hydra's launcher takes, beside the typed values
packing reads, from the checked config its check composed (``points.check_points``): n_keys,
seed and the settings that size a pack. Points that differ only in n_keys and seed are trained
as one ``Job``, a pack (``kernelzoo.training.packing``): the leader's overrides plus
``pack_members=[[n_keys, seed], ...]`` of the others (``Job.overrides``), which the job reads
back as Hydra's typed config (``Config.pack_members``) and trains beside the leader
(``kernelzoo.training.job``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from .points import override_key

if TYPE_CHECKING:  # imported where used: torch loads only once a sweep packs its points
    from kernelzoo.config import Config
    from kernelzoo.training.plan import Infeasible, Plan

VARY = ("n_keys", "seed")  # the only values in which a pack's points differ


@dataclass(frozen=True)
class Point:
    """A point to launch: its ``overrides`` and, from its checked ``config``, its n_keys and
    seed; from its plan, its estimated peak ``memory`` in bytes (0 where infeasible) and whether
    it trains on a ``gpu``. A failure-point probe carries the config and plan of its series'
    checked point, which is the probe's in everything but n_keys."""

    overrides: tuple[str, ...]
    n_keys: int
    seed: int
    config: Config
    memory: int = 0
    gpu: bool = False

    @classmethod
    def of(cls, overrides: list[str], resolved: Plan | Infeasible,
           n_keys: int | None = None) -> Point:
        """The point ``overrides`` that ``resolved`` (its check's Plan or Infeasible record)
        was made from; ``n_keys``: a probe's, where ``resolved`` is its series'."""
        c = resolved.config
        estimate = getattr(resolved, "memory_estimate", None) or {0: 0}
        device = getattr(resolved, "device", None)
        return cls(tuple(overrides), c.n_keys if n_keys is None else n_keys, c.seed, c,
                   max(estimate.values()), device is not None and device.type != "cpu")


@dataclass(frozen=True)
class Job:
    """Points trained as one job (a pack): the leader first, then the members trained beside it."""

    points: tuple[Point, ...]

    @property
    def leader(self) -> Point:
        return self.points[0]

    @property
    def runs(self) -> int:
        return len(self.points)

    @property
    def memory(self) -> int:
        """The job's estimated peak bytes: its runs' estimates summed (a pack holds each)."""
        return sum(p.memory for p in self.points)

    def overrides(self) -> list[str]:
        """The job's overrides, as Hydra's launcher takes them: the leader's, then
        ``pack_members=[[n_keys,seed],...]`` of the members, if any."""
        members = [[p.n_keys, p.seed] for p in self.points[1:]]
        return [*self.leader.overrides,
                *([f"pack_members={json.dumps(members, separators=(',', ':'))}"] if members
                  else [])]


def most_runs(c: Config, group=()) -> Callable[[int], int]:
    """``kernelzoo.training.packing.most_runs`` for the points of the checked config ``c``
    (trainer.pack, trainer.device, trainer.batch_size, the d_key given, task.replacement); on a
    GPU, by its memory and the estimates of the ``group``'s points (a run of S keys takes the
    estimate of the point of the most keys up to S, or of the group's smallest)."""
    from kernelzoo.training import packing

    tr, run_bytes, device_bytes = c.trainer, None, None
    if any(p.gpu for p in group):
        import torch

        device_bytes = torch.cuda.get_device_properties(0).total_memory
        known = sorted((p.n_keys, p.memory) for p in group)
        run_bytes = lambda S: next((m for n, m in reversed(known) if n <= S),  # noqa: E731
                                   known[0][1])
    return packing.most_runs(tr.pack, tr.device, tr.batch_size, c.d_key, c.task.replacement,
                             run_bytes, device_bytes)


def jobs(points: list[Point]) -> list[Job]:
    """One pack per job: points whose overrides agree but for n_keys and seed, grouped by
    ``kernelzoo.training.packing.form`` up to ``most_runs`` of their settings; the packs with the
    largest leader n_keys first."""
    from kernelzoo.training import packing

    groups: dict[tuple, list[Point]] = {}
    for point in points:
        rest = tuple(o for o in point.overrides if override_key(o) not in VARY)
        groups.setdefault(rest, []).append(point)
    found = [Job(tuple(group[i] for i in members))
             for group in groups.values()
             for members in packing.form([p.n_keys for p in group],
                                         most_runs(group[0].config, group))]
    return sorted(found, key=lambda p: -p.leader.n_keys)
