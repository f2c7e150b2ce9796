"""Adaptive failure-point search (``search=bisect``): the capacity of a configuration in a
handful of runs instead of a whole grid. Pure logic: it never trains and never reads a file.

A *series* is one configuration and seed. Given what its probes so far showed (n_keys -> final
eval loss, accuracy and whether the run diverged: an ``Observation``), ``search_views`` returns
the n_keys to train next, each with why, and the verdict of each *view* of capacity located so
far; once every view asked for (``Spec.views``, from ``search.views``: all three by default)
is located it asks for nothing. The views are the analysis':

- **loss**: a point fails when its run diverged or its final eval loss is missing or above tau
  (``capacity.failing``); the failure point is located by the rule below (``next_probes``);
- **accuracy**: a point fails when diverged or its final eval accuracy is missing or below
  ``accuracy_threshold`` (the analysis' ``capacity.accuracy_failing``); same rule;
- **keys retrieved**: K(n) = n x final eval accuracy (0 when diverged or missing), its value the
  largest K probed. Located once a probe above the largest K's n has a smaller K (the peak is
  passed: "peaks"), once K is flat over the top probes while they answer keys wrong (the
  analysis' ``capacity.plateau``: "plateau"), or the top probe is ``max_keys`` ("never_peaks",
  bounded); until then it asks for the next step above its top probe (step 1 below).

Each round is the union of every unlocated view's next probes; an n_keys already observed
serves every view. The decision depends only on the set of observations, never on their order,
so an interrupted search continues from its probes, a finished one asks for nothing, and one
searched by an older rule (loss alone) is continued from all its probes.

The rule of the loss and accuracy views (``next_probes`` for the loss):

1. Bracket. The first round probes the multiples of the configuration's d_dot up to 1
   (``multiples``: 0.5 and 1); while every probe passes, the next multiple above (1.25), then
   doubling. A map without a bounded d_dot (softmax) starts a doubling search at ``start``
   (default d_key). Everything is clipped to [``min_keys``, ``max_keys``]; ``max_keys`` is at
   least 4 x d_dot for a bounded map (``make_spec``), as accuracy and keys retrieved hold past
   d_dot on some maps. Multiples above 1 come one round at a time because runs above capacity
   are the slowest, and most maps fail below d_dot.
2. Locate. With the probes sorted by n_keys, the candidate failure is the first failing probe
   whose next probe fails too (the analysis' rule: a failure followed by a pass is noise; a
   failing top probe counts alone). Below it lies the last pass a.
   - no candidate, all passes (or only noise): go up (step 1), up to ``max_keys``; a pass at
     ``max_keys`` is the verdict "never_fails" (lower bound max_keys);
   - the lowest probe is the candidate: probe ``min_keys``; a confirmed failure there is
     "fails_everywhere" (upper bound min_keys);
   - else split the bracket [a, b] until b - a <= ``resolution``: where the value, interpolated
     between a and b as the analysis does (the loss in log, the accuracy linearly), crosses its
     threshold, kept within the middle half of the bracket; at the midpoint when a value is
     unknown.
3. Confirm. Once the bracket is narrow enough, b is accepted only when the probe just above it
   fails and lies within ``resolution`` of it (or b is ``max_keys`` itself); otherwise
   b + resolution (rounded down) is probed. If that passes, b was noise and the search goes on above it.

After the bracket, one probe per view and series per round: on the machines this runs on,
rounds of all series together keep the workers busy, and a second probe per round would mostly
be spent above capacity, where runs are slowest.

Every probe is a new n_keys: no series is ever probed twice at one n_keys.

The module's name begins with an underscore so that Hydra's plugin scan, which executes every
other module of this package afresh on each start, leaves it alone: code that holds its classes
(``Probe``, ``Spec``, ``SearchConf``) keeps holding the ones it checks against.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kernelzoo.analysis.capacity import (LOSS_FLOOR, VIEW_WORDS, VIEWS, accuracy_failing, candidate,
                                         failing, keys_retrieved, plateau)
from kernelzoo.config import SearchConf


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
    accuracy_threshold: float = 0.99
    views: tuple[str, ...] = VIEWS  # the views located (``search.views``)

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
    """The Spec of one series from the search config and the configuration's own grid: its
    range is the grid's, up to at least 4 x d_dot for a bounded map (the accuracy and keys
    retrieved views hold past d_dot on some maps), unless search.min_keys/max_keys set it."""
    low = conf.min_keys if conf.min_keys is not None else min(grid_keys)
    high = conf.max_keys if conf.max_keys is not None else max(grid_keys)
    if conf.max_keys is None and d_dot is not None and math.isfinite(d_dot):
        high = max(high, round(4 * d_dot))
    resolution = conf.resolution if conf.resolution is not None else default_resolution(d_dot)
    return Spec(d_dot=d_dot, d_key=d_key, min_keys=int(low), max_keys=int(high),
                resolution=float(resolution), multiples=tuple(sorted(conf.multiples)),
                start=conf.start, threshold=conf.threshold,
                accuracy_threshold=conf.accuracy_threshold,
                views=tuple(v for v in VIEWS if v in conf.views))


@dataclass(frozen=True)
class _Crossing:
    """How a view interpolates its value between a bracket's ends (``_split``)."""

    name: str         # the value's name in a probe's why
    threshold: float
    log: bool         # the loss in log (floored at LOSS_FLOOR), the accuracy linearly


