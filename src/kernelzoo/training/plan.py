"""What a point resolves to before it trains: its ``Plan`` (or ``Infeasible``), run id and place.

``plan`` checks a composed config (``config.check``) and resolves everything a run needs: the
sequence lengths, the device, the feature map (its sizing parameter from d_dot, drawn after
``torch.manual_seed(seed)``) and the memory estimate (``devices.check_memory``). A bad value is
a UsageError, a d_dot the map cannot reach an InfeasibleError; ``resolve`` turns the latter into
an ``Infeasible`` record, which a run records with its reason.

A run's identity is everything that defines the experiment: the map and its parameters, d_key,
d_dot, n_keys, seed, task, memory and the trainer settings but those in ``NOT_IN_IDENTITY`` (how
a run is trained, not what). Its run id (``locate``) is ``store.run_id`` of the identity with
the parameters the map's class shows (``FeatureMap.run_id_shows``); the store's directory names
are these ids, so the identity's fields and their values are fixed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from kernelzoo import config
from kernelzoo.config import Config, MemoryConf, TaskConf, TrainerConf, UsageError
from kernelzoo.maps.base import FeatureMap
from kernelzoo.maps.catalog import (ConfigError, InfeasibleError, build_feature_map,
                                    check_first_call, map_class, resolve_params)
from kernelzoo.records import store, summary
from kernelzoo.training.devices import check_memory, check_width, require, resolve_device

NOT_IN_IDENTITY = {"trainer": ("device", "threads", "progress", "pack", "compile",  # how, not
                               "checkpoint_minutes", "flush_denormal")}  # what, is computed


@dataclass(frozen=True)
class Plan:
    """A checked point, resolved: its checked ``config`` (n_keys, seed, d_key as given), run
    ``identity``, feature map ``phi``, device, sequence lengths and estimated peak memory
    (bytes at the peak of each phase, ``footprint.footprint``). ``task``, ``memory`` and
    ``trainer`` are the config's."""

    config: Config
    identity: dict
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
    identity: dict


def plan(cfg: DictConfig) -> Plan:
    """Check ``cfg`` and resolve everything a run needs; raise UsageError/InfeasibleError."""
    c = config.check(cfg)
    task, mem, tr = c.task, c.memory, c.trainer
    S, d_key = c.n_keys, c.d_key
    seq_len, eval_seq_len = config.sequence_lengths(S, task.replacement, task.seq_len,
                                                    task.eval_seq_len)
    tr.progress = tr.progress.lower()
    device = resolve_device(tr.device)
    fm = dict(c.feature_map)
    name = fm.pop("name", None)
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
    require(not (phi.is_softmax and mem.update_rule != "sum"),
            f"memory.update_rule={mem.update_rule} with feature_map=softmax: softmax attention "
            "has no fast-weight state; valid: memory=sum")
    estimate = check_memory(phi, mem, tr, task, device, [(S, seq_len, eval_seq_len)])
    identity = {
        "feature_map": name, "feature_map_params": phi.params, "d_key": phi.d_key,
        "d_dot": None if math.isinf(phi.d_dot) else phi.d_dot, "n_keys": S, "seed": c.seed,
        "task": {**vars(task), "seq_len": seq_len, "eval_seq_len": eval_seq_len},
        "memory": vars(mem),
        "trainer": {k: v for k, v in vars(tr).items() if k not in NOT_IN_IDENTITY["trainer"]},
    }
    if c.stall_check_of is not None:  # a stall check (sweeper); absent otherwise: ids unchanged
        identity["stall_check_of"] = c.stall_check_of
    return Plan(c, identity, phi, device, seq_len, eval_seq_len, estimate)


def resolve(cfg: DictConfig) -> Plan | Infeasible:
    """``plan(cfg)``, or the ``Infeasible`` record of a point whose map cannot reach its d_dot;
    UsageError for a bad value."""
    try:
        return plan(cfg)
    except InfeasibleError as err:
        return Infeasible(str(err), config.check(cfg), raw_identity(cfg))


def raw_identity(cfg: DictConfig) -> dict:
    """Identity of a point that could not be planned (for its infeasible record)."""
    fm = OmegaConf.to_container(cfg.feature_map, resolve=True)
    name = fm.pop("name", "?")
    identity = {"feature_map": name, "feature_map_params": fm, "d_key": cfg.d_key,
                "d_dot": cfg.d_dot, "n_keys": cfg.n_keys, "seed": cfg.seed,
                "task": OmegaConf.to_container(cfg.task, resolve=True),
                "memory": OmegaConf.to_container(cfg.memory, resolve=True)}
    if cfg.get("stall_check_of") is not None:
        identity["stall_check_of"] = cfg.stall_check_of
    return identity


def run_id(identity: dict) -> str:
    """The run id of ``identity``: ``store.run_id`` with the parameters its map's class shows."""
    cls = map_class(identity["feature_map"])
    params = cls.run_id_shows(identity["feature_map_params"]) if cls is not None else {}
    return store.run_id(identity, params)


def locate(cfg: DictConfig, identity: dict) -> tuple[str, Path]:
    """The run id of ``identity`` and its directory in the store of ``cfg`` (its results_dir
    and experiment)."""
    rid = run_id(identity)
    return rid, store.run_dir(cfg.results_dir, cfg.experiment, rid)


def summary_of(experiment: str, identity: dict, rid: str, **outcome) -> dict:
    """The summary.json of the run ``rid`` of ``identity`` (``records.summary``): what the
    identity says, and the fields of its ``outcome`` (status, reason, losses, diagnostics...)."""
    d_dot = identity["d_dot"]
    return summary.new(
        run_id=rid, experiment=experiment, task=identity["task"].get("name"),
        feature_map=identity["feature_map"], feature_map_params=identity["feature_map_params"],
        d_key=identity["d_key"], d_dot=d_dot, predicted_capacity=d_dot,
        n_keys=identity["n_keys"], seq_len=identity["task"].get("seq_len"),
        update_rule=identity["memory"].get("update_rule"),
        normalisation=identity["memory"].get("normalisation"), seed=identity["seed"],
        stall_check_of=identity.get("stall_check_of"),  # the stalled run a check retrains
        **outcome)
