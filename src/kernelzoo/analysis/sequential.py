"""Seeds until decided: a group-sequential race among one size's configurations in one view,
seeds added round by round only where the first tier is undecided. Pure: it reads no file; the
seeds come from ``draw`` (a sweep's runs, or a simulation's).

The rule is stated once, in docs/analysis.md ("Seeds until decided"): every configuration
starts with ``start`` seeds; at each look Tukey's HSD at ``tiers.ALPHA / looks`` over the
configurations it can test cuts the first tier (``first_tier``, as ``tiers.tiers`` cuts it); one
member: decided; else each member under ``most`` seeds gets ``step`` more and the next look
follows; every member at ``most``: undecided. The looks planned share ALPHA (Bonferroni over
the looks: however early the race stops and whichever configurations get seeds, a false
separation among equal configurations at any look has probability at most ALPHA). A
configuration with a seed that is a bound (NaN from ``draw``) leaves the race: HSD cannot test
it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kernelzoo.analysis.tiers import ALPHA, separated

START, MOST, STEP = 3, 10, 1  # the seeds a race starts with, the most it gives one, per round


@dataclass(frozen=True)
class Race:
    """How a race ended: the looks taken and planned, the seeds each configuration got, the
    first tier at the last look (empty: nothing could be tested), whether it has one member, and
    the configurations that left the race (a seed that is a bound)."""

    looks: int
    planned: int
    seeds: dict[str, int]
    first: tuple[str, ...]
    decided: bool
    apart: tuple[str, ...] = ()


def planned(start: int = START, most: int = MOST, step: int = STEP) -> int:
    """The looks a race from ``start`` to ``most`` seeds in steps of ``step`` can take."""
    return (most - start) // step + 1


def first_tier(samples: dict[str, np.ndarray], alpha: float) -> tuple[str, ...]:
    """The configurations that HSD at ``alpha`` separates from no member of the leading group,
    in order of their mean, best first (``tiers.tiers``' first tier); every one of them where
    nothing spreads (no test)."""
    order = sorted(samples, key=lambda label: -samples[label].mean())
    split = separated(samples, alpha)
    if split is None:
        return tuple(order)
    members = []
    for label in order:
        if members and any(split[label, m] for m in members):
            break
        members.append(label)
    return tuple(members)


def race(draw: Callable[[str, int], np.ndarray], labels, start: int = START, most: int = MOST,
         step: int = STEP) -> Race:
    """The race among ``labels`` (module docstring); ``draw(label, n)``: n new seeds' failure
    points / d_dot of that configuration (NaN: a seed that is a bound)."""
    looks = planned(start, most, step)
    alpha = ALPHA / looks
    samples = {label: np.asarray(draw(label, start), float) for label in labels}
    apart = []
    for look in range(1, looks + 1):
        for label in [lab for lab, v in samples.items() if np.isnan(v).any()]:
            apart.append(label)
            del samples[label]
        first = first_tier(samples, alpha) if len(samples) > 1 else tuple(samples)
        grow = [label for label in first if len(samples[label]) < most]
        if len(first) <= 1 or not grow or look == looks:
            break
        for label in grow:
            samples[label] = np.concatenate([samples[label], draw(label, step)])
    seeds = {label: len(v) for label, v in samples.items()}
    return Race(look, looks, seeds, first, len(first) == 1, tuple(apart))
