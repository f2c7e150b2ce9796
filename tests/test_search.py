"""The failure-point search (kernelzoo.search) on synthetic loss oracles: no training.

An oracle says whether a point fails; ``run_search`` plays the rounds as the sweeper does (every
probe of a round observed before the next round is asked for) and returns the verdict, the
probes in order and the number of rounds.
"""

from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest

from kernelzoo.analyze import loss_failure
from kernelzoo.search import (Probe, SearchConf, Spec, Verdict, default_resolution, failing,
                              make_spec, next_probes)


def run_search(spec: Spec, fails, max_rounds: int = 60, loss=None):
    """Play the rounds; with ``loss`` (n -> final eval loss) the search also sees losses."""
    observed, losses, probes = {}, {}, []
    for rounds in itertools.count(1):
        assert rounds <= max_rounds, f"no verdict after {max_rounds} rounds: {probes}"
        nxt = next_probes(spec, observed, losses)
        if isinstance(nxt, Verdict):
            return nxt, probes, rounds - 1
        assert nxt, "a round without probes and without a verdict"
        for p in nxt:
            assert isinstance(p, Probe) and p.why
            assert p.n_keys not in observed, f"n_keys={p.n_keys} probed twice"
            assert spec.min_keys <= p.n_keys <= spec.max_keys
            observed[p.n_keys] = bool(fails(p.n_keys))
            if loss is not None:
                losses[p.n_keys] = loss(p.n_keys)
            probes.append(p.n_keys)


def spec(d_dot=64, lo=4, hi=600, resolution=None, **kw) -> Spec:
    res = default_resolution(d_dot) if resolution is None else resolution
    return Spec(d_dot=d_dot, d_key=kw.pop("d_key", 64), min_keys=lo, max_keys=hi,
                resolution=res, **kw)


def check_located(verdict: Verdict, capacity: float, resolution: float):
    """fails_at with last_pass < capacity <= first_failure, within the resolution."""
    assert verdict.outcome == "fails_at", verdict
    assert verdict.last_pass < capacity <= verdict.first_failure, verdict
    assert verdict.first_failure - verdict.last_pass <= resolution


@pytest.mark.parametrize("d_dot", [16, 64, 128, 256, 384, 1024])
@pytest.mark.parametrize("ratio", [0.3, 0.7, 0.98, 1.0, 1.02, 1.2, 1.4, 1.9])
def test_monotone_oracle_is_located_within_the_resolution(d_dot, ratio):
    capacity = max(5, round(ratio * d_dot))
    s = spec(d_dot, lo=2, hi=4 * d_dot)
    verdict, probes, rounds = run_search(s, lambda n: n >= capacity)
    check_located(verdict, capacity, s.resolution)
    assert len(probes) <= 16 and rounds <= 12, (probes, rounds)


def test_figure2_like_search_costs_few_runs():
    """DPFP-3 (d_dot 384) failing at 390 keys, resolution 20 in [20, 600]: the grid's 30 runs
    become a handful, and the bracket holds the failure point."""
    s = spec(384, lo=20, hi=600, resolution=20)
    verdict, probes, rounds = run_search(s, lambda n: n >= 390)
    check_located(verdict, 390, 20)
    assert probes[:3] == [192, 384, 480]  # 0.5 and 1 x d_dot, then 1.25 as both pass
    assert len(probes) <= 8 and rounds <= 6


