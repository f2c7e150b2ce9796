"""What a point resolves to before it trains: its ``Plan`` (or ``Infeasible``), run id and place.

``plan`` checks a composed config (``config.check``) and resolves everything a run needs: the
sequence lengths, the device, the feature map (its sizing parameter from d_dot, drawn after
``torch.manual_seed(seed)``) and the memory estimate (``devices.check_memory``). A bad value is
a UsageError, a d_dot the map cannot reach an InfeasibleError; ``resolve`` turns the latter into
an ``Infeasible`` record, which a run records with its reason.

A run's identity (``RunIdentity``) is everything that defines the experiment: the map and its
parameters, d_key, d_dot, n_keys, seed, task, memory and the trainer settings but those in
``NOT_IN_IDENTITY`` (how a run is trained, not what). It is built once, with the plan, and its
``run_id`` is ``store.run_id`` of its fields with the parameters the map's class shows
(``FeatureMap.run_id_shows``); the store's directory names are these ids, so the identity's
fields and their values are fixed.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, fields, replace

import torch
from omegaconf import DictConfig, OmegaConf

from kernelzoo import config
from kernelzoo.config import Config, MemoryConf, TaskConf, TrainerConf, UsageError
from kernelzoo.core import rules
from kernelzoo.maps.base import FeatureMap
from kernelzoo.maps.catalog import (ConfigError, InfeasibleError, build_feature_map,
                                    check_first_call, load_target, map_class, resolve_params)
from kernelzoo.records import store, summary
from kernelzoo.records.rundir import RunDir
from kernelzoo.training.devices import check_memory, check_width, require, resolve_device

NOT_IN_IDENTITY = {"trainer": ("device", "threads", "progress", "pack", "compile",  # how, not
                               "checkpoint_minutes", "flush_denormal")}  # what, is computed


@dataclass(frozen=True)
class RunIdentity:
    """What defines a run, and so its run id. ``trainer`` is None for a point that could not be
    planned (its infeasible record); ``stall_check_of`` names the stalled run a stall check
    retrains (None otherwise). Neither is part of the run id when None."""

    feature_map: str
    feature_map_params: dict
    d_key: int
    d_dot: float | None
    n_keys: int
    seed: int
    task: dict
    memory: dict
    trainer: dict | None = None
    stall_check_of: str | None = None

    def as_dict(self) -> dict:
        """The identity as the run id hashes it and a checkpoint keeps it."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if getattr(self, f.name) is not None
                or f.name not in ("trainer", "stall_check_of")}

    @functools.cached_property
    def run_id(self) -> str:
        """``store.run_id`` of the identity with the parameters its map's class shows."""
        cls = map_class(self.feature_map)
        params = cls.run_id_shows(self.feature_map_params) if cls is not None else {}
        return store.run_id(self.as_dict(), params)

    def at(self, n_keys: int, seq_len: int, eval_seq_len: int) -> RunIdentity:
        """The identity of the same configuration at ``n_keys`` (and its sequence lengths)."""
        return replace(self, n_keys=n_keys,
                       task={**self.task, "seq_len": seq_len, "eval_seq_len": eval_seq_len})

    def summary(self, experiment: str, **outcome) -> dict:
        """The summary.json of this run (``records.summary``): what the identity says, and the
        fields of its ``outcome`` (status, reason, losses, diagnostics...)."""
        return summary.new(
            run_id=self.run_id, experiment=experiment, task=self.task.get("name"),
            feature_map=self.feature_map, feature_map_params=self.feature_map_params,
            d_key=self.d_key, d_dot=self.d_dot, predicted_capacity=self.d_dot,
            n_keys=self.n_keys, seq_len=self.task.get("seq_len"),
            update_rule=self.memory.get("update_rule"),
            normalisation=self.memory.get("normalisation"), seed=self.seed,
            stall_check_of=self.stall_check_of,  # the stalled run a check retrains
            **outcome)


@dataclass(frozen=True)
class Plan:
    """A checked point, resolved: its checked ``config`` (n_keys, seed, d_key as given), run
    ``identity``, feature map ``phi``, device, sequence lengths and estimated peak memory
    (bytes at the peak of each phase, ``footprint.footprint``). ``task``, ``memory`` and
    ``trainer`` are the config's."""

    config: Config
    identity: RunIdentity
    phi: FeatureMap
    device: torch.device
    seq_len: int
    eval_seq_len: int
    memory_estimate: dict[str, int]

    @property
    def task(self) -> TaskConf:
        return self.config.task

    @property
    def memory(self) -> MemoryConf:
        return self.config.memory

    @property
    def trainer(self) -> TrainerConf:
        return self.config.trainer


