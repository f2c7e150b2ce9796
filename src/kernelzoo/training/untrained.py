"""What a run measures before its first step, with no training: the numerical and effective
rank of the untrained map applied to the task's written keys (a run's ``phi_rank_initial`` and
``phi_effective_rank_initial``, ``core/diagnostics.py``).

The numbers depend on the map (its parameters and projection, drawn after
``torch.manual_seed(seed)``), the untrained model's keys k_l = W_k [onehot(value_l), E[key_l]] +
b_k (the embedding and W_k, drawn after the same seed), the task (n_keys, the sequence length
and the probe's sequences, ``runner.probe_batch``), the device's generator and the dtype; on
nothing about training (learning rate, stopping rule, steps). ``untrained_ranks`` builds what a
run builds before its first step and measures it, so on the same device and dtype it returns the
numbers that run's summary records, without training; ``at_d_dot`` measures a configuration at
n_keys = d_dot, where the prediction is made (``analysis/prediction.py``):

    python -m kernelzoo.training.untrained results/reference/zoo/runs/<run>/config.yaml ...
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch
import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from kernelzoo.config import Config, UsageError
from kernelzoo.core.diagnostics import feature_ranks_of
from kernelzoo.records import files, loaders
from kernelzoo.training.plan import plan
from kernelzoo.training.runner import initial_model, probe_batch


def typed(cfg: DictConfig) -> DictConfig:
    """A run's config.yaml as loaded, composed over the schema (as ``plan`` needs it)."""
    return cfg if OmegaConf.get_type(cfg) is Config else OmegaConf.merge(
        OmegaConf.structured(Config), cfg)


def untrained_ranks(cfg: DictConfig) -> tuple[float | None, float | None]:
    """(rank, effective rank) of the written keys' features of the run ``cfg`` at
    initialisation (None, None for softmax); no training step."""
    cfg = typed(cfg)
    p = plan(cfg)
    with torch.no_grad():
        model = initial_model(p, cfg.n_keys, cfg.seed, getattr(torch, p.trainer.dtype))
        return feature_ranks_of(model, probe_batch(p, cfg.n_keys, cfg.seed))


def at_d_dot(cfg: DictConfig) -> tuple[float | None, float | None]:
    """``untrained_ranks`` of the configuration of ``cfg`` at n_keys = its map's d_dot (the
    d_dot the map resolves to); None, None for an unbounded map (softmax)."""
    cfg = typed(cfg)
    d_dot = plan(cfg).identity.d_dot
    if d_dot is None or not math.isfinite(d_dot):
        return None, None
    cfg = cfg.copy()
    cfg.n_keys = int(round(d_dot))
    return untrained_ranks(cfg)


def main(argv=None) -> None:
    """One line per config.yaml: its untrained ranks at n_keys = d_dot."""
    parser = argparse.ArgumentParser(prog="python -m kernelzoo.training.untrained",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("config", nargs="+", help="a run's config.yaml")
    for path in parser.parse_args(argv).config:
        try:
            text = files.read_text(Path(path))  # a regular file of bounded size: no FIFO
            rank, effective = at_d_dot(typed(OmegaConf.create(loaders.load_yaml(text))))
        except UsageError as err:
            raise SystemExit(f"error: {path}: {err}") from None
        except files.StoreError as err:
            raise SystemExit(f"error: {err}; valid: a run's config.yaml") from None
        except (OSError, ValueError, yaml.YAMLError, OmegaConfBaseException) as err:
            raise SystemExit(f"error: {path}: {' '.join(str(err).split())}; valid: a run's "
                             "config.yaml") from None
        print(f"{path}: untrained rank {rank}, effective rank {effective} at n_keys = d_dot")


if __name__ == "__main__":
    main()
