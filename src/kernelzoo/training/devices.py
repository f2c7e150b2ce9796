"""Where a run runs: the device ``trainer.device`` names, and whether the run fits in it.

``resolve_device`` turns the config's name into a torch device this machine has (or a
UsageError naming what it has); ``check_memory`` refuses, before any training, a run whose
estimated peak memory (``model.footprint``) exceeds the device's, saying how many keys would fit;
``flushes_denormals`` says whether a run's CPU arithmetic flushes denormal floats, in its training
steps and in its evaluations (the trainer and ``make bench`` alike).
"""

from __future__ import annotations

import os

import torch

from kernelzoo import config
from kernelzoo.config import UsageError
from kernelzoo.core.memory import divides_by_feature_sum
from kernelzoo.core.model import footprint
from kernelzoo.words import plural

GIB = 2**30


def require(ok: bool, message: str) -> None:
    """UsageError(message) unless ok."""
    if not ok:
        raise UsageError(message)


def resolve_device(name: str) -> torch.device:
    """The torch device ``trainer.device`` names (its syntax is checked by the schema), if this
    machine has it; UsageError otherwise."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    device = torch.device(name)
    if device.type == "cuda":
        n = torch.cuda.device_count()
        require(n > 0, f"trainer.device={name} but no CUDA device is available here; "
                      "valid: auto, cpu")
        require((device.index or 0) < n, f"trainer.device={name} but only "
                                        f"{plural(n, 'CUDA device')}; "
                                        f"valid: cuda:0 to cuda:{n - 1}, auto, cpu")
    if device.type == "mps":
        require(torch.backends.mps.is_available(),
               f"trainer.device={name} but MPS is not available here; valid: auto, cpu")
    return device


def device_memory(device: torch.device) -> int:
    """Bytes of memory on ``device``: the GPU's, else the machine's physical memory."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_memory(c: config.Config, phi, device, seq_len: int, eval_seq_len: int) -> dict[str, int]:
    """Refuse a run whose estimated peak memory (``model.footprint``) exceeds the device's;
    the estimate (bytes by part) of a run that fits."""
    tr = c.trainer

    def need(n_keys: int) -> int:
        def follow(length, given):  # a sequence length set explicitly does not follow n_keys
            return given or max(1, round(length * n_keys / c.n_keys))

        parts = footprint(n_keys, phi.d_key, phi.d_dot, c.memory.update_rule, tr.batch_size,
                          follow(seq_len, c.task.seq_len), tr.eval_sequences,
                          min(n_keys, tr.eval_max_queries),
                          follow(eval_seq_len, c.task.eval_seq_len),
                          torch.finfo(getattr(torch, tr.dtype)).bits // 8)
        return parts if n_keys == c.n_keys else sum(parts.values())

    have, parts = device_memory(device), need(c.n_keys)
    if sum(parts.values()) <= have:
        return parts
    estimate = (f"needs about {sum(parts.values()) / GIB:,.1f} GiB (estimate: parameters, "
                f"gradients and Adam state {parts['parameters'] / GIB:,.1f} GiB, activations "
                f"{parts['activations'] / GIB:,.1f} GiB), more than the {have / GIB:,.1f} GiB "
                f"of {device}")
    if need(1) > have:
        raise UsageError(f"trainer.batch_size={tr.batch_size} with sequences of {seq_len} "
                         f"(evaluation: {tr.eval_sequences} of {eval_seq_len}) {estimate}; "
                         "valid: fewer or shorter sequences")
    low, high = 1, c.n_keys  # the most keys that fit: the estimate grows with n_keys
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if need(mid) <= have else (low, mid - 1)
    raise UsageError(f"n_keys={c.n_keys} {estimate}; valid: n_keys <= {low} here")


def flushes_denormals(setting: str, update_rule: str, normalisation: str, training: bool) -> bool:
    """Whether ``trainer.flush_denormal`` has a pack's CPU arithmetic flush denormal floats to 0,
    in its training steps (``training``) or else (evaluations, diagnostics).

    ``auto`` flushes

    - the fwm rule, always: each write takes its key's direction out of the state and divides
      by the norm, so entries of values not written again decay below 1e-38 beside entries near
      1, and on some CPUs every operation on a denormal is many times slower
      (docs/performance.md);
    - the sum rule's training steps, unless keys are sum-normalised: FAVOR+'s exp features
      underflow there at every n_keys. There a denormal is added to larger terms, divided by a
      denominator holding eps, or moves a parameter by far less than its last bit, so trained
      parameters are bit-identical flushed and not (tests/test_train.py checks it).
      Evaluations keep IEEE gradual underflow: outputs that small still rank the values for
      accuracy.

    The delta rule and sum normalisation keep IEEE gradual underflow: there a number that small
    is part of what a run measures (a sum-normalised key of underflowed features is 0 / 0 when
    flushed; FAVOR+'s exp features reach 1e-43 before its delta-rule runs divide 0 by 0,
    results/reference/figure3)."""
    if setting != "auto":
        return setting == "true"
    return update_rule == "fwm" or (training and update_rule == "sum"
                                    and not divides_by_feature_sum(update_rule, normalisation))
