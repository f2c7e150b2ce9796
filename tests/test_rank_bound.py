"""The rank bound (kernelzoo.analysis.rank_bound): the loss floor of a rank-r read-out under the authors'
batch-mean weighting, worked by hand, against brute force, and against every committed run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kernelzoo.analysis import rank_bound

REFERENCE = Path(__file__).resolve().parents[1] / "results" / "reference"


@pytest.mark.parametrize("n_keys, r, floor", [
    (16, 16, 0.0), (18, 16, 0.5 * 2 / 18), (20, 16, 0.5 * 4 / 20),  # one chunk: 0.5 (S - r) / S
    (65, 64, 0.5 / 3 / 32),       # chunks 32, 32, 1: the wrong key in a full chunk
    (66, 64, 0.5 / 3 * 2 / 32),   # two wrong keys, both in full chunks
    (70, 64, 0.5 / 3 * 6 / 32),
    (300, 64, 0.5 / 7 * 136 / 32),  # 200 queried keys: 6 chunks of 32 and one of 8
])
def test_worked_floors(n_keys, r, floor):
    assert rank_bound.loss_floor(n_keys, r) == pytest.approx(floor)


def test_the_floor_is_the_best_placement_of_the_forced_errors():
    """Brute force over where the Q - r unit errors fall (every subset for small Q)."""
    from itertools import combinations
    for q, r, b in ((10, 7, 4), (9, 5, 4), (12, 10, 5)):
        chunks = [min(b, q - i) for i in range(0, q, b)]
        weights = [1 / (len(chunks) * c) for c in chunks for _ in range(c)]
        best = min(sum(weights[i] for i in pick) for pick in combinations(range(q), q - r))
        assert rank_bound.loss_floor(q, r, 200, b) == pytest.approx(0.5 * best)


def test_largest_keys_under_tau():
    assert rank_bound.largest_keys(16, 0.01) == 16
    assert rank_bound.largest_keys(64, 0.01) == 65
    assert rank_bound.largest_keys(32, 0.01) == 33
    assert rank_bound.largest_keys(128, 0.01) == 131  # 5 chunks: 3 wrong keys cost 0.009375
    assert rank_bound.largest_keys(256, 0.01) is None  # only 200 keys are ever queried
    assert rank_bound.largest_keys(16, 0.01, query_batch=None) == 16
    for r in (16, 32, 64, 96, 128):
        top = rank_bound.largest_keys(r, 0.01)
        assert rank_bound.loss_floor(top, r) <= 0.01
        assert all(rank_bound.loss_floor(n, r) > 0.01 for n in range(top + 1, 201))


def test_where_the_bound_holds():
    assert rank_bound.bound_of(64, "sum", False, 0.01) == 65
    assert rank_bound.bound_of(64, "delta", False, 0.01) == 65
    assert rank_bound.bound_of(64, "fwm", False, 0.01) == rank_bound.largest_keys(65, 0.01)
    assert rank_bound.bound_of(None, "sum", False, 0.01) is None   # softmax: no features
    assert rank_bound.bound_of(64, "sum", True, 0.01) is None      # Setting 2: values repeat


def test_no_committed_run_ends_below_its_floor_and_some_sit_on_it():
    """Every committed run of Setting 1 with a bounded map: final eval loss >= the floor of its
    rank (to float32 rounding); ELU+1 at d_key 16 sits on it at 18-20 keys."""
    runs = pd.concat([pd.read_parquet(p) for p in sorted(REFERENCE.glob("*/runs.parquet"))],
                     ignore_index=True)
    runs = runs[runs["rank_bound"].notna() | runs["d_dot"].notna()]
    runs = runs[~runs["replacement"].astype(bool) & np.isfinite(runs["final_eval_loss"])]
    ranked = runs[[rank_bound.rank(d, u) is not None
                   for d, u in zip(runs["d_dot"], runs["update_rule"])]]
    floors = np.array([rank_bound.loss_floor(r.n_keys, rank_bound.rank(r.d_dot, r.update_rule),
                                             r.eval_max_queries, r.eval_query_batch)
                       for r in ranked.itertuples()])
    loss = ranked["final_eval_loss"].to_numpy()
    assert len(ranked) > 1000
    assert (loss >= floors * (1 - 1e-4)).all(), ranked[loss < floors * (1 - 1e-4)]["run_id"]
    tight = ranked[(floors > 0) & (loss <= floors * 1.01)]
    assert len(tight) >= 10 and {18, 19, 20} <= set(tight["n_keys"])


def test_a_cosformer_query_reads_d_key_features_and_its_bound_is_that_of_d_key():
    """cosFormer's query (position M) reads [0, relu(q)]: its read-out has rank d_key, half its
    d_dot, and the analysis bounds it by d_key (``FeatureMap.query_rank_of``)."""
    import torch

    from kernelzoo.analysis.labels import query_rank
    from kernelzoo.maps.catalog import build_feature_map

    phi = build_feature_map("cosformer", d_key=8)
    queries = phi(torch.randn(4, 50, 8), is_query=True).reshape(-1, 16)
    keys = phi(torch.randn(4, 50, 8)).reshape(-1, 16)
    assert torch.linalg.matrix_rank(queries).item() == 8 == phi.query_rank
    assert torch.linalg.matrix_rank(keys).item() == 16 == phi.d_dot
    assert query_rank("cosformer", 32, 64, {}) == 32 and query_rank("elu", 64, 64, {}) == 64
    assert query_rank("no_such_map", 8, 8, {}) == 8
