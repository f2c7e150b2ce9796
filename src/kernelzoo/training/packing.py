"""The packing policy: which runs train together as one pack (``pack.Pack``, the mechanics),
and how many.

Runs that share everything but ``seed`` and ``n_keys`` may form a pack (the sweeper groups its
points so, ``hydra_plugins.kernelzoo_sweeper.packs``). ``form`` fills packs largest first, up
to ``most_runs`` of the settings and within PADDING_WASTE of padded work under the work model
``step_cost``, which the sweep's progress line weighs its ETA by too.
"""

from __future__ import annotations

from typing import Callable

PADDING_WASTE = 0.25  # a pack's padded work is at most this fraction of its work (``form``)
AUTO_SIZE = {"cpu": 8, "cuda": 32}  # trainer.pack=auto at most (``make bench``: case packed)
GPU_FILL = 0.8   # trainer.pack=auto on a GPU of known memory: its runs' estimates fill this share
GPU_MOST = 256   # ... and a pack holds at most this many runs
CPU_ELEMENTS = 2**19  # trainer.pack=auto on the CPU: a pack's keys fit in ~2 MB (``most_runs``)


def most_runs(setting: str | int, device: str, batch_size: int, d_key: int,
              replacement: bool, run_bytes: Callable[[int], int] | None = None,
              device_bytes: int | None = None) -> Callable[[int], int]:
    """The most runs of a pack whose largest run has S keys, for ``trainer.pack`` on
    ``trainer.device`` (auto: cuda when this machine has it, as ``devices.resolve_device``).

    auto on a GPU: as many as GPU_FILL of its memory (``device_bytes``) holds at the estimate of
    a run of S keys (``run_bytes``: ``footprint``), at most GPU_MOST; AUTO_SIZE["cuda"] where
    either is unknown. auto on the CPU: packing pays only while the pack's keys,
    R x batch x L x d_key numbers, stay within CPU_ELEMENTS (about a 2 MB cache: beyond it
    every elementwise pass goes to memory and R runs cost more than R runs alone, ``make
    bench``): R <= CPU_ELEMENTS / (batch x L x d_key), at most AUTO_SIZE["cpu"].
    """
    if str(setting) != "auto":
        return lambda S: int(setting)
    if device == "auto":
        import torch  # only here: the sweeper packs and counts without loading torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    kind = device.split(":")[0]
    if kind != "cpu" and run_bytes is not None and device_bytes:
        fill = int(GPU_FILL * device_bytes)
        return lambda S: max(1, min(GPU_MOST, fill // max(run_bytes(S), 1)))
    if kind != "cpu":
        return lambda S: AUTO_SIZE.get(kind, 1)
    per_run = lambda S: batch_size * (2 * S if replacement else S) * d_key  # noqa: E731
    return lambda S: max(1, min(AUTO_SIZE["cpu"], CPU_ELEMENTS // per_run(S)))


def step_cost(n_keys: int) -> float:
    """The work model of ``form``: a training step costs about (S + 64)^2 — the S x 2.2S
    embedding and its Adam update grow as S^2, and a step has a fixed per-op cost worth ~64
    keys on the CPU (``make bench``)."""
    return (n_keys + 64.0) ** 2


def form(n_keys: list[int], most: Callable[[int], int]) -> list[list[int]]:
    """Positions of ``n_keys`` grouped into packs, largest first: a run joins the open pack
    while the pack has fewer than ``most(its largest S)`` runs and its padding stays at most
    PADDING_WASTE of its work (every run padded to the largest S), else it opens the next."""
    order = sorted(range(len(n_keys)), key=lambda i: -n_keys[i])
    packs: list[list[int]] = []
    for i in order:
        if packs and len(packs[-1]) < most(n_keys[packs[-1][0]]):
            members = [n_keys[j] for j in packs[-1]] + [n_keys[i]]
            padded = len(members) * step_cost(max(members))
            if 1 - sum(map(step_cost, members)) / padded <= PADDING_WASTE:
                packs[-1].append(i)
                continue
        packs.append([i])
    return packs
