"""Capacity diagnostics (kernelzoo.core.diagnostics) on constructed models whose answers are known."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import train

from kernelzoo.records import store
from kernelzoo.core.diagnostics import (SPREAD_MIN, VANISH_RATIO, dead_keys, divergence,
                                   feature_ranks, measure, read_margins, written_features)
from kernelzoo.maps.catalog import build_feature_map
from kernelzoo.core.model import RetrievalModel
from kernelzoo.core.task import RetrievalTask

S = 4


def constructed(keys: torch.Tensor, queries: torch.Tensor | None = None) -> RetrievalModel:
    """Identity features: key symbol s is written as keys[s] (whatever its value) and queried
    as queries[s] (default keys[s]). The embedding row of s holds [keys[s], queries[s]]; W_k
    reads the first half, W_q the second."""
    n, d = keys.shape
    queries = keys if queries is None else queries
    model = RetrievalModel(n, build_feature_map("identity", d_key=d),
                           embed_factor=(d + 1) / n).double()
    with torch.no_grad():
        for p in (model.embedding.weight, model.W_k.weight, model.W_k.bias, model.W_q.weight,
                  model.W_q.bias):
            p.zero_()
        model.embedding.weight[:n, :d] = keys
        model.embedding.weight[:n, d:2 * d] = queries
        model.W_k.weight[:, n:n + d] = torch.eye(d)  # x = [onehot(value), embedding]
        model.W_q.weight[:, d:2 * d] = torch.eye(d)
    return model


def constructed_model(duplicate: bool) -> RetrievalModel:
    """Key l written and queried as e_l; with ``duplicate``, key 1 as 2 e_0, on top of key 0."""
    keys = torch.eye(S, dtype=torch.float64)
    if duplicate:
        keys[1] = 2 * keys[0]
    return constructed(keys)


def eval_batch(n: int = S):
    return RetrievalTask(n, n, n, False, seed=3, device=torch.device("cpu")).eval_batch(20, 200)


def test_feature_ranks_of_orthonormal_and_rank_one_features():
    assert feature_ranks(torch.eye(5)) == pytest.approx((5.0, 5.0))
    rank, effective = feature_ranks(torch.ones(6, 3))
    assert rank == 1 and effective == pytest.approx(1.0)
    # two directions, one 3x stronger: rank 2, effective rank between 1 and 2
    rank, effective = feature_ranks(torch.diag(torch.tensor([3.0, 1.0])))
    p = torch.tensor([0.75, 0.25])
    assert rank == 2 and effective == pytest.approx(float(torch.exp(-(p * p.log()).sum())))


def test_orthogonal_keys_read_with_full_margin_and_full_rank():
    fields, details = measure(constructed_model(duplicate=False), eval_batch())
    assert fields["phi_rank"] == S and fields["phi_effective_rank"] == pytest.approx(S)
    assert details["dead_keys"] == []
    assert fields["margin"] == pytest.approx(1.0) and fields["negative_margin_fraction"] == 0
    assert fields["dead_keys"] == 0
    assert details["per_key_accuracy"] == {k: 1.0 for k in range(S)}


def test_a_key_written_on_top_of_another_is_dead_and_names_it():
    """Key 0 is read as (v_0 + 2 v_1) / 3: always answered with key 1's value. (Keys written
    exactly alike would both read (v_0 + v_1) / 2, a tie that argmax breaks by value order, so
    neither would be wrong in every sequence: the duplicate is written twice as large.)"""
    fields, details = measure(constructed_model(duplicate=True), eval_batch())
    assert fields["phi_rank"] == S - 1
    assert fields["dead_keys"] == 1
    (dead,) = details["dead_keys"]
    assert {k: dead[k] for k in ("key", "confused_with", "sequences")} == {
        "key": 0, "confused_with": 1, "sequences": 20}
    assert details["per_key_accuracy"][0] == 0 and details["per_key_accuracy"][1] == 1
    assert fields["negative_margin_fraction"] == pytest.approx(1 / S)
    # outranked by key 1's value alone, its features as large as the median: a collision
    assert dead["margin"] == pytest.approx(1 / 3 - 2 / 3)
    assert (dead["outranked_by"], dead["feature_norm_ratio"], dead["cause"]) == (
        1, pytest.approx(1.0), "collides")


SHARED = 0.1  # every written key's component along one shared direction, e_n


def keys_with_a_shared_direction(n: int) -> torch.Tensor:
    """Key l written as e_l + SHARED e_n (n + 1 dimensions): each read mostly by its own query,
    a little by every other."""
    keys = torch.eye(n, n + 1, dtype=torch.float64)
    keys[:, n] = SHARED
    return keys


def test_a_key_whose_features_vanish_is_dead_for_that_reason():
    """Key 0 written and queried at 1e-3 of its size: its own score, 1e-3^2, is below the 1e-3
    crosstalk of every other key through the shared direction."""
    n = 6
    keys = keys_with_a_shared_direction(n)
    keys[0] *= 1e-3
    fields, details = measure(constructed(keys), eval_batch(n))
    (dead,) = details["dead_keys"]
    assert dead["key"] == 0 and fields["dead_keys"] == 1
    assert dead["feature_norm_ratio"] == pytest.approx(1e-3) and 1e-3 < VANISH_RATIO
    assert dead["cause"] == "vanishes"


def test_a_key_whose_read_out_is_spread_is_dead_for_that_reason():
    """Key 0 queried along the shared direction only: every other key scores SHARED, key 0
    itself a little less, so its value is outranked by all n - 1 others."""
    n = 6
    keys = keys_with_a_shared_direction(n)
    keys[0, n] = 0.9 * SHARED
    queries = keys.clone()
    queries[0] = torch.eye(n + 1, dtype=torch.float64)[n]
    fields, details = measure(constructed(keys, queries), eval_batch(n))
    (dead,) = details["dead_keys"]
    assert dead["key"] == 0 and fields["dead_keys"] == 1
    assert dead["outranked_by"] == n - 1 >= SPREAD_MIN
    assert dead["feature_norm_ratio"] == pytest.approx(1.0, rel=0.01)
    assert dead["cause"] == "spread"
    assert dead["margin"] < 0 and fields["phi_rank"] == n


def test_rank_of_a_map_of_known_rank():
    """DPFP-1 at d_key 4 emits d_dot = 2 * 4 * 1 = 8 linearly independent features: 16 written
    keys span exactly 8 dimensions, in the model as on random inputs."""
    phi = build_feature_map("dpfp", d_key=4, nu=1)
    assert phi.d_dot == 8
    x = torch.randn(50, 4, generator=torch.Generator().manual_seed(0))
    rank, effective = feature_ranks(phi(x))
    assert rank == 8 and 1 < effective <= 8
    torch.manual_seed(0)
    fields, _ = measure(RetrievalModel(16, phi).double(), eval_batch(16))
    assert fields["phi_rank"] == 8 and fields["phi_effective_rank"] <= 8


def test_read_margins_and_dead_keys_on_tensors():
    y = torch.tensor([[[0.9, 0.1, 0.0], [0.2, 0.3, 0.5]]])
    target, mask = torch.tensor([[0, 1]]), torch.tensor([[True, True]])
    assert read_margins(y, target, mask).tolist() == pytest.approx([0.8, -0.2])
    query, values, keys = torch.tensor([[0, 1]]), torch.tensor([[0, 1, 2]]), torch.tensor([[0, 1, 2]])
    dead, accuracy = dead_keys(query, target, y.argmax(-1), values, keys, mask)
    assert dead == [{"key": 1, "confused_with": 2, "sequences": 1}]
    assert accuracy == {0: 1.0, 1: 0.0}


def test_softmax_has_no_feature_rank():
    model = RetrievalModel(S, build_feature_map("softmax", d_key=S)).double()
    fields, _ = measure(model, eval_batch())
    assert fields["phi_rank"] is None and math.isfinite(fields["margin"])


def test_reports_note_configurations_whose_feature_rank_moved():
    import pandas as pd

    from kernelzoo.report.sections import rank_changes

    runs = pd.DataFrame({"label": ["ReBased", "ReBased", "ELU+1"], "d_dot": [65, 65, 64],
                         "phi_effective_rank_initial": [40.0, 42.0, 50.0],
                         "phi_effective_rank": [55.0, 57.0, 51.0]})
    lines = rank_changes(runs)
    assert "| ReBased | 65 | 41.0 | 56.0 | +37% | 2 |" in lines
    assert not any(line.startswith("| ELU+1") for line in lines)
    assert rank_changes(runs.drop(columns="phi_effective_rank")) == []


def zero_key_model(key_eps: float = 0.0) -> RetrievalModel:
    """The authors' delta rule (sum normalisation) on ReLU features whose keys are all 0."""
    model = RetrievalModel(S, build_feature_map("relu", d_key=S), "delta", "sum",
                           key_eps=key_eps).double()
    with torch.no_grad():
        model.W_k.weight.zero_()
        model.W_k.bias.zero_()
    return model