@pytest.mark.parametrize("seed", range(40))
def test_one_isolated_failure_below_capacity_is_noise(seed):
    """A failure followed by a pass is noise (the analysis' rule): the search still finds the
    capacity, even when the isolated failure sits exactly on one of its probes."""
    rng = random.Random(seed)
    d_dot = rng.choice([32, 64, 128, 256])
    capacity = rng.randint(d_dot // 2, 2 * d_dot)
    s = spec(d_dot, lo=2, hi=4 * d_dot)
    clean, _, _ = run_search(s, lambda n: n >= capacity)
    # put the noise on a probe that a clean search makes below capacity, or anywhere below
    _, clean_probes, _ = run_search(s, lambda n: n >= capacity)
    below = [n for n in clean_probes if n < capacity - s.resolution] or [capacity // 2]
    noise = rng.choice(below)
    verdict, probes, _ = run_search(s, lambda n: n >= capacity or n == noise)
    assert noise in probes or noise not in clean_probes
    check_located(verdict, capacity, s.resolution)


def test_noise_on_the_first_bracket_point():
    """The lowest bracket probe fails alone and the next one fails for real: the confirmation
    probe just above the lowest one passes, so the search goes on above it."""
    s = spec(100, lo=2, hi=400, resolution=5)
    verdict, probes, _ = run_search(s, lambda n: n >= 90 or n == 50)
    check_located(verdict, 90, 5)
    assert 55 in probes  # confirm the failure at 50 -> passes -> noise


def test_fails_everywhere_is_confirmed_at_min_keys():
    s = spec(128, lo=20, hi=600, resolution=20)
    verdict, probes, rounds = run_search(s, lambda n: True)
    assert verdict == Verdict("fails_everywhere", bound=20)
    assert probes == [64, 128, 20, 40]  # bracket, down to min_keys, confirm above it
    assert rounds == 3


def test_never_fails_doubles_up_to_max_keys():
    s = spec(64, lo=4, hi=600)
    verdict, probes, _ = run_search(s, lambda n: False)
    assert verdict == Verdict("never_fails", bound=600)
    assert probes == [32, 64, 80, 160, 320, 600]


@pytest.mark.parametrize("capacity", [7, 100, 333, 561, 700])
def test_unbounded_map_doubles_from_d_key(capacity):
    s = spec(None, lo=20, hi=600, resolution=0.0, d_key=64)
    verdict, probes, _ = run_search(s, lambda n: n >= capacity)
    assert probes[0] == 64
    if capacity > 600:
        assert verdict == Verdict("never_fails", bound=600)
    elif capacity <= 20:
        assert verdict == Verdict("fails_everywhere", bound=20)
    else:  # 5% of the bracket's lower end, at least 2 keys
        check_located(verdict, capacity, max(2, 0.05 * verdict.last_pass))


def test_the_decision_depends_only_on_the_observations():
    """Replaying any subset of a finished search's probes asks for the same next probes: what
    an interrupted search does when it reads its probes back from the store."""
    s = spec(256, lo=20, hi=600, resolution=20)
    verdict, probes, _ = run_search(s, lambda n: n >= 250)
    observed = {n: n >= 250 for n in probes}
    assert next_probes(s, observed) == verdict
    shuffled = dict(sorted(observed.items(), key=lambda kv: random.Random(1).random()))
    assert next_probes(s, shuffled) == verdict


def test_the_rule_is_the_analysis_rule():
    """On the probes of a search, the analysis' loss rule brackets the same failure point."""
    s = spec(128, lo=20, hi=600, resolution=20)
    loss = lambda n: 1e-4 if n < 123 else 0.05 + n / 1e4  # noqa: E731
    verdict, probes, _ = run_search(s, lambda n: bool(failing(loss(n), False, 0.01)))
    ns = sorted(probes)
    result = loss_failure(ns, [loss(n) for n in ns], [False] * len(ns), 0.01)
    assert result.outcome == "fails_at"
    assert (result.last_pass, result.first_failure) == (verdict.last_pass, verdict.first_failure)


def test_failing_matches_the_analysis():
    loss = np.array([0.001, 0.02, math.nan, 0.005])
    assert failing(loss, [False, False, False, True], 0.01).tolist() == [False, True, True, True]
    assert bool(failing(0.01, False, 0.01)) is False  # at tau passes: "above tau" fails


def test_make_spec_defaults_to_the_grid_range_and_5_percent():
    s = make_spec(SearchConf(name="bisect"), 384, 64, [20, 600])
    assert (s.min_keys, s.max_keys, s.resolution) == (20, 600, 0.05 * 384)
    assert make_spec(SearchConf(name="bisect"), 16, 16, [4, 40]).resolution == 2.0
    assert make_spec(SearchConf(name="bisect", min_keys=8, resolution=20), None, 64,
                     [20, 600]).min_keys == 8
    assert make_spec(SearchConf(name="bisect"), None, 64, [20, 600]).resolution_at(500) == 25


def smooth_loss(capacity: float):
    """A loss that grows by a decade every 20 keys and crosses tau = 0.01 just below
    ``capacity``, the first failing n."""
    return lambda n: 0.01 * 10 ** ((n - capacity + 0.5) / 20)


@pytest.mark.parametrize("capacity", [101, 250, 389, 455])
def test_losses_steer_the_split_to_where_the_loss_crosses_tau(capacity):
    """With the losses, the probe inside a bracket is where the log-loss interpolation crosses
    tau (kept in the bracket's middle half): fewer probes than bisection, same verdict rule."""
    s = spec(384, lo=20, hi=600, resolution=20)
    loss = smooth_loss(capacity)
    fails = lambda n: loss(n) > 0.01  # noqa: E731
    plain, plain_probes, _ = run_search(s, fails)
    steered, probes, _ = run_search(s, fails, loss=loss)
    check_located(steered, capacity, 20)
    check_located(plain, capacity, 20)
    assert len(probes) <= len(plain_probes), (probes, plain_probes)


def test_split_stays_in_the_middle_half_and_falls_back_to_the_midpoint():
    s = spec(384, lo=20, hi=600, resolution=20)
    observed = {192: False, 384: False, 480: True}
    far = next_probes(s, observed, {192: 1e-4, 384: 9.9e-3, 480: 0.5})
    assert far[0].n_keys == 408 and far[0].why.startswith("interpolate [384, 480]")  # 384 + 96/4
    near = next_probes(s, observed, {192: 1e-4, 384: 1e-3, 480: 1e-1})
    assert near[0].n_keys == 432  # crossing at 432 exactly
    assert next_probes(s, observed, {})[0] == Probe(432, "bisect [384, 480]")
    assert next_probes(s, observed, {384: 1e-3, 480: math.nan})[0].n_keys == 432