@dataclass(frozen=True)
class Infeasible:
    """A checked point whose map cannot reach its d_dot: why, its checked ``config`` and the
    identity its infeasible record is stored under (``raw_identity``)."""

    reason: str
    config: Config
    identity: RunIdentity


def plan(cfg: DictConfig) -> Plan:
    """Check ``cfg`` and resolve everything a run needs; raise UsageError/InfeasibleError."""
    return _plan(config.check(cfg))


def _plan(c: Config) -> Plan:
    task, mem, tr = c.task, c.memory, c.trainer
    S, d_key = c.n_keys, c.d_key
    seq_len, eval_seq_len = config.sequence_lengths(S, task.replacement, task.seq_len,
                                                    task.eval_seq_len)
    tr.progress = tr.progress.lower()
    device = resolve_device(tr.device)
    fm = dict(c.feature_map)
    name = map_name(fm)
    torch.manual_seed(c.seed)  # a random map draws its first projection here
    if c.d_dot is not None:
        check_width(name, c.d_dot, tr, device)
    try:
        if c.d_dot is not None:
            kwargs = resolve_params(name, d_key=d_key, d_dot=c.d_dot, **fm)
        else:
            kwargs = {"d_key": d_key, **fm}
        phi = build_feature_map(name, **kwargs)
        check_first_call(phi)
    except ConfigError as err:
        raise UsageError(f"feature_map={name}: {str(err).removeprefix(f'{name}: ')}") from None
    require(not (phi.is_softmax and not rules.get(mem.update_rule).by_scores),
            f"memory.update_rule={mem.update_rule} with feature_map=softmax: softmax attention "
            "has no fast-weight state; valid: memory=sum")
    estimate = check_memory(phi, mem, tr, task, device, [(S, seq_len, eval_seq_len)])
    identity = RunIdentity(
        feature_map=name, feature_map_params=phi.params, d_key=phi.d_key,
        d_dot=None if math.isinf(phi.d_dot) else phi.d_dot, n_keys=S, seed=c.seed,
        task={**vars(task), "seq_len": seq_len, "eval_seq_len": eval_seq_len},
        memory=vars(mem),
        trainer={k: v for k, v in vars(tr).items() if k not in NOT_IN_IDENTITY["trainer"]},
        stall_check_of=c.stall_check_of)  # a stall check (sweeper); None otherwise
    return Plan(c, identity, phi, device, seq_len, eval_seq_len, estimate)


def resolve(cfg: DictConfig) -> Plan | Infeasible:
    """The point ``cfg`` checked and planned once: its ``Plan``, or the ``Infeasible`` record of
    a point whose map cannot reach its d_dot; UsageError for a bad value."""
    c = config.check(cfg)
    try:
        return _plan(c)
    except InfeasibleError as err:
        return Infeasible(str(err), c, raw_identity(cfg))


def map_name(fm: dict) -> str | None:
    """The map a feature_map config names, its keys then the constructor's arguments (taken out
    of ``fm``): ``name``, a registered map, or ``_target_``, the import path of a class of the
    user's own (``catalog.load_target``), which names itself."""
    name, target = fm.pop("name", None), fm.pop("_target_", None)
    if target is None:
        return name
    try:
        own = load_target(target)
    except ConfigError as err:
        raise UsageError(str(err)) from None
    require(name in (None, own), f"feature_map._target_={target} is the map {own!r}, not "
                                 f"feature_map.name={name}; valid: one of the two")
    return own


def raw_identity(cfg: DictConfig) -> RunIdentity:
    """The identity of a point that could not be planned (for its infeasible record)."""
    fm = OmegaConf.to_container(cfg.feature_map, resolve=True)
    name = map_name(fm) if "_target_" in fm else fm.pop("name", "?")
    return RunIdentity(feature_map=name, feature_map_params=fm, d_key=cfg.d_key, d_dot=cfg.d_dot,
                    n_keys=cfg.n_keys, seed=cfg.seed,
                    task=OmegaConf.to_container(cfg.task, resolve=True),
                    memory=OmegaConf.to_container(cfg.memory, resolve=True),
                    stall_check_of=cfg.get("stall_check_of"))


def locate(cfg: DictConfig, identity: RunIdentity) -> tuple[str, RunDir]:
    """The run id of ``identity`` and its directory in the store of ``cfg`` (its results_dir
    and experiment)."""
    return identity.run_id, RunDir.of(cfg.results_dir, cfg.experiment, identity.run_id)