def next_probes(spec: Spec, observed: dict[int, bool],
                losses: dict[int, float] | None = None) -> list[Probe] | Verdict:
    """The loss view's probes of the next round for one series, or its Verdict when it is
    located. ``observed``: n_keys -> fails; ``losses``: n_keys -> final eval loss, where known."""
    return _locate(spec, observed, losses or {}, _Crossing("loss", spec.threshold, True))


def _locate(spec: Spec, observed: dict[int, bool], values: dict[int, float],
            crossing: _Crossing) -> list[Probe] | Verdict:
    """Bracket, locate and confirm the failure point of one view (the module's rule)."""
    lo, hi = spec.min_keys, spec.max_keys
    clip = _clipper(spec)
    if not observed:
        return _first(spec, clip)
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
        return _new(_split(a, b, values, crossing), observed)
    return Verdict("fails_at", last_pass=a, first_failure=b) if confirmed else _new(confirm, observed)


def _clipper(spec: Spec):
    """n_keys clipped to the series' range [min_keys, max_keys]."""
    return lambda n: int(min(max(n, spec.min_keys), spec.max_keys))


def _first(spec: Spec, clip) -> list[Probe]:
    """The first round: the multiples of d_dot up to 1, or the doubling's start (unbounded)."""
    if spec.bounded:
        ns = sorted({clip(round(m * spec.d_dot)) for m in spec.multiples if m <= 1}
                    or {clip(round(spec.multiples[0] * spec.d_dot))})
        return [Probe(n, f"bracket: {n / spec.d_dot:.3g} x d_dot") for n in ns]
    return [Probe(clip(spec.start or spec.d_key), "doubling: start (unbounded d_dot)")]


def _up(spec: Spec, top: int, clip, observed, because: str = "") -> list[Probe] | Verdict:
    """Everything up to ``top`` passes: the next multiple of d_dot above it, else double."""
    if top >= spec.max_keys:
        return Verdict("never_fails", bound=top)
    because = because or f"every probe up to {top} passes"
    above = [m for m in spec.multiples if spec.bounded and round(m * spec.d_dot) > top]
    if above:
        n = clip(round(above[0] * spec.d_dot))
        return _new(Probe(n, f"bracket: {above[0]:.3g} x d_dot ({because})"), observed)
    return _new(Probe(clip(2 * top), f"doubling: {because}"), observed)


