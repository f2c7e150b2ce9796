"""Seeds until decided (analysis/sequential.py): the race adds seeds only to the undecided first
tier, tests each look at ALPHA / looks, and leaves out a configuration whose seed is a bound."""

from __future__ import annotations

import numpy as np
import pytest

from kernelzoo.analysis import sequential, tiers


def fixed(values: dict[str, list[float]]):
    """A draw that hands out each configuration's listed values in order, recording the asks."""
    given = {label: 0 for label in values}
    asked = []

    def draw(label: str, n: int) -> np.ndarray:
        asked.append((label, n))
        out = values[label][given[label]:given[label] + n]
        given[label] += n
        return np.asarray(out, float)
    return draw, asked


def test_the_looks_planned_share_the_level():
    assert sequential.planned() == 8 and sequential.planned(5, 10, 1) == 6
    assert sequential.planned(3, 10, 2) == 4  # 3, 5, 7, 9 seeds


def test_the_first_tier_is_the_tiers_first_tier():
    rng = np.random.default_rng(3)
    for _ in range(20):
        samples = {f"c{i}": rng.normal(0.8 + 0.05 * rng.integers(0, 3), 0.05, 4)
                   for i in range(5)}
        order = sorted(samples, key=lambda k: -samples[k].mean())
        split = tiers.separated(samples)
        members = [order[0]]
        for label in order[1:]:
            if any(split[label, m] for m in members):
                break
            members.append(label)
        assert sequential.first_tier(samples, tiers.ALPHA) == tuple(members)


def test_a_clear_leader_is_decided_at_the_first_look():
    draw, asked = fixed({"a": [1.0, 1.01, 0.99], "b": [0.5, 0.51, 0.49], "c": [0.5, 0.52, 0.48]})
    found = sequential.race(draw, ["a", "b", "c"])
    assert found.decided and found.first == ("a",) and found.looks == 1
    assert found.seeds == {"a": 3, "b": 3, "c": 3} and len(asked) == 3


def test_only_the_undecided_first_tier_gets_seeds_until_the_most():
    """a and b tie, c is far below: a and b get a seed a round up to 10, c keeps its 3; the
    race ends undecided after its 8 looks."""
    rng = np.random.default_rng(0)
    tie = {label: list(0.8 + 0.05 * rng.standard_normal(10)) for label in "ab"}
    tie["a"] = list(np.asarray(tie["b"]) + 0.001)  # the same up to a hair: never separated
    draw, asked = fixed({**tie, "c": [0.3, 0.31, 0.29]})
    found = sequential.race(draw, ["a", "b", "c"])
    assert not found.decided and set(found.first) == {"a", "b"}
    assert found.seeds == {"a": 10, "b": 10, "c": 3} and found.looks == 8
    assert asked.count(("c", 1)) == 0 and asked.count(("a", 1)) == 7


def test_each_look_tests_at_alpha_over_the_looks(monkeypatch):
    levels = []
    original = sequential.separated

    def spy(samples, alpha):
        levels.append(alpha)
        return original(samples, alpha)
    monkeypatch.setattr(sequential, "separated", spy)
    draw, _ = fixed({"a": [0.8, 0.81, 0.79, 0.8], "b": [0.8, 0.79, 0.81, 0.8]})
    sequential.race(draw, ["a", "b"], start=3, most=4)
    assert levels == [pytest.approx(tiers.ALPHA / 2)] * 2


def test_a_seed_that_is_a_bound_takes_its_configuration_out():
    draw, _ = fixed({"a": [1.0, 1.01, 0.99], "b": [0.5, np.nan, 0.49], "c": [0.5, 0.52, 0.48]})
    found = sequential.race(draw, ["a", "b", "c"])
    assert found.apart == ("b",) and "b" not in found.seeds and found.first == ("a",)
