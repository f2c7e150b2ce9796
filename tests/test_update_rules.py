"""The update rules compared (``update_rules.py``, experiment figure3): ranking under the accuracy
criterion, the sum rule under replacement, diverged runs, and the fwm loss floor the section
cites."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from synthetic import analyze_store, write_run, write_series

from kernelzoo.analysis import update_rules
from kernelzoo.analysis.capacity import capacity_table, seed_table
from kernelzoo.analysis.runs import load_runs
from kernelzoo.report.studies import update_rule_section

TAU = 0.01
DPFP1 = {"feature_map": "dpfp", "params": {"nu": 1}, "d_dot": 128, "task": "update"}


def write_figure3_store(exp):
    """DPFP-1 with three rules (sum fails everywhere, delta fails after 100 keys, fwm's loss
    sits far above tau but its accuracy fails after 80) and ELU+1 delta diverging from 60."""
    write_series(exp, {n: 0.3 for n in range(20, 101, 20)}, update_rule="sum",
                 accuracy=0.5, **DPFP1)
    write_series(exp, {**{n: 0.0005 for n in range(20, 101, 20)}, 120: 0.3, 140: 0.4},
                 update_rule="delta", **DPFP1)
    for n, accuracy in ((20, 1.0), (40, 1.0), (60, 1.0), (80, 1.0), (100, 0.9), (120, 0.8)):
        write_run(exp, n_keys=n, loss=n / 2, accuracy=accuracy, update_rule="fwm", **DPFP1)
    write_series(exp, {20: 0.0005, 40: 0.0005}, feature_map="elu", update_rule="delta",
                 task="update")
    for n in (60, 80):
        write_run(exp, n_keys=n, loss=None, accuracy=None, feature_map="elu",
                  update_rule="delta", status="diverged", task="update",
                  reason=f"non-finite train loss at step {n * 10}")


def tables(exp):
    runs, _, _ = load_runs(exp)
    return capacity_table(runs, seed_table(runs, TAU, 0.99)), runs


def test_rules_are_ranked_by_the_accuracy_criterion(tmp_path):
    write_figure3_store(tmp_path / "f3")
    capacity, runs = tables(tmp_path / "f3")
    found = update_rules.table(capacity)
    dpfp = found[found["map"] == "DPFP-1"]
    assert dpfp["update_rule"].tolist() == ["delta", "fwm", "sum"]
    assert dpfp["rank"].tolist() == [1, 2, 3]
    assert dpfp["observed_capacity_acc"].tolist() == pytest.approx(
        [100 + 0.0095 / 0.2995 * 20, 80 + 0.01 / 0.1 * 20, 20])  # accuracy = 1 - loss
    assert dpfp["outcome_acc"].tolist() == ["fails_at", "fails_at", "fails_everywhere"]
    # fwm's loss view is shown, with its floor named; it is ranked by accuracy
    assert dpfp[dpfp["update_rule"] == "fwm"]["outcome"].item() == "fails_everywhere"
    assert found[found["map"] == "ELU+1"]["rank"].tolist() == [1]


def test_the_section_states_ranking_sum_rule_and_divergence(tmp_path):
    write_figure3_store(tmp_path / "f3")
    capacity, runs = tables(tmp_path / "f3")
    text = "\n".join(update_rule_section(capacity, runs))
    assert "Ranking (most keys first): DPFP-1: delta 101 > fwm 82 > sum <= 20." in text
    distinct = 82 * (1 - (1 - 1 / 82) ** 82)  # evaluation sequences of n_keys writes
    assert f"{distinct:.3g}" == "52"
    assert ("| DPFP-1 | 2 | fwm | 128 | 82 | fails_at | 0.64 | 52 (0.41) | 20 (fails_everywhere) "
            "(LayerNorm output: at least 0.5 / S) | " in text)
    assert "| DPFP-1 | 3 | sum | 128 | <= 20 | fails_everywhere | 0.16 | <= 12.8 (0.10) |" in text
    assert ("- DPFP-1 sum: fails at every n_keys tried (<= 20): with replacement it cannot "
            "retrieve") in text
    assert "ELU+1 sum" not in text
    assert ("- ELU+1 delta: 2 of 4 runs, at n_keys 60, 80. First reason: non-finite train loss "
            "at step 600 (1 more)") in text
    assert "Runs that diverged: 2 (" in text


@pytest.mark.parametrize("length", [30, 60])
def test_distinct_keys_as_drawn(length):
    """S (1 - (1 - 1/S)^L) against 20000 simulated sequences of L draws over S = 30 keys."""
    draws = torch.randint(30, (20000, length), generator=torch.Generator().manual_seed(0))
    seen = torch.zeros(20000, 30).scatter_(1, draws, 1.0).sum(1).mean().item()
    assert update_rules.distinct_keys(30, length, replacement=True) == pytest.approx(seen, rel=2e-3)
    assert update_rules.distinct_keys(30, length, replacement=False) == min(30, length)


def test_the_section_is_left_out_with_one_rule(tmp_path):
    write_series(tmp_path / "one", {20: 0.0005, 40: 0.3})
    capacity, runs = tables(tmp_path / "one")
    assert update_rule_section(capacity, runs) == []


def test_the_report_carries_the_section(tmp_path):
    results = tmp_path / "results"
    write_figure3_store(results / "f3")
    report = (analyze_store(results, "f3", TAU) / "report.md").read_text()
    assert report.index("## Update rules") < report.index("## What is missing")


@pytest.mark.parametrize("n_keys", [20, 100, 200])
def test_fwm_loss_floor_as_the_docstring_states(n_keys):
    """The best a LayerNorm output can do against a one-hot target is LayerNorm(one-hot):
    loss 0.5 (1 + (sqrt(S - 1) - 1)^2), 6.1 at 20 keys."""
    target = F.one_hot(torch.tensor(3), n_keys).double()
    best = F.layer_norm(target, (n_keys,), eps=0.0)
    loss = 0.5 * ((target - best) ** 2).sum().item()
    assert loss == pytest.approx(0.5 * (1 + (math.sqrt(n_keys - 1) - 1) ** 2))
    other = F.layer_norm(target + 0.3 * torch.randn(n_keys, dtype=torch.double), (n_keys,), eps=0.0)
    assert 0.5 * ((target - other) ** 2).sum().item() >= loss
    if n_keys == 20:
        assert f"{loss:.2g}" == "6.1" and "6.1 at 20 keys" in update_rules.__doc__


def test_a_read_out_with_variance_near_the_layer_norm_eps_reaches_the_mean_floor():
    """Below the norm-fixing regime fwm's loss can reach 0.5 / S and no lower: LayerNorm of a
    scaled one-hot c e_t, c = sqrt(eps / (1 - v)) with v its variance per unit scale, is exactly
    e_t - 1/S (0.025 at 20 keys: the committed DPFP-1 + fwm run ends there); any zero-mean y is
    at least that far from the one-hot."""
    for n_keys in (20, 100):
        target = F.one_hot(torch.tensor(3), n_keys).double()
        v = (n_keys - 1) / n_keys ** 2
        y = F.layer_norm(math.sqrt(1e-5 / (1 - v)) * target, (n_keys,), eps=1e-5)
        loss = 0.5 * ((target - y) ** 2).sum().item()
        assert loss == pytest.approx(0.5 / n_keys)
        other = F.layer_norm(torch.randn(n_keys, dtype=torch.double) * 1e-3, (n_keys,), eps=1e-5)
        assert 0.5 * ((target - other) ** 2).sum().item() >= 0.5 / n_keys
    assert "0.025 at 20 keys" in update_rules.__doc__