def _split(a: int, b: int, values: dict[int, float], crossing: _Crossing) -> Probe:
    """The probe inside the bracket [a, b]: where the view's value, interpolated between its
    ends as the analysis does (the loss in log, the accuracy linearly), crosses its threshold,
    kept in the middle half of the bracket (so each round shrinks it by a quarter at least);
    the midpoint when either value is unknown."""
    va, vb, t = values.get(a), values.get(b), crossing.threshold
    if va is None or vb is None or not (math.isfinite(va) and math.isfinite(vb)):
        return Probe((a + b) // 2, f"bisect [{a}, {b}]")
    if crossing.log:
        va, vb, t = (math.log(max(v, LOSS_FLOOR)) for v in (va, vb, t))
    if not min(va, vb) < t < max(va, vb):
        return Probe((a + b) // 2, f"bisect [{a}, {b}]")
    guess = a + (t - va) / (vb - va) * (b - a)
    quarter = (b - a) / 4
    n = round(min(max(guess, a + quarter), b - quarter))
    what = "tau" if crossing.name == "loss" else f"{crossing.threshold:g}"
    return Probe(min(max(n, a + 1), b - 1), f"interpolate [{a}, {b}]: {crossing.name} crosses "
                                            f"{what} near {guess:.0f}")


def _new(probe: Probe, observed: dict[int, bool]) -> list[Probe]:
    """The probe as a round of one; an n_keys already observed is never trained twice."""
    if probe.n_keys in observed:
        raise AssertionError(f"search would probe n_keys={probe.n_keys} twice")
    return [probe]


def _number(value) -> float:
    return math.nan if value is None else float(value)


@dataclass(frozen=True)
class Observation:
    """What a finished probe showed: its final eval loss and accuracy (None or NaN: missing),
    and whether the run diverged."""

    loss: float | None
    accuracy: float | None
    diverged: bool = False

    def loss_fails(self, threshold: float) -> bool:
        return bool(failing(_number(self.loss), self.diverged, threshold))

    def accuracy_fails(self, threshold: float) -> bool:
        return bool(accuracy_failing(_number(self.accuracy), self.diverged, threshold))

    def keys_retrieved(self, n_keys: int) -> float:
        """The analysis' keys retrieved at this probe (``capacity.keys_retrieved``)."""
        return float(keys_retrieved(n_keys, _number(self.accuracy), self.diverged))


@dataclass(frozen=True)
class Peak:
    """The keys retrieved view located: the largest K, ``keys``, probed at ``at``; "peaks" when
    a probe above it, ``passed_at`` (the lowest such), retrieved fewer; "plateau" when K is
    largest at the top probe and flat over the top probes (``capacity.plateau``); "never_peaks"
    when K is largest at the top probe, ``bound`` = max_keys."""

    outcome: str
    keys: float
    at: int
    passed_at: int | None = None
    bound: int | None = None


@dataclass(frozen=True)
class Views:
    """A series' next round (``probes``, by n_keys; empty once every view is located) and each
    view's verdict so far (None: not located yet)."""

    probes: tuple[Probe, ...]
    verdicts: dict[str, Verdict | Peak | None]

    @property
    def located(self) -> bool:
        return not self.probes


def search_views(spec: Spec, observations: dict[int, Observation]) -> Views:
    """The next round of one series: the union of each unlocated view's next probes, each
    probe's why naming the views that asked for it (``"accuracy: bisect [48, 64]"``), and the
    verdict of every view located. Only the views of ``spec.views`` are searched: the others
    ask for nothing and have no verdict. Depends only on the set of observations."""
    usable = lambda value: value is not None and math.isfinite(value)  # noqa: E731
    kept = {n: o for n, o in observations.items() if not o.diverged}
    views = {
        "loss": lambda: _locate(
            spec, {n: o.loss_fails(spec.threshold) for n, o in observations.items()},
            {n: float(o.loss) for n, o in kept.items() if usable(o.loss)},
            _Crossing("loss", spec.threshold, True)),
        "accuracy": lambda: _locate(
            spec, {n: o.accuracy_fails(spec.accuracy_threshold) for n, o in observations.items()},
            {n: float(o.accuracy) for n, o in kept.items() if usable(o.accuracy)},
            _Crossing("accuracy", spec.accuracy_threshold, False)),
        "keys_retrieved": lambda: _peak(spec, observations),
    }
    wanted: dict[int, dict[str, list[str]]] = {}
    verdicts: dict[str, Verdict | Peak | None] = {}
    for view in spec.views:
        nxt = views[view]()
        if isinstance(nxt, (Verdict, Peak)):
            verdicts[view] = nxt
            continue
        verdicts[view] = None
        for p in nxt:
            wanted.setdefault(p.n_keys, {}).setdefault(p.why, []).append(VIEW_WORDS[view])
    probes = tuple(Probe(n, "; ".join(f"{', '.join(names)}: {why}"
                                      for why, names in wanted[n].items()))
                   for n in sorted(wanted))
    return Views(probes, verdicts)


def _peak(spec: Spec, observations: dict[int, Observation]) -> list[Probe] | Peak:
    """The keys retrieved view: its Peak once passed, flat (a plateau) or bounded by max_keys,
    else the next step above the top probe (``_up``)."""
    hi = spec.max_keys
    clip = _clipper(spec)
    if not observations:
        return _first(spec, clip)
    ns = sorted(observations)
    ks = [observations[n].keys_retrieved(n) for n in ns]
    best = max(ks)
    i = ks.index(best)  # the lowest n retrieving the most
    passed = [n for n, k in zip(ns[i + 1:], ks[i + 1:]) if k < best]
    if passed:
        return Peak("peaks", keys=best, at=ns[i], passed_at=passed[0])
    if plateau(ns, ks):
        return Peak("plateau", keys=best, at=ns[i])
    if ns[-1] >= hi:
        return Peak("never_peaks", keys=best, at=ns[i], bound=ns[-1])
    return _up(spec, ns[-1], clip, observations,
               f"K = n x accuracy is largest at the top probe, {ns[-1]}")
