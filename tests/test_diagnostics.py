"""Capacity diagnostics (kernelzoo.diagnostics) on constructed models whose answers are known."""

from __future__ import annotations

import math

import pytest
import torch

from kernelzoo.diagnostics import dead_keys, feature_ranks, measure, read_margins
from kernelzoo.feature_maps import build_feature_map
from kernelzoo.model import RetrievalModel
from kernelzoo.task import RetrievalTask

S = 4


def constructed_model(duplicate: bool) -> RetrievalModel:
    """Identity features, keys and queries e_key (values ignored): key l is written as e_l.
    With ``duplicate``, key 1 is written and queried as 2 e_0, on top of key 0's e_0."""
    model = RetrievalModel(S, build_feature_map("identity", d_key=S)).double()
    e = model.embedding.weight.shape[1]
    with torch.no_grad():
        model.embedding.weight.zero_()
        model.embedding.weight[:S, :S] = torch.eye(S, dtype=torch.float64)
        if duplicate:
            model.embedding.weight[1, :S] = 2 * model.embedding.weight[0, :S]
        model.W_k.weight.zero_()
        model.W_k.weight[:, S:2 * S] = torch.eye(S, dtype=torch.float64)
        model.W_q.weight.copy_(torch.eye(S, e, dtype=torch.float64))
        model.W_k.bias.zero_()
        model.W_q.bias.zero_()
    return model


def eval_batch():
    return RetrievalTask(S, S, S, False, seed=3, device=torch.device("cpu")).eval_batch(20, 200)


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
    assert fields["margin"] == pytest.approx(1.0) and fields["negative_margin_fraction"] == 0
    assert fields["dead_keys"] == 0
    assert details["per_key_accuracy"] == {k: 1.0 for k in range(S)}


def test_a_key_written_on_top_of_another_is_dead_and_names_it():
    """Key 0 is read as (v_0 + 2 v_1) / 3: always answered with key 1's value."""
    fields, details = measure(constructed_model(duplicate=True), eval_batch())
    assert fields["phi_rank"] == S - 1
    assert fields["dead_keys"] == 1
    assert details["dead_keys"] == [{"key": 0, "confused_with": 1, "sequences": 20}]
    assert details["per_key_accuracy"][0] == 0 and details["per_key_accuracy"][1] == 1
    assert fields["negative_margin_fraction"] == pytest.approx(1 / S)


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


def test_reports_flag_runs_that_stall_with_a_few_dead_keys():
    import pandas as pd

    from kernelzoo.report import stalls

    runs = pd.DataFrame({"label": ["ELU+1"] * 3, "seed": [1, 1, 1], "n_keys": [100, 100, 40],
                         "dead_keys": [1, 30, None], "final_eval_loss": [0.004, 0.3, 1e-4]})
    assert stalls(runs) == ["ELU+1, seed 1, n_keys 100: stalled: 1 key of 100 never learned "
                            "(final eval loss 0.004; which keys: its diagnostics.json)"]
    assert stalls(runs.drop(columns="dead_keys")) == []


def test_reports_note_configurations_whose_feature_rank_moved():
    import pandas as pd

    from kernelzoo.report import rank_changes

    runs = pd.DataFrame({"label": ["ReBased", "ReBased", "ELU+1"], "d_dot": [65, 65, 64],
                         "phi_effective_rank_initial": [40.0, 42.0, 50.0],
                         "phi_effective_rank": [55.0, 57.0, 51.0]})
    lines = rank_changes(runs)
    assert "| ReBased | 65 | 41.0 | 56.0 | +37% | 2 |" in lines
    assert not any(line.startswith("| ELU+1") for line in lines)
    assert rank_changes(runs.drop(columns="phi_effective_rank")) == []
