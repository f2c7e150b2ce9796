"""Values in range: the summary schema checks what the analysis computes with (accuracy in
[0, 1], losses finite and >= 0, n_keys within what a task is built with, counts >= 0), the
analysis never allocates by a value it read, the paper's bound counts a bound as above d_dot
only when its lower end is, and an unset ${oc.env:...} in a single run's override is one line."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from test_hardening import _precheck

from kernelzoo.analysis import verdicts
from kernelzoo.config.schema import N_KEYS_MAX
from kernelzoo.records import summary
from kernelzoo.report import panels
from kernelzoo.report.verdicts import paper_bound

GOOD = summary.new(run_id="elu-S5-seed1", experiment="e", task="capacity", feature_map="elu",
                   feature_map_params={}, d_key=4, d_dot=8, predicted_capacity=8, n_keys=5,
                   seq_len=5, update_rule="sum", normalisation="attention", seed=1,
                   status="converged", steps=100, final_eval_loss=0.001, best_eval_loss=0.001,
                   final_eval_accuracy=1.0, wall_seconds=1.0)


@pytest.mark.parametrize("field, value, what", [
    ("final_eval_accuracy", 1.5, "a number in [0, 1] or null"),
    ("final_eval_accuracy", -0.1, "a number in [0, 1] or null"),
    ("final_eval_loss", -1.0, "a finite number >= 0 or null"),
    ("final_eval_loss", "inf", "a finite number >= 0 or null"),
    ("best_eval_loss", -0.5, "a finite number >= 0 or null"),
    ("n_keys", 10**7, f"an integer from 1 to {N_KEYS_MAX}"),
    ("steps", -3, "an integer >= 0"),
    ("wall_seconds", -1.0, "a finite number >= 0"),
    ("dead_keys", -1, "an integer >= 0 or null"),
])
def test_the_summary_schema_checks_ranges(field, value, what):
    """``final_eval_accuracy: 1.5`` gave 7.5 keys retrieved at n_keys 5; an n_keys of 10^7 cost
    the analysis 200 s and 1.4 GB (larger ones hung or crashed)."""
    assert summary.problem(dict(GOOD)) is None
    bad = {**GOOD, field: value}
    assert summary.problem(bad) == f"{field} is {value!r}, not {what}".replace("'", '"')


def test_the_loss_floor_is_computed_at_a_bounded_number_of_n_keys(monkeypatch):
    """A configuration whose largest n_keys is 2^20: the floor is computed at FLOOR_POINTS
    n_keys, not at every one (each integer where there are fewer)."""
    calls = []
    monkeypatch.setattr(panels.rank_bound, "floor_of",
                        lambda k, *a: calls.append(k) or 0.5)

    class Ax:
        def plot(self, *args, **kwargs):
            pass

    runs = pd.DataFrame({"label": ["a", "a"], "read_rank": [64, 64], "n_keys": [100, N_KEYS_MAX],
                         "eval_max_queries": [200, 200], "eval_query_batch": [32, 32]})
    row = pd.Series({"label": "a", "rank_bound": 64.0, "update_rule": "sum"})
    panels._floor(Ax(), runs, row, "k")
    assert len(calls) == panels.FLOOR_POINTS and calls[0] == 64 and calls[-1] == N_KEYS_MAX
    calls.clear()
    small = runs.assign(n_keys=[100, 600])
    panels._floor(Ax(), small, row, "k")
    assert calls == list(range(64, 601))


def _capacity(rows):
    return pd.DataFrame(rows, columns=["label", "predicted_capacity", "outcome", "ratio",
                                       "observed_capacity", "ci_low", "ci_high"]).assign(
                                           n_seeds=3, ci_level=0.75)


def test_the_papers_bound_counts_a_bound_above_only_when_its_lower_end_is():
    """A never-failing configuration whose lower bound equals d_dot, or an interval [0, inf]
    from disagreeing seeds, was counted "above d_dot", the paper's headline verdict printed as
    settled; each is "cannot tell" now, and only a lower end above d_dot is above."""
    table = _capacity([
        ("at d_dot", 64.0, "never_fails", 1.0, 64.0, 64.0, np.inf),
        ("disagree", 64.0, "fails_at", 1.0, 64.0, 0.0, np.inf),
        ("over", 64.0, "never_fails", 1.5, 96.0, 96.0, np.inf),
        ("under", 64.0, "fails_everywhere", 0.31, 20.0, 0.0, 20.0),
        ("covers", 64.0, "fails_at", 0.9, 58.0, 50.0, 70.0),
    ])
    facts = pd.DataFrame(verdicts.paper_bound(table))
    assert facts["outcome"].tolist() == ["cannot tell", "cannot tell", "above", "below", "at"]
    assert facts["id"].tolist()[:2] == ["paper_bound.at d_dot.loss", "paper_bound.disagree.loss"]
    [(key, line)] = paper_bound(facts, table)
    assert key == "n_le_d_dot"
    assert line.startswith("- **n* <= d_dot** (the paper's bound, loss view; failure point / "
                           "d_dot [interval]), 5 configurations: 1 fail before d_dot, 1 at it, "
                           "1 above it, 2 cannot tell (bounded); above: over "), line
    assert "; cannot tell: at d_dot " in line and ", disagree " in line


def test_an_unset_environment_variable_in_a_single_runs_override_is_one_line(capsys,
                                                                             monkeypatch):
    """``kernelzoo.train``'s precheck read results_dir before any check turned OmegaConf's
    error into one line: a 30-line traceback."""
    monkeypatch.delenv("KERNELZOO_UNSET", raising=False)
    typed = "results_dir=${oc.env:KERNELZOO_UNSET}"
    assert _precheck([typed], capsys) == (
        f"error: {typed} is invalid (KeyError raised while resolving interpolation: "
        "\"Environment variable 'KERNELZOO_UNSET' not found\"); valid: a directory path")


def test_bounds_and_diverged_runs_are_said_as_such_in_the_capacity_table(tmp_path):
    """A configuration that fails at its first point prints its loss / d_dot as the bound it is
    (it printed 0.31 as if a point), and one whose every run diverged carries "diverged 3" (its
    flags cell was empty)."""
    from synthetic import write_run

    from kernelzoo.analysis import pipeline
    from kernelzoo.report.markdown import capacity_lines

    exp = tmp_path / "s"
    for n in (20, 40):
        write_run(exp, n_keys=n, loss=0.5, feature_map="elu", d_dot=64)
    for seed in (1, 2, 3):
        write_run(exp, n_keys=20, loss=None, feature_map="relu", seed=seed, status="diverged")
    lines = capacity_lines(pipeline.analyse(exp, "s", 0.01, 0.99))
    elu = next(line for line in lines if line.startswith("| ELU+1 |"))
    relu = next(line for line in lines if line.startswith("| ReLU |"))
    assert "| <= 0.31 |" in elu and "| <= 0.31 |" in relu
    assert relu.endswith("| diverged 3 |"), relu


def test_views_agree_says_why_where_rho_is_undefined(monkeypatch):
    """One view's ratios all equal: Spearman's rho is undefined, and "views agree" printed nan."""
    from kernelzoo.analysis import rankings
    from kernelzoo.analysis.labels import rho_words

    long = pd.DataFrame({"label": list("abc") * 3,
                         "view": ["loss"] * 3 + ["accuracy"] * 3 + ["keys_retrieved"] * 3,
                         "ratio": [0.5, 0.7, 0.9, 1.0, 1.0, 1.0, 0.6, 0.8, 1.1]})
    monkeypatch.setattr(rankings, "by_view", lambda capacity: long)
    found = rankings.view_rhos(pd.DataFrame({"predicted_capacity": [64.0, 64.0, 64.0]}))
    assert [(v, w, rho is None, n) for v, w, rho, n in found] == [
        ("loss", "accuracy", True, 3), ("loss", "keys_retrieved", False, 3),
        ("accuracy", "keys_retrieved", True, 3)]
    assert rho_words(None) == "undefined (one view's ratios are all equal)"
    assert rho_words(found[1][2]) == "1.00"


def test_an_analysis_that_fails_on_the_way_marks_its_outputs_as_mixed(tmp_path, monkeypatch):
    """A full disk while the figures were drawn left new tables beside the old report, with
    nothing marking the set as mixed; ANALYSIS_INCOMPLETE.txt says so until an analysis
    finishes."""
    import errno

    from synthetic import write_run

    from kernelzoo.analysis import pipeline
    from kernelzoo.report import outputs

    exp = tmp_path / "s"
    for n in (20, 40, 60):
        write_run(exp, n_keys=n, loss=0.001 if n < 60 else 0.5)
    a = pipeline.analyse(exp, "s", 0.01, 0.99)

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(exp / "curves.png"))
    monkeypatch.setattr(outputs, "all_figures", full)
    with pytest.raises(OSError):
        outputs.write(a)
    assert (exp / "capacity.csv").exists() and not (exp / "report.md").exists()
    assert "may be newer than report.md" in (exp / outputs.INCOMPLETE).read_text()
    monkeypatch.undo()
    outputs.write(a)
    assert (exp / "report.md").exists() and not (exp / outputs.INCOMPLETE).exists()
