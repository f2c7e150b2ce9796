"""The failure-point search (hydra_plugins.kernelzoo_sweeper._search) on synthetic loss oracles:
no training.

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

from kernelzoo.analysis.capacity import (VIEW_WORDS, VIEWS, accuracy_failing, failing, loss_failure,
                                         plateau)
from hydra_plugins.kernelzoo_sweeper._search import (Observation, Peak, Probe, SearchConf, Spec,
                                                     Verdict, default_resolution, make_spec,
                                                     next_probes, search_views)


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
    assert (s.min_keys, s.max_keys, s.resolution) == (20, 4 * 384, 0.05 * 384)  # 4 x d_dot
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


# Every view of capacity (search_views): loss, accuracy and keys retrieved, on oracles
# ``observe(n) -> (final eval loss, final eval accuracy)``.


def run_views(spec: Spec, observe, observed: dict | None = None, max_rounds: int = 60):
    """Play the rounds of every view from ``observed`` (n -> Observation; a search already in
    the store): the last Views, the new probes in order (n, why) and the number of rounds."""
    observed, probes = dict(observed or {}), []
    for rounds in itertools.count(1):
        assert rounds <= max_rounds, f"no verdicts after {max_rounds} rounds: {probes}"
        views = search_views(spec, observed)
        if views.located:
            assert all(v is not None for v in views.verdicts.values()), views
            return views, probes, rounds - 1
        assert [p.n_keys for p in views.probes] == sorted({p.n_keys for p in views.probes})
        for p in views.probes:
            assert p.n_keys not in observed, f"n_keys={p.n_keys} probed twice"
            assert spec.min_keys <= p.n_keys <= spec.max_keys
            assert any(p.why.startswith(v) for v in ("loss", "accuracy", "keys retrieved")), p
            observed[p.n_keys] = Observation(*observe(p.n_keys))
            probes.append((p.n_keys, p.why))


def rank_bound(d_dot: int, decay: float = 1.0):
    """Loss fails right above d_dot; accuracy (d_dot / n) ** decay above it: K = n x accuracy
    is flat at d_dot for decay 1, falls past d_dot for decay > 1."""
    return lambda n: (1e-4, 1.0) if n <= d_dot else (0.2, (d_dot / n) ** decay)


def test_rank_bound_series_keys_retrieved_is_a_plateau_once_flat_over_a_doubling():
    s = spec(64, lo=8, hi=256)
    views, probes, rounds = run_views(s, rank_bound(64))
    loss, accuracy, keys = (views.verdicts[v] for v in ("loss", "accuracy", "keys_retrieved"))
    check_located(loss, 65, s.resolution)
    check_located(accuracy, 65, s.resolution)  # 64 / 65 < 0.99
    # K = 64 from 64 keys up, never smaller: flat over three probes that answer keys wrong, the
    # analysis' plateau, so the doubling stops short of max_keys
    assert keys == Peak("plateau", keys=64.0, at=64)
    ns = [n for n, _ in probes]
    assert ns[:2] == [32, 64] and max(ns) < 256 and len(ns) == len(set(ns))
    assert plateau(sorted(ns), [min(n, 64.0) for n in sorted(ns)])  # the analysis' reading too
    assert rounds <= 8 and len(ns) <= 10, probes


def test_a_keys_retrieved_count_that_still_rises_is_doubled_to_max_keys():
    """K rises 10% per doubling past d_dot (never flat within 5%): never_peaks at max_keys."""
    s = spec(64, lo=8, hi=256)
    rising = lambda n: (1e-4, 1.0) if n <= 64 else (0.2, 64 * 1.1 ** math.log2(n / 64) / n)
    keys = run_views(s, rising)[0].verdicts["keys_retrieved"]
    assert keys.outcome == "never_peaks" and keys.bound == 256, keys


def test_rank_bound_series_with_falling_accuracy_peaks_at_d_dot():
    s = spec(64, lo=8, hi=256)
    views, probes, _ = run_views(s, rank_bound(64, decay=2))
    keys = views.verdicts["keys_retrieved"]
    assert keys.outcome == "peaks" and (keys.keys, keys.at) == (64.0, 64), keys
    assert keys.passed_at > 64 and max(n for n, _ in probes) < 256  # no probe to max_keys


def diluted(loss_fails_at: int, accuracy_holds_to: int):
    """Loss above tau from ``loss_fails_at`` keys on, accuracy 1.0 up to ``accuracy_holds_to``
    keys and (holds_to / n) ** 2 above (K falls past it)."""
    def observe(n):
        loss = 1e-3 if n < loss_fails_at else 0.02 * 10 ** ((n - loss_fails_at) / 40)
        return loss, 1.0 if n <= accuracy_holds_to else (accuracy_holds_to / n) ** 2
    return observe


def test_diluted_series_is_probed_past_d_dot_for_accuracy_and_keys_retrieved():
    """Loss fails at 13 keys, accuracy holds to 2 x d_dot = 64: the accuracy and keys retrieved
    views are probed past d_dot, each located."""
    s = make_spec(SearchConf(name="bisect"), 32, 32, [4, 80])
    assert s.max_keys == 128  # 4 x d_dot, above the grid's 80
    views, probes, rounds = run_views(s, diluted(13, 64))
    loss, accuracy, keys = (views.verdicts[v] for v in ("loss", "accuracy", "keys_retrieved"))
    check_located(loss, 13, s.resolution)
    check_located(accuracy, 65, s.resolution)
    assert keys.outcome == "peaks" and keys.at == accuracy.last_pass == keys.keys
    assert keys.passed_at > keys.at
    asked = {n: why for n, why in probes}
    assert [n for n in asked if n > 32 and why_of(asked[n], "accuracy")], probes
    assert not any(why_of(why, "loss") for n, why in probes if n > 40), probes  # loss: below
    assert rounds <= 12 and len(probes) <= 16, probes


def why_of(why: str, view: str) -> bool:
    """Whether the view asked for a probe whose why is ``why``."""
    return any(view in part.split(":")[0] for part in why.split("; "))


def test_first_round_is_shared_and_each_why_names_its_views():
    s = spec(64, lo=8, hi=256)
    assert search_views(s, {}).probes == (
        Probe(32, "loss, accuracy, keys retrieved: bracket: 0.5 x d_dot"),
        Probe(64, "loss, accuracy, keys retrieved: bracket: 1 x d_dot"))
    ok, bad = Observation(1e-4, 1.0), Observation(0.5, 0.5)
    views = search_views(s, {32: ok, 64: Observation(0.05, 1.0)})  # loss fails, accuracy holds
    assert views.probes == (
        Probe(56, "loss: interpolate [32, 64]: loss crosses tau near 56"),
        Probe(80, "accuracy: bracket: 1.25 x d_dot (every probe up to 64 passes); keys "
                  "retrieved: bracket: 1.25 x d_dot (K = n x accuracy is largest at the top "
                  "probe, 64)"))
    assert views.verdicts == {"loss": None, "accuracy": None, "keys_retrieved": None}
    assert search_views(s, {32: ok, 64: bad, 40: bad}).verdicts["keys_retrieved"] == \
        Peak("peaks", keys=32.0, at=32, passed_at=40)


def test_accuracy_bracket_is_split_where_the_accuracy_crosses_linearly():
    s = spec(64, lo=8, hi=256)
    obs = {32: Observation(1e-4, 1.0), 64: Observation(1e-4, 0.98), 80: Observation(1e-4, 0.9)}
    accuracy = [p for p in search_views(s, obs).probes if why_of(p.why, "accuracy")]
    # crossing at 32 + (1 - 0.99) / (1 - 0.98) x 32 = 48, inside the middle half [40, 56]
    assert accuracy == [Probe(48, "accuracy: interpolate [32, 64]: accuracy crosses 0.99 near "
                                  "48")]


@pytest.mark.parametrize("seed", range(8))
def test_views_depend_only_on_the_set_of_observations(seed):
    rng = random.Random(seed)
    d_dot = rng.choice([16, 32, 64, 128])
    observe = diluted(rng.randint(2, d_dot), rng.randint(d_dot // 2, 3 * d_dot))
    s = spec(d_dot, lo=4, hi=4 * d_dot)
    views, probes, _ = run_views(s, observe)
    observed = {n: Observation(*observe(n)) for n, _ in probes}
    for _ in range(3):
        items = list(observed.items())
        rng.shuffle(items)
        assert search_views(s, dict(items)) == views
        subset = dict(items[:rng.randint(0, len(items))])
        again = dict(sorted(subset.items(), key=lambda kv: rng.random()))
        assert search_views(s, subset) == search_views(s, again)
        # continued from any subset, every view is located and nothing is probed twice
        done, more, _ = run_views(s, observe, subset)
        assert not {n for n, _ in more} & set(subset)


def test_bounded_map_is_searched_up_to_4_d_dot():
    conf = SearchConf(name="bisect")
    assert make_spec(conf, 64, 16, [8, 160]).max_keys == 256
    assert make_spec(conf, 64, 16, [8, 600]).max_keys == 600  # the grid's, when larger
    assert make_spec(conf, 66, 16, [8, 165]).max_keys == 264
    assert make_spec(SearchConf(name="bisect", max_keys=100), 64, 16, [8, 160]).max_keys == 100
    assert make_spec(conf, None, 64, [20, 600]).max_keys == 600  # unbounded: the grid's
    s = make_spec(conf, 64, 16, [8, 160])
    views, probes, _ = run_views(s, lambda n: (1e-4, 1.0))  # never fails
    assert views.verdicts["loss"] == views.verdicts["accuracy"] == Verdict("never_fails", 256)
    assert views.verdicts["keys_retrieved"] == Peak("never_peaks", keys=256.0, at=256, bound=256)
    assert [n for n, _ in probes] == [32, 64, 80, 160, 256]


def test_a_loss_only_search_continues_with_the_other_views_only():
    """A store searched by the loss rule alone: its probes are replayed, the search asks only
    for what the accuracy and keys retrieved views need."""
    s = spec(32, lo=4, hi=128)
    observe = diluted(13, 64)
    old, old_probes, _ = run_search(s, lambda n: observe(n)[0] > 0.01,
                                    loss=lambda n: observe(n)[0])
    check_located(old, 13, s.resolution)
    stored = {n: Observation(*observe(n)) for n in old_probes}
    views, probes, _ = run_views(s, observe, stored)
    assert views.verdicts["loss"] == old  # nothing more to learn about the loss
    assert probes and not any(why_of(why, "loss") for _, why in probes), probes
    assert not {n for n, _ in probes} & set(stored)
    check_located(views.verdicts["accuracy"], 65, s.resolution)
    # a finished search asks for nothing
    final = {**stored, **{n: Observation(*observe(n)) for n, _ in probes}}
    assert search_views(s, final).located


def test_observation_rules_are_the_analysis_rules():
    for loss, acc, diverged in [(1e-3, 1.0, False), (0.02, 0.995, False), (1e-3, 0.98, False),
                                (None, None, False), (1e-3, 1.0, True), (math.nan, 0.99, False)]:
        o = Observation(loss, acc, diverged)
        number = lambda v: math.nan if v is None else v  # noqa: E731
        assert o.loss_fails(0.01) == bool(failing(number(loss), diverged, 0.01))
        assert o.accuracy_fails(0.99) == bool(accuracy_failing(number(acc), diverged, 0.99))
    assert Observation(1e-3, 0.5).keys_retrieved(40) == 20.0
    assert Observation(1e-3, 1.0, diverged=True).keys_retrieved(40) == 0.0
    assert Observation(1e-3, None).keys_retrieved(40) == 0.0


@pytest.mark.parametrize("asked", [("loss",), ("loss", "accuracy")])
def test_a_search_asks_only_for_the_probes_of_the_views_asked_for(asked):
    """``search.views`` on the diluted series (accuracy and keys retrieved hold to 2 x d_dot,
    the loss fails at 13): no probe is asked for by a view left out, each view asked for is
    located as in a search of every view, and the search costs fewer probes."""
    grid = [4, 80]
    s = make_spec(SearchConf(name="bisect", views=list(asked)), 32, 32, grid)
    assert s.views == asked
    views, probes, _ = run_views(s, diluted(13, 64))
    _, every, _ = run_views(make_spec(SearchConf(name="bisect"), 32, 32, grid), diluted(13, 64))
    assert set(views.verdicts) == set(asked)
    check_located(views.verdicts["loss"], 13, s.resolution)
    if "accuracy" in asked:
        check_located(views.verdicts["accuracy"], 65, s.resolution)
    left_out = [VIEW_WORDS[v] for v in VIEWS if v not in asked]
    assert not any(why_of(why, word) for _, why in probes for word in left_out), probes
    assert len(probes) < len(every), (probes, every)


def test_a_view_the_search_left_out_is_marked_not_searched():
    """The analysis of a loss-only search: the accuracy and keys retrieved views are
    ``not_searched`` (the report says so), not the bounds their probes would give."""
    import pandas as pd

    from kernelzoo.analysis.capacity import combine, seed_table
    from kernelzoo.report.markdown import observed

    runs = pd.DataFrame({"label": "ELU+1", "seed": 1, "status": "converged",
                         "n_keys": [8, 16, 20], "final_eval_loss": [1e-4, 1e-3, 0.5],
                         "final_eval_accuracy": [1.0, 1.0, 1.0], "search_views": "loss"})
    [row] = seed_table(runs, 0.01, 0.99).to_dict("records")
    assert row["outcome"] == "fails_at" and 16 < row["value"] < 20
    assert row["outcome_acc"] == row["outcome_keys"] == "not_searched"
    assert math.isnan(row["value_acc"]) and math.isnan(row["value_keys"])
    [every] = seed_table(runs.drop(columns="search_views"), 0.01, 0.99).to_dict("records")
    assert every["outcome_acc"] == "never_fails"  # what a grid's runs would say: a bound
    assert combine(["not_searched", "not_searched"]) == "not_searched"
    assert combine(["no_data", "fails_at"]) == "fails_at"
    cell = pd.Series({"view": "accuracy", "failure_point": math.nan, "outcome": "not_searched",
                      "ci_low": math.nan, "ci_high": math.nan, "n_seeds": 1})
    assert observed(cell) == "not searched"