def test_divergence_names_keys_whose_features_are_all_zero():
    batch = eval_batch()
    model = zero_key_model()
    assert model(batch.keys, batch.values, batch.query).isnan().all()  # 0/0, as the clause says
    assert divergence(model, batch, 300) == (
        "at step 300 100.0% of written keys had all-zero features (the sum normalisation with "
        "key_eps = 0 makes each 0/0)")
    guarded = zero_key_model(key_eps=1e-6)
    assert torch.isfinite(guarded(batch.keys, batch.values, batch.query)).all()
    assert divergence(guarded, batch, 0) == "at initialisation 100.0% of written keys had " \
                                             "all-zero features"


def test_divergence_names_non_finite_parameters_and_says_when_nothing_is_found():
    batch = eval_batch()
    model = RetrievalModel(S, build_feature_map("elu", d_key=S)).double()
    assert divergence(model, batch, 0).endswith("were finite and nonzero: the loss went "
                                                "non-finite during the steps after it")
    with torch.no_grad():
        model.W_q.weight[0, 0] = math.inf
    assert divergence(model, batch, 500) == \
        "at step 500 parameters were already non-finite: W_q.weight"


def test_divergence_gives_the_smallest_feature_sum_the_sum_normalisation_divides_by():
    batch = eval_batch()
    model = RetrievalModel(S, build_feature_map("elu", d_key=S), "delta", "sum").double()
    smallest = written_features(model, batch).sum(-1).min().item()
    assert divergence(model, batch, 200) == (
        "at step 200 parameters and written keys' features were finite and nonzero (the "
        "smallest sum of a written key's features, which the sum normalisation divides by, was "
        f"{smallest:.1e}): the loss went non-finite during the steps after it")


@pytest.mark.slow
def test_a_diverged_run_says_why_in_its_reason(tmp_path, cli_env):
    """ReLU features of 1-dimensional keys are 0 for about half the written keys: the authors'
    delta rule divides 0 by 0 at the first step."""
    res = train(["feature_map=relu", "d_key=1", "memory=delta", "n_keys=8",
                 "trainer.max_steps=200", f"results_dir={tmp_path}", "logger=none"], cli_env)
    assert res.returncode == 0, res.explain()
    (run,) = (tmp_path / "adhoc" / "runs").iterdir()
    summary = store.read_summary(run)
    assert summary["status"] == "diverged" and summary["steps"] == 1
    assert summary["reason"].startswith("non-finite train loss at step 1; at initialisation ")
    assert summary["reason"].endswith("of written keys had all-zero features (the sum "
                                      "normalisation with key_eps = 0 makes each 0/0)")
