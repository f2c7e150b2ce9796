"""Adaptive failure-point search (``search=bisect``): the capacity of a configuration in a
handful of runs instead of a whole grid. Pure logic: it never trains and never reads a file.

A *series* is one configuration and seed. Given what its probes so far showed (n_keys -> fails
or not, judged by the analysis' rule: final eval loss above tau, missing, or diverged),
``next_probes`` returns the n_keys to train next and why, or a ``Verdict`` once the failure
point is located. The decision depends only on the set of observations, never on their order,
so an interrupted search continues from its probes and a finished one asks for nothing.

1. Bracket. The first round probes the multiples of the configuration's d_dot up to 1
   (``multiples``: 0.5 and 1); while every probe passes, the next multiple above (1.25), then
   doubling. A map without a bounded d_dot (softmax) starts a doubling search at ``start``
   (default d_key). Everything is clipped to [``min_keys``, ``max_keys``]. Multiples above 1
   come one round at a time because runs above capacity are the slowest, and most maps fail
   below d_dot.
2. Locate. With the probes sorted by n_keys, the candidate failure is the first failing probe
   whose next probe fails too (the analysis' rule: a failure followed by a pass is noise; a
   failing top probe counts alone). Below it lies the last pass a.
   - no candidate, all passes (or only noise): go up (step 1), up to ``max_keys``; a pass at
     ``max_keys`` is the verdict "never_fails" (lower bound max_keys);
   - the lowest probe is the candidate: probe ``min_keys``; a confirmed failure there is
     "fails_everywhere" (upper bound min_keys);
   - else split the bracket [a, b] until b - a <= ``resolution``: where the loss, interpolated
     in log between a and b (the analysis' interpolation), crosses tau, kept within the middle
     half of the bracket; at the midpoint when a loss is unknown.
3. Confirm. Once the bracket is narrow enough, b is accepted only when the probe just above it
   fails and lies within ``resolution`` of it (or b is ``max_keys`` itself); otherwise
   b + resolution (rounded down) is probed. If that passes, b was noise and the search goes on above it.

After the bracket, one probe per series per round: on the machines this runs on, rounds of all series together
keep the workers busy, and a second probe per round would mostly be spent above capacity, where
runs are slowest.

Every probe is a new n_keys: no series is ever probed twice at one n_keys.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .config import SearchConf


@dataclass(frozen=True)
class Spec:
    """What the search of one series needs to know about it."""

    d_dot: float | None  # None or inf: unbounded
    d_key: int
    min_keys: int
    max_keys: int
    resolution: float
    multiples: tuple[float, ...] = (0.5, 1.0, 1.25)
    start: int | None = None
    threshold: float = 0.01

    @property
    def bounded(self) -> bool:
        return self.d_dot is not None and math.isfinite(self.d_dot)

    def resolution_at(self, near: int) -> float:
        """The resolution, or for 0 (an unbounded map's default) 5% of ``near``, at least 2."""
        return self.resolution or max(2.0, 0.05 * near)


@dataclass(frozen=True)
class Probe:
    n_keys: int
    why: str


@dataclass(frozen=True)
class Verdict:
    """The located failure point: ``fails_at`` with the bracket [last_pass, first_failure],
    ``never_fails`` (bound = the largest n passed) or ``fails_everywhere`` (bound = the
    smallest n, failed)."""

    outcome: str
    bound: int | None = None
    last_pass: int | None = None
    first_failure: int | None = None


def default_resolution(d_dot: float | None) -> float:
    """The larger of 2 keys and 5% of d_dot; 0 for an unbounded map, which means 5% of the
    bracket's lower end (see ``Spec.resolution_at``)."""
    if d_dot is None or not math.isfinite(d_dot):
        return 0.0
    return max(2.0, 0.05 * d_dot)


def make_spec(conf: SearchConf, d_dot: float | None, d_key: int, grid_keys: list[int]) -> Spec:
    """The Spec of one series from the search config and the configuration's own grid."""
    low = conf.min_keys if conf.min_keys is not None else min(grid_keys)
    high = conf.max_keys if conf.max_keys is not None else max(grid_keys)
    resolution = conf.resolution if conf.resolution is not None else default_resolution(d_dot)
    return Spec(d_dot=d_dot, d_key=d_key, min_keys=int(low), max_keys=int(high),
                resolution=float(resolution), multiples=tuple(sorted(conf.multiples)),
                start=conf.start, threshold=conf.threshold)


LOSS_FLOOR = 1e-12  # losses are floored here before their log is taken (as in the analysis)


def failing(loss, diverged, threshold: float):
    """The analysis' rule for a point: it fails when its run diverged or its final eval loss is
    missing (NaN) or above tau. Elementwise on arrays; a numpy bool for one point."""
    return np.asarray(diverged, bool) | ~(np.asarray(loss, float) <= threshold)


def candidate(fails: list[bool]) -> int | None:
    """Index of the first failing probe whose next probe fails too (or that is the last)."""
    for i, failing in enumerate(fails):
        if failing and (i == len(fails) - 1 or fails[i + 1]):
            return i
    return None


def next_probes(spec: Spec, observed: dict[int, bool],
                losses: dict[int, float] | None = None) -> list[Probe] | Verdict:
    """The probes of the next round for one series, or its Verdict when it is located.
    ``observed``: n_keys -> fails; ``losses``: n_keys -> final eval loss, where known."""
    lo, hi = spec.min_keys, spec.max_keys
    clip = lambda n: int(min(max(n, lo), hi))  # noqa: E731
    if not observed:
        if spec.bounded:
            ns = sorted({clip(round(m * spec.d_dot)) for m in spec.multiples if m <= 1}
                        or {clip(round(spec.multiples[0] * spec.d_dot))})
            return [Probe(n, f"bracket: {n / spec.d_dot:.3g} x d_dot") for n in ns]
        return [Probe(clip(spec.start or spec.d_key), "doubling: start (unbounded d_dot)")]
    ns = sorted(observed)
    fails = [observed[n] for n in ns]
    i = candidate(fails)
    if i is None:
        return _up(spec, ns[-1], clip, observed)
    b = ns[i]
    res = spec.resolution_at(ns[i - 1] if i else b)
    confirmed = b >= hi or (i + 1 < len(ns) and ns[i + 1] - b <= res)
    confirm = Probe(clip(b + math.floor(res)), f"confirm the failure at {b}")
    if i == 0:
        if b > lo:
            return _new(Probe(lo, f"down: the lowest probe, {b}, fails"), observed)
        return Verdict("fails_everywhere", bound=b) if confirmed else _new(confirm, observed)
    a = ns[i - 1]
    if b - a > res and b - a > 1:
        return _new(_split(spec, a, b, losses or {}), observed)
    return Verdict("fails_at", last_pass=a, first_failure=b) if confirmed else _new(confirm, observed)


def _up(spec: Spec, top: int, clip, observed) -> list[Probe] | Verdict:
    """Everything up to ``top`` passes: the next multiple of d_dot above it, else double."""
    if top >= spec.max_keys:
        return Verdict("never_fails", bound=top)
    above = [m for m in spec.multiples if spec.bounded and round(m * spec.d_dot) > top]
    if above:
        n = clip(round(above[0] * spec.d_dot))
        return _new(Probe(n, f"bracket: {above[0]:.3g} x d_dot (every probe up to {top} passes)"),
                    observed)
    return _new(Probe(clip(2 * top), f"doubling: every probe up to {top} passes"), observed)


def _split(spec: Spec, a: int, b: int, losses: dict[int, float]) -> Probe:
    """The probe inside the bracket [a, b]: where the loss, interpolated in log between its
    ends as the analysis does, crosses tau, kept in the middle half of the bracket (so each
    round shrinks it by a quarter at least); the midpoint when either loss is unknown."""
    la, lb = losses.get(a), losses.get(b)
    if la is None or lb is None or not (math.isfinite(la) and math.isfinite(lb)):
        return Probe((a + b) // 2, f"bisect [{a}, {b}]")
    la, lb = max(la, LOSS_FLOOR), max(lb, LOSS_FLOOR)
    if not la < spec.threshold < lb:
        return Probe((a + b) // 2, f"bisect [{a}, {b}]")
    guess = a + (math.log(spec.threshold) - math.log(la)) / (math.log(lb) - math.log(la)) * (b - a)
    quarter = (b - a) / 4
    n = round(min(max(guess, a + quarter), b - quarter))
    return Probe(min(max(n, a + 1), b - 1), f"interpolate [{a}, {b}]: loss crosses tau near "
                                            f"{guess:.0f}")


def _new(probe: Probe, observed: dict[int, bool]) -> list[Probe]:
    """The probe as a round of one; an n_keys already observed is never trained twice."""
    if probe.n_keys in observed:
        raise AssertionError(f"search would probe n_keys={probe.n_keys} twice")
    return [probe]
