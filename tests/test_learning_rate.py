"""The learning-rate question (learning_rate.py) on constructed capacity tables."""

import pandas as pd

from kernelzoo.analysis import learning_rate


def capacity(rows):
    base = {"feature_map": "elu", "params": "", "d_key": 16, "d_dot": 16, "update_rule": "sum",
            "outcome": "fails_at"}
    return pd.DataFrame([{**base, **r} for r in rows])


def test_capacity_moves_only_when_the_best_interval_lies_above_the_published_lr():
    table = learning_rate.table(capacity([
        {"lr": "0.001", "label": "ELU+1 lr=0.001", "observed_capacity": 17.0, "ci_low": 16.0,
         "ci_high": 18.0},
        {"lr": "0.003", "label": "ELU+1 lr=0.003", "observed_capacity": 17.5, "ci_low": 17.0,
         "ci_high": 19.0},
        {"lr": "0.0003", "label": "ELU+1 lr=0.0003", "observed_capacity": 12.0, "ci_low": 11.0,
         "ci_high": 13.0},
        {"d_key": 64, "d_dot": 64, "lr": "0.001", "label": "ELU+1 d_key=64 lr=0.001",
         "observed_capacity": 40.0, "ci_low": 38.0, "ci_high": 42.0},
        {"d_key": 64, "d_dot": 64, "lr": "0.003", "label": "ELU+1 d_key=64 lr=0.003",
         "observed_capacity": 55.0, "ci_low": 50.0, "ci_high": 58.0},
        {"feature_map": "dpfp", "lr": "0.003", "label": "DPFP-1 lr=0.003",
         "observed_capacity": 30.0, "ci_low": 29.0, "ci_high": 31.0},  # no lr 1e-3: left out
    ]))
    assert list(table["label"]) == ["ELU+1", "ELU+1 d_key=64"]
    assert list(table["moves"]) == [False, True]
    assert list(table["best_lr"]) == ["0.003", "0.003"]
    assert table["lrs"].iloc[0] == "0.0003, 0.001, 0.003"
    one_lr = capacity([{"lr": "0.001", "label": "x", "observed_capacity": 1.0, "ci_low": 1.0,
                        "ci_high": 1.0}])
    assert learning_rate.section(one_lr) == []  # nothing run at several learning rates
    assert learning_rate.section(one_lr.drop(columns="lr")) == []  # an older capacity.csv
