"""Where a run runs: the device ``trainer.device`` names, and whether the run fits in it.

``resolve_device`` turns the config's name into a torch device this machine has (or a
UsageError naming what it has); ``footprint.py`` estimates the most memory a run (or a pack of
runs) holds at once, and ``check_memory`` refuses, before any training, a point whose estimate
exceeds the device's memory, saying what would fit; ``flushes_denormals`` says whether a run's CPU
arithmetic flushes denormal floats, in its training steps and in its evaluations (the trainer
and ``make bench`` alike).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re

import torch

from kernelzoo import config
from kernelzoo.config import UsageError
from kernelzoo.core import rules
from kernelzoo.records.history import cpu_model
from kernelzoo.training.footprint import footprint
from kernelzoo.training.workers import process_limit
from kernelzoo.config.words import plural

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
    """Bytes of memory on ``device``: the GPU's, else the machine's physical memory or the
    smaller limit this process runs under (``process_limit``)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    limit = process_limit()
    return min(physical, limit[0]) if limit else physical


def memory_words(device: torch.device) -> str:
    """Whose memory ``device_memory`` counts, for a refusal: "cpu", or "cpu under its cgroup's
    memory limit"."""
    limit = process_limit() if device.type == "cpu" else None
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return f"{device} under {limit[1]}" if limit and limit[0] < physical else str(device)


def check_memory(phi, mem, tr, task, device: torch.device,
                 runs: list[tuple[int, int, int]]) -> dict[str, int]:
    """Refuse a run, or a pack of runs, whose estimated peak memory (``footprint``) exceeds
    the device's: UsageError, one line naming the point, the estimate and the memory there is,
    and what would fit (a smaller batch; fewer keys for a run alone, fewer runs for a pack).
    ``mem``, ``tr`` and ``task`` are the run's settings (config's MemoryConf, TrainerConf and
    TaskConf), ``runs`` the (n_keys, seq_len, eval_seq_len) of each run. Returns the estimate
    (bytes at the peak of each phase) of what fits."""
    have = device_memory(device)
    runs = sorted(runs, reverse=True)  # a smaller pack: the largest runs (the worst case)

    def need(runs=runs, batch_size=tr.batch_size) -> int:
        trainer = dataclasses.replace(tr, batch_size=batch_size)
        return max(footprint(phi, mem, trainer, runs, device.type).values())

    parts = footprint(phi, mem, tr, runs, device.type)
    peak = max(parts, key=parts.get)
    if parts[peak] <= have:
        return parts
    valid = []
    if len(runs) > 1:
        most = _most(lambda r: need(runs[:r]) <= have, len(runs) - 1)
        valid += [f"trainer.pack <= {most}"] if most else []
    most = _most(lambda batch: need(batch_size=batch) <= have, tr.batch_size - 1)
    valid += [f"trainer.batch_size <= {most}"] if most else []
    S, L, eval_len = runs[0]
    if len(runs) == 1:  # a sequence length set explicitly does not follow n_keys
        most = _most(lambda n: need([(n, *config.sequence_lengths(
            n, task.replacement, task.seq_len, task.eval_seq_len))]) <= have, S - 1)
        valid += [f"n_keys <= {most}"] if most else []
    point = (f"n_keys={S}" if len(runs) == 1 else
             f"a pack of {len(runs)} runs (n_keys {', '.join(str(r[0]) for r in runs)})")
    d_dot = "inf" if math.isinf(phi.d_dot) else phi.d_dot
    raise UsageError(
        f"{point} (feature_map={phi.name} of d_dot {d_dot}, memory={mem.update_rule}, "
        f"trainer.batch_size={tr.batch_size}, sequences of {L}; evaluation: "
        f"{tr.eval_sequences} of {eval_len}) needs about {_size(parts[peak])} at its peak, in "
        f"its {peak} (estimate: parameters, gradients and Adam state "
        f"{_size(parts['parameters'])}, other tensors {_size(parts[peak] - parts['parameters'])}"
        f"), more than the {_size(have)} of {memory_words(device)}; valid: "
        + (" or ".join(valid) + " here" if valid else "fewer or shorter sequences "
           "(trainer.batch_size, task.seq_len, trainer.eval_sequences)"))


def check_width(name: str, d_dot: int, tr, device: torch.device) -> None:
    """Refuse, before its map is built (a projection of d_dot rows is allocated then), a d_dot
    whose features alone, one vector per sequence of a batch, exceed the device's memory: the
    least any map of that width holds (``check_memory`` estimates the whole run once the map
    exists)."""
    need = tr.batch_size * d_dot * torch.finfo(getattr(torch, tr.dtype)).bits // 8
    have = device_memory(device)
    require(need <= have,
            f"feature_map={name} with d_dot={d_dot}: its features alone, one vector per "
            f"sequence of a batch of {tr.batch_size}, need {_size(need)}, more than the "
            f"{_size(have)} of {memory_words(device)}; valid: a smaller d_dot (at most "
            f"{have * 8 // (tr.batch_size * torch.finfo(getattr(torch, tr.dtype)).bits):,} for "
            "the features alone)")


def _size(nbytes: float) -> str:
    """Bytes as GiB from 1 GiB, else as MiB: three significant digits, whole from 100."""
    value, unit = (nbytes / GIB, "GiB") if nbytes >= GIB else (nbytes / 2**20, "MiB")
    return f"{value:,.0f} {unit}" if value >= 100 else f"{value:.3g} {unit}"


def _most(fits, high: int) -> int:
    """The largest n in [1, high] with fits(n), fits growing no larger as n grows; 0 if none."""
    low = 0
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if fits(mid) else (low, mid - 1)
    return low


def numerics(device: torch.device, pack: int, flushed: bool, compiled: bool) -> dict:
    """What sets a run's arithmetic to the last bit, for its summary (``numerics``): torch's
    version, the device (the CPU's model, or the GPU's name), the BLAS torch was built with, the
    threads of a step, the runs of the pack it trained in (a pack batches their products, which
    can round differently from the run alone), whether its training steps flushed denormals and
    whether they were compiled. Two runs of one seed agree to the bit only where all of these
    do (docs/analysis.md, "Numerics")."""
    blas = re.search(r"BLAS_INFO=([^,\s]+)", torch.__config__.show())
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_model()
    return {"torch": torch.__version__, "device": f"{device.type}: {where}",
            "blas": blas.group(1) if blas else "unknown", "threads": torch.get_num_threads(),
            "pack": pack, "flush_denormal": flushed, "compiled": compiled}


def flushes_denormals(setting: str, update_rule: str, normalisation: str, training: bool) -> bool:
    """Whether ``trainer.flush_denormal`` has a pack's CPU arithmetic flush denormal floats to 0,
    in its training steps (``training``) or else (evaluations, diagnostics).

    ``auto`` asks the rule (``UpdateRule.flushes_denormals``), which flushes

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

    The delta rules (delta, gated_delta) and sum normalisation keep IEEE gradual underflow: there
    a number that small is part of what a run measures (a sum-normalised key of underflowed
    features is 0 / 0 when flushed; FAVOR+'s exp features reach 1e-43 before its delta-rule runs
    divide 0 by 0, results/reference/figure3)."""
    if setting != "auto":
        return setting == "true"
    return rules.get(update_rule).flushes_denormals(training, normalisation)
