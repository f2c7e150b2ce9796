"""Diagnoses from a run's curve (kernelzoo.analysis.dynamics): learned then lost, never learned,
a blown-up training loss, counted per configuration."""

from __future__ import annotations

import pandas as pd

from kernelzoo.analysis import dynamics


def curve(accuracy, train_loss=None) -> pd.DataFrame:
    return pd.DataFrame({"step": range(100, 100 * (len(accuracy) + 1), 100),
                         "train_loss": train_loss or [0.4] * len(accuracy),
                         "eval_loss": [0.1] * len(accuracy), "eval_accuracy": accuracy})


def test_learned_then_lost_never_learned_and_blown_up():
    lost = dynamics.diagnose(curve([0.5, 1.0, 0.6], [0.5, 60962.4, 0.3]), 64, 0.51)
    assert lost.learned_then_lost and not lost.never_learned and lost.blew_up
    assert lost.peak_accuracy == 1.0 and lost.peak_train_loss == 60962.4
    kept = dynamics.diagnose(curve([0.5, 1.0, 1.0]), 64, 1.0)
    assert not kept.learned_then_lost and not kept.blew_up
    # chance at 64 keys is 1/64; never above 2/64 = 0.03125: never learned
    assert dynamics.diagnose(curve([0.01, 0.03]), 64, 0.02).never_learned
    assert not dynamics.diagnose(curve([0.01, 0.04]), 64, 0.02).never_learned


def test_counts_per_configuration():
    runs = pd.DataFrame({"label": ["tanh", "tanh", "ELU+1"], "seed": [1, 2, 1],
                         "n_keys": [64, 64, 64], "final_eval_accuracy": [0.4, 1.0, 1.0],
                         "update_rule": "sum", "normalisation": "attention",
                         "run_dir": ["a", "b", "c"]})
    curves = {"a": curve([1.0, 0.4], [50.0, 0.4]), "b": curve([1.0, 1.0]), "c": None}
    found = dynamics.run_table(runs, lambda run: curves[run.run_dir])
    assert found["label"].tolist() == ["tanh", "tanh"]  # a run without a curve counts in none
    capacity = dynamics.add_columns(pd.DataFrame({"label": ["ELU+1", "tanh"]}), found)
    assert capacity.set_index("label")[["learned_then_lost", "blew_up"]].to_dict("index") == {
        "ELU+1": {"learned_then_lost": 0, "blew_up": 0}, "tanh": {"learned_then_lost": 1,
                                                                  "blew_up": 1}}
    assert capacity["peak_train_loss"].iloc[1] == 50.0


def test_a_read_out_without_a_denominator_never_blew_one_up():
    """tanh without the normaliser (normalisation none) and the fwm rule (a LayerNorm) have no
    denominator, yet "denominator near zero" fired on any training loss above 10: 30 of 38 of
    the zoo's none runs carried it, and Figure 3's fwm rows."""
    runs = pd.DataFrame({"label": ["tanh none", "tanh fwm", "tanh"], "seed": [1, 1, 1],
                         "n_keys": [64] * 3, "final_eval_accuracy": [0.4] * 3,
                         "update_rule": ["sum", "fwm", "sum"],
                         "normalisation": ["none", "attention", "attention"],
                         "run_dir": ["a", "b", "c"]})
    found = dynamics.run_table(runs, lambda run: curve([0.5, 0.4], [50.0, 0.4]))
    assert found.set_index("label")["blew_up"].to_dict() == {
        "tanh none": False, "tanh fwm": False, "tanh": True}
    assert (found["peak_train_loss"] == 50.0).all()  # the loss itself is still measured
