"""Tests of the capacity analysis on synthetic results stores (no training, no model)."""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.colors import to_hex
from omegaconf import OmegaConf
from synthetic import write_run, write_series
from wandb_records import logged_keys

from kernelzoo import analyze
from kernelzoo.analysis import stalls
from kernelzoo.records import tracking
from kernelzoo.analysis.capacity import (CAPACITY_COLUMNS, accuracy_failure, aggregate,
                                         capacity_table, censored_median, loss_failure,
                                         seed_table)
from kernelzoo.report.markdown import sweep_lines
from kernelzoo.analysis.labels import canonical_params
from kernelzoo.analysis import pipeline
from kernelzoo.analysis import published
from kernelzoo.analysis.runs import load_runs
from kernelzoo.report import dashboard
from kernelzoo.report.style import family_colors

SRC = Path(analyze.__file__).resolve().parents[1]
GRID = [20, 40, 60, 80, 100, 120]
TAU = 0.01


def crossing(n_a, l_a, n_b, l_b, tau=TAU):
    """The documented interpolation, written out independently."""
    return n_a + (math.log(tau) - math.log(l_a)) / (math.log(l_b) - math.log(l_a)) * (n_b - n_a)


def loss_rule(losses, diverged=None):
    return loss_failure(GRID[:len(losses)], losses,
                                diverged or [False] * len(losses), TAU)


# --- the failure-point rule on one series ---------------------------------------------------

def test_clean_crossing_interpolates_in_log_loss():
    result = loss_rule([1e-4, 1e-4, 1e-4, 0.3, 0.3, 0.4])
    assert result.outcome == "fails_at"
    assert result.value == pytest.approx(71.50377, abs=1e-4)  # 60 + 2 / log10(3000) * 20
    assert result.value == pytest.approx(crossing(60, 1e-4, 80, 0.3))
    assert (result.last_pass, result.first_failure) == (60, 80)


def test_isolated_bad_point_is_noise():
    result = loss_rule([1e-4, 0.5, 1e-4, 1e-4, 0.3, 0.4])
    assert result.outcome == "fails_at"
    assert result.first_failure == 100
    assert result.value == pytest.approx(crossing(80, 1e-4, 100, 0.3))


def test_never_fails_is_a_lower_bound():
    result = loss_rule([1e-4, 0.5, 1e-3, 1e-4, 1e-4, 1e-4])
    assert (result.outcome, result.value) == ("never_fails", 120)
    assert math.isnan(result.first_failure)


def test_fails_everywhere_is_an_upper_bound():
    result = loss_rule([0.5, 0.4, 0.5, 0.5, 0.5, 0.5])
    assert (result.outcome, result.value, result.first_failure) == ("fails_everywhere", 20, 20)


def test_failing_last_point_counts_alone():
    result = loss_rule([1e-4, 1e-4, 1e-4, 1e-4, 1e-4, 0.2])
    assert (result.outcome, result.first_failure) == ("fails_at", 120)
    assert 100 < result.value < 120


def test_diverged_point_counts_as_failure():
    nan_loss = loss_rule([1e-4, 1e-4, 1e-4, None, 0.3, 0.3],
                         diverged=[False, False, False, True, False, False])
    assert (nan_loss.outcome, nan_loss.value, nan_loss.first_failure) == ("fails_at", 70, 80)
    small_loss = loss_rule([1e-4, 1e-4, 1e-5, 1e-5, 1e-5, 1e-5],
                           diverged=[False, False, True, True, False, False])
    assert (small_loss.outcome, small_loss.first_failure) == ("fails_at", 60)


def test_accuracy_criterion_interpolates_linearly():
    result = accuracy_failure(GRID, [1.0, 1.0, 0.995, 0.5, 0.4, 0.4], [False] * 6, 0.99)
    assert result.outcome == "fails_at"
    assert result.value == pytest.approx(60 + (0.995 - 0.99) / (0.995 - 0.5) * 20)


def test_aggregate_is_the_median_with_its_order_statistic_interval():
    assert aggregate([70.0, 90.0, 75.0, math.nan]) == (75.0, 70.0, 90.0, 0.75)
    values = [60.0, 62.0, 65.0, 70.0, 71.0, 90.0]
    assert aggregate(values) == (67.5, 60.0, 90.0, pytest.approx(1 - 2 / 64))
    assert all(math.isnan(v) for v in aggregate([]))


def test_canonical_params_and_labels(tmp_path):
    assert canonical_params({"nu": 2, "orthogonal": True, "input_scale": 1.0}) == \
        "input_scale=1,nu=2,orthogonal=true"
    exp = tmp_path / "x"
    for params in ({"m": 64, "variant": "hyperbolic"}, {"m": 64, "variant": "trig"},
                   {"m": 128, "variant": "trig"}):
        write_run(exp, n_keys=20, loss=1e-4, feature_map="favor", params=params,
                  d_dot=2 * params["m"])
    write_run(exp, n_keys=20, loss=1e-4, feature_map="dpfp", params={"nu": 2}, d_dot=256)
    write_run(exp, n_keys=20, loss=1e-4, feature_map="softmax", d_dot=None)
    runs, _, _ = load_runs(exp)
    assert sorted(runs["label"]) == ["DPFP-2", "FAVOR+ m=128 trig", "FAVOR+ m=64 hyperbolic",
                                     "FAVOR+ m=64 trig", "softmax"]


# --- a store with several seeds, a hole, a diverged and an infeasible point -----------------

def make_store(exp: Path) -> None:
    """ELU+1 (d_dot 64) over 3 seeds failing between 60 and 80 (seed 2: 80 to 100) with a hole;
    DPFP-1 (d_dot 128) and DPFP-2 (d_dot 256); softmax never failing; a FAVOR+ run that is all
    infeasible; a corrupted summary; a run in progress; sweep.json."""
    for seed in (1, 2, 3):
        last_good = 80 if seed == 2 else 60
        losses = {n: 1e-4 if n <= last_good else 0.3 for n in GRID}
        if seed == 3:
            del losses[40]  # a hole in the grid
        write_series(exp, losses, seed=seed)
        write_series(exp, {n: 1e-5 for n in GRID}, seed=seed, feature_map="softmax", d_dot=None)
    write_series(exp, {20: 1e-4, 40: 1e-4, 60: 1e-4, 80: 1e-4, 100: 1e-4}, feature_map="dpfp",
                 params={"nu": 1}, d_dot=128)
    write_run(exp, n_keys=120, loss=None, feature_map="dpfp", params={"nu": 1}, d_dot=128,
              status="diverged", reason="loss is nan")
    write_series(exp, {n: 1e-4 for n in GRID}, feature_map="dpfp", params={"nu": 2}, d_dot=256)
    write_run(exp, n_keys=20, loss=None, feature_map="favor", params={"m": 64}, d_dot=128,
              status="infeasible", reason="d_dot unreachable")
    (exp / "runs" / "zz-corrupt").mkdir()
    (exp / "runs" / "zz-corrupt" / "summary.json").write_text('{"run_id": "zz-corrupt", ')
    (exp / "runs" / "zz-in-progress").mkdir()
    (exp / "sweep.json").write_text(json.dumps({"wall_seconds": 4321.0, "invocations": [
        {"points": 60, "wall_seconds": 4321.0, "launcher": "BasicLauncher", "machine": "a CPU",
         "outcomes": {"skipped": 10, "converged": 50}}]}))


def test_capacity_table_seeds_holes_diverged_infeasible(tmp_path):
    exp = tmp_path / "x"
    make_store(exp)
    runs, missing, corrupted = load_runs(exp)
    assert missing == ["zz-in-progress"]
    assert len(corrupted) == 1 and "zz-corrupt/summary.json" in corrupted[0]
    seeds = seed_table(runs, TAU, 0.99)
    table = capacity_table(runs, seeds).set_index("label")

    elu = table.loc["ELU+1"]
    # no rank bound on these runs (load_runs alone): the crossings as the losses give them
    low, high = crossing(60, 1e-4, 80, 0.3), crossing(80, 1e-4, 100, 0.3)
    assert (elu["outcome"], elu["n_seeds"], elu["predicted_capacity"]) == ("fails_at", 3, 64)
    assert elu["observed_capacity"] == pytest.approx(low)  # median of (low, high, low)
    assert (elu["ci_low"], elu["ci_high"]) == pytest.approx((low, high))
    assert elu["ci_level"] == 0.75  # the min-max of 3 seeds
    assert elu["first_failure"] == 80
    assert elu["ratio"] == pytest.approx(low / 64)

    dpfp1 = table.loc["DPFP-1"]
    assert (dpfp1["outcome"], dpfp1["first_failure"]) == ("fails_at", 120)
    assert dpfp1["observed_capacity"] == 110  # diverged at 120: no finite loss, so the midpoint
    dpfp2 = table.loc["DPFP-2"]
    assert (dpfp2["outcome"], dpfp2["observed_capacity"]) == ("never_fails", 120)
    softmax = table.loc["softmax"]
    assert softmax["outcome"] == "never_fails" and pd.isna(softmax["predicted_capacity"])
    assert math.isnan(softmax["ratio"])
    favor = table.loc["FAVOR+ m=64"]
    assert (favor["outcome"], favor["n_seeds"]) == ("no_data", 0)
    assert pipeline.grid_holes(runs)[:2] == ["DPFP-1, seed 2: n_keys 20, 40, 60, 80, 100, 120",
                                            "DPFP-1, seed 3: n_keys 20, 40, 60, 80, 100, 120"]
    assert "ELU+1, seed 3: n_keys 40" in pipeline.grid_holes(runs)


# --- the command line ------------------------------------------------------------------------

def run_cli(args, cwd: Path, **env):
    return subprocess.run([sys.executable, "-m", "kernelzoo.analyze", *args], cwd=cwd,
                          env={**os.environ, "PYTHONPATH": str(SRC), **env},
                          capture_output=True, text=True, timeout=120)


def test_cli_writes_every_output_and_nothing_in_cwd(tmp_path):
    results, cwd = tmp_path / "results", tmp_path / "cwd"
    exp = results / "x"
    make_store(exp)
    cwd.mkdir()
    corrupt = exp / "runs" / "zz-corrupt" / "summary.json"
    before = corrupt.read_bytes()

    proc = run_cli(["experiment=x", f"results_dir={results}", "logger=none"], cwd)

    assert proc.returncode == 0, proc.stderr
    assert list(cwd.iterdir()) == []
    assert corrupt.read_bytes() == before
    assert "zz-corrupt/summary.json" in proc.stderr
    for name in ("runs.parquet", "capacity.csv", "report.md", "loss_panels.png",
                 "observed_vs_predicted.png", "heatmap_dpfp.png", "curves.png",
                 "accuracy_panels.png", "keys_retrieved_panels.png"):
        assert (exp / name).stat().st_size > 0, name
    assert (exp / "heatmap_dpfp.png").read_bytes()[:4] == b"\x89PNG"
    assert not (exp / "heatmap_elu.png").exists()  # one d_dot only

    runs = pd.read_parquet(exp / "runs.parquet")
    assert len(runs) == (6 + 6 + 5) + 3 * 6 + 6 + 6 + 1
    with open(exp / "capacity.csv") as f:
        header = next(csv.reader(f))
    assert header[:14] == list(CAPACITY_COLUMNS) == [
        "feature_map", "params", "d_key", "d_dot", "update_rule", "lr", "predicted_capacity", "n_seeds",
        "observed_capacity", "ci_low", "ci_high", "first_failure", "ratio", "outcome"]
    assert header[14:16] == ["ci_level", "rank_bound"]
    assert header[-7:] == [*published.PUBLISHED_COLUMNS,
                           *published.REFERENCE_COLUMNS] == [
        "published_capacity", "published_outcome", "published_last_pass",
        "published_first_failure", "published_verdict", "reference_capacity",
        "reference_outcome"]  # appended after label
    capacity = pd.read_csv(exp / "capacity.csv").set_index("label")
    assert capacity.shape == (5, len(header) - 1)
    # 71.5 by the losses, beyond the rank bound of a rank-64 read-out (65): clamped to it
    assert capacity.loc["ELU+1", "rank_bound"] == 65
    assert capacity.loc["ELU+1", "observed_capacity"] == 65

    report = (exp / "report.md").read_text()
    for needle in ("zz-in-progress", "zz-corrupt/summary.json", "ELU+1, seed 3: n_keys 40",
                   "d_dot unreachable", "Sweep wall clock: 4321 s (72.0 min) over 1 invocation: 4321 s for 60 points (50 trained).",
                   "24,000 training steps", "(partial sweep)", "Sweep machine: a CPU",
                   "converged 46", "diverged 1", "infeasible 1", "cpu (synthetic)",
                   "Rules: docs/analysis.md.", "![](loss_panels.png)",
                   "![](heatmap_dpfp.png)", "| ELU+1 | 64 | 3 | 65 [65, 80] |", "3 seeds 75%",
                   "above: ELU+1 1.02 [", "No diagnostics: these runs predate them"):
        assert needle in report, needle


def test_cli_rejects_threshold_out_of_range(tmp_path):
    (tmp_path / "results" / "x" / "runs").mkdir(parents=True)
    proc = run_cli(["experiment=x", f"results_dir={tmp_path / 'results'}", "threshold=1.5",
                    "logger=none"], tmp_path)
    assert proc.returncode == 2
    assert "threshold=1.5" in proc.stderr and "(0, 1)" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) <= 2 and "Traceback" not in proc.stderr


@pytest.mark.parametrize("args, needles", [
    (["experiment=x", "threshold=0"], ["threshold=0", "(0, 1)"]),
    (["experiment=x", "accuracy_threshold=1"], ["accuracy_threshold=1", "(0, 1)"]),
    (["experiment=nope"], ["'nope'", "experiments in", "other, x"]),
    (["experiment=x", "treshold=0.1"], ["'treshold'", "threshold"]),
    (["experiment=x", "logger=bogus"], ["logger=bogus", "none, wandb"]),
])
def test_bad_arguments_exit_2_with_one_line(tmp_path, monkeypatch, capsys, args, needles):
    for name in ("x", "other"):
        (tmp_path / "results" / name / "runs").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["kernelzoo-analyze", *args, "results_dir=results"])
    with pytest.raises(SystemExit) as exit_info:
        analyze.main()
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    for needle in needles:
        assert needle in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results"]


@pytest.mark.slow
def test_wandb_offline_run_is_written(tmp_path):
    results = tmp_path / "results"
    write_series(results / "x", {n: 1e-4 if n <= 60 else 0.3 for n in GRID})
    proc = run_cli(["experiment=x", f"results_dir={results}"], tmp_path, WANDB_MODE="offline",
                   WANDB_CONFIG_DIR=str(tmp_path / "wandb-config"),
                   WANDB_CACHE_DIR=str(tmp_path / "wandb-cache"),
                   WANDB_DATA_DIR=str(tmp_path / "wandb-data"))
    assert proc.returncode == 0, proc.stderr
    offline = list((results / "wandb").glob("offline-run-*"))
    assert len(offline) == 1
    assert list(offline[0].glob("*.wandb"))
    assert (results / "x" / "report.md").exists()
    # the dashboard: its tables, the charts' own tables and the figures, as the run's files
    media = offline[0] / "files" / "media"
    for name in ("capacity", "efficiency", "keys"):
        found = list((media / "table" / "tables").glob(f"{name}_*.table.json"))
        assert len(found) == 1, name
        logged = json.loads(found[0].read_text())
        assert {"feature_map", "view", "family", "color"} <= set(logged["columns"])
        colors = {row[logged["columns"].index("color")] for row in logged["data"]}
        assert colors == {to_hex(family_colors(["ELU+1"])["ELU+1"])}, name  # one family
    charts = {p.name.partition("_table_")[0] for p in (media / "table" / "charts").rglob("*.json")}
    assert {"loss_vs_keys", "accuracy_vs_keys", "observed_vs_predicted"} <= charts
    assert list((media / "images" / "figures").glob("loss_panels_*.png"))
    # read back from the run's own log: the long tables, a chart per view, the figures
    keys = logged_keys(next(offline[0].glob("*.wandb")))
    assert {"tables/capacity", "tables/efficiency", "tables/scaling", "tables/keys",
            "figures/headline", "figures/loss_panels"} <= keys, keys
    for view in ("loss", "accuracy", "keys_retrieved"):
        assert any(k.startswith(f"charts/{view}_vs_keys") for k in keys), (view, keys)
        assert any(k.startswith(f"charts/capacity_efficiency/{view}") for k in keys), view
    assert np.isfinite(pd.read_csv(results / "x" / "capacity.csv")["observed_capacity"]).all()


def test_wandb_failure_is_one_warning(tmp_path, monkeypatch, capsys):
    class BrokenRun:
        finished = False

        def log(self, metrics, step=None):
            raise RuntimeError("network down")

        def finish(self, exit_code=0):
            BrokenRun.finished = True

    monkeypatch.setattr(tracking, "start", lambda *args, **kwargs: tracking.Tracker(BrokenRun()))
    cfg = OmegaConf.create({"experiment": "x", "results_dir": str(tmp_path),
                                    "logger": {"name": "wandb"}})
    capacity = pd.DataFrame({"label": ["ELU+1"], "observed_capacity": [71.5]})
    dashboard.log_dashboard(cfg, {"capacity": capacity}, [])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("warning: wandb logging failed")
    assert BrokenRun.finished


# --- one seed: the bracket, the noise; a search's sparse probes --------------------------------

def test_one_seed_reads_as_its_bracket_and_lists_the_noise(tmp_path):
    exp = tmp_path / "results" / "one"
    write_series(exp, {20: 1e-4, 40: 0.2, 60: 1e-4, 80: 0.3, 100: 0.3})
    runs, _, _ = load_runs(exp)
    seeds = seed_table(runs, TAU, 0.99)
    assert seeds["noise"].iloc[0] == (40.0,)
    row = capacity_table(runs, seeds).iloc[0]
    assert (row["ci_low"], row["ci_high"]) == (60, 80)  # the bracket, not [x, x]
    proc = run_cli(["experiment=one", f"results_dir={exp.parent}", "logger=none",
                    "figures=false"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    report = (exp / "report.md").read_text()
    assert "- figures: not drawn (analysed with figures=false)" in report  # and none drawn:
    assert not list(exp.glob("*.png")) and not list(exp.glob("*.svg"))
    assert (exp / "capacity.csv").is_file() and (exp / "verdicts.csv").is_file()
    # ELU+1 at d_key 64 is the authors' Linear: its published failure point (test_plots) beside;
    # the crossing of the losses (71.5) lies beyond the rank bound (65)
    elu = next(line for line in report.splitlines() if line.startswith("| ELU+1 |"))
    assert elu.startswith("| ELU+1 | 64 | 1 | 65 (between 60 and 80) |")
    assert elu.endswith("| 54.7 | at rank bound |")
    assert "Isolated failures treated as noise (a failure followed by a pass): 1" in report
    assert "ELU+1, seed 1, n_keys 40: final eval loss 0.2 (converged)" in report
    assert "Continued from checkpoints" not in report


@pytest.mark.slow
def test_the_report_counts_the_runs_continued_from_checkpoints(tmp_path):
    exp = tmp_path / "results" / "resumed"
    write_series(exp, {20: 1e-4, 40: 0.2, 60: 0.3})
    for path, resumes in zip(sorted((exp / "runs").iterdir()), (2, 0, 1)):
        summary = json.loads((path / "summary.json").read_text())
        (path / "summary.json").write_text(json.dumps({**summary, "resumes": resumes}))
    proc = run_cli(["experiment=resumed", f"results_dir={exp.parent}", "logger=none",
                    "figures=false"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "- Continued from checkpoints: 2 runs (3 resumes in all); a resumed run's wall time " \
           "counts the work redone after a stop once." in (exp / "report.md").read_text()
    assert "- 1 run" not in (exp / "report.md").read_text()
    for path, resumes in zip(sorted((exp / "runs").iterdir()), (0, 0, 1)):
        summary = json.loads((path / "summary.json").read_text())
        capped = {"status": "max_steps"} if resumes else {}
        (path / "summary.json").write_text(json.dumps({**summary, "resumes": resumes, **capped}))
    proc = run_cli(["experiment=resumed", f"results_dir={exp.parent}", "logger=none",
                    "figures=false"], tmp_path)
    assert f"analysed 3 runs of resumed -> {exp / 'report.md'}" in proc.stdout
    report = (exp / "report.md").read_text()
    assert "- Continued from checkpoints: 1 run (1 resume in all);" in report
    assert "- 1 run stopped at the step cap (" in report


def write_search_store(exp: Path) -> None:
    """Two seeds of ELU+1 probed at different n_keys by a search, with its search.json."""
    series = {}
    for seed, probes in ((1, [(32, 1e-4, 1), (64, 0.3, 1), (80, 0.4, 1), (48, 1e-4, 2),
                              (56, 0.05, 3)]),
                         (2, [(32, 1e-4, 1), (64, 1e-4, 1), (80, 0.4, 1), (72, 0.2, 2)])):
        entries = []
        for n, loss, rnd in probes:
            path = write_run(exp, n_keys=n, loss=loss, seed=seed)
            entries.append({"n_keys": n, "round": rnd, "why": f"why {seed}-{n}",
                            "run_id": path.name, "fails": loss > TAU})
        series[f"feature_map=elu seed={seed}"] = {"overrides": [], "probes": entries,
                                                  "verdict": {"outcome": "fails_at"}}
    (exp / "search.json").write_text(json.dumps({"series": series}))


def test_a_search_store_is_read_natively(tmp_path):
    exp = tmp_path / "results" / "s"
    write_search_store(exp)
    runs, _, _ = load_runs(exp)
    assert runs["probe_round"].notna().all()
    seeds = seed_table(runs, TAU, 0.99).set_index("seed")
    assert (seeds.loc[1, "last_pass"], seeds.loc[1, "first_failure"]) == (48, 56)
    assert (seeds.loc[2, "last_pass"], seeds.loc[2, "first_failure"]) == (64, 72)
    proc = run_cli(["experiment=s", f"results_dir={exp.parent}", "logger=none"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    report = (exp / "report.md").read_text()
    assert "## Search probes" in report and "9 probes over 2 configuration x seed series" in report
    probes = pd.read_csv(exp / "probes.csv").set_index(["seed", "n_keys"])
    assert len(probes) == 9 and "`probes.csv`" in report
    assert tuple(probes.loc[(1, 56), ["probe_round", "probe_why", "final_eval_loss"]]) == (
        3, "why 1-56", 0.05)
    assert tuple(probes.loc[(2, 64), ["probe_round", "probe_why", "final_eval_accuracy"]]) == (
        1, "why 2-64", 0.9999)
    assert "Grid holes" not in report  # each seed probes its own n_keys
    assert (exp / "loss_panels.png").stat().st_size > 0
    assert not list(exp.glob("heatmap_*.png"))
    parquet = pd.read_parquet(exp / "runs.parquet")
    assert {"probe_round", "probe_why"} <= set(parquet.columns)


# --- stalls: a few keys never learned where the configuration has room ------------------------

DEAD = [{"key": 37, "confused_with": 12, "cause": "collides"}]


def write_stall_store(exp: Path) -> None:
    """ELU+1 over three seeds, all passing at 20 and 40. Seed 1 fails from 60 on (at 60 with two
    dead keys and other errors besides: no stall); seed 3 passes up to 80 and fails at 100 (one
    dead key and nothing else wrong, but no run passes at 100 or more: no stall); seed 2 stalls
    at 60 and 80 (one key never learned, nothing else wrong, and seed 3 holds 80 keys), then
    fails at 100 with many dead keys."""
    def run(seed, n, loss, dead_keys, **kw):
        status = "converged" if loss < 1e-3 else "plateau"
        write_run(exp, n_keys=n, loss=loss, seed=seed, status=status,
                  diagnostics={"dead_keys": dead_keys}, **kw)

    for seed in (1, 2, 3):
        run(seed, 20, 1e-4, 0)
        run(seed, 40, 1e-4, 0)
    run(1, 60, 0.05, 2, accuracy=0.9)
    run(1, 80, 0.2, 12)
    run(2, 60, 0.02, 1, dead=DEAD)
    run(2, 80, 0.02, 1, dead=DEAD)
    run(2, 100, 0.3, 20)
    run(3, 60, 1e-4, 0)
    run(3, 80, 1e-4, 0)
    run(3, 100, 0.015, 1, accuracy=0.99)


def test_a_stalled_seed_counts_as_it_ended(tmp_path):
    exp = tmp_path / "results" / "st"
    write_stall_store(exp)
    runs, _, _ = load_runs(exp)
    runs["stalled"] = stalls.stalled(runs, TAU)
    assert sorted(zip(*(runs.loc[runs["stalled"], k] for k in ("seed", "n_keys")))) == [
        (2, 60), (2, 80)]
    seeds = seed_table(runs, TAU, 0.99).set_index("seed")
    # the stall is a diagnosis: seed 2 fails from 60, where its run stalled
    assert (seeds.loc[2, "last_pass"], seeds.loc[2, "first_failure"]) == (40, 60)
    assert (seeds.loc[1, "first_failure"], seeds.loc[3, "first_failure"]) == (60, 100)
    observed = capacity_table(runs, seeds)["observed_capacity"].iloc[0]
    assert observed == pytest.approx(crossing(40, 1e-4, 60, 0.02))  # seed 2 is the median
    rates = stalls.stall_rates(runs)
    assert rates.to_dict("records") == [{"label": "ELU+1", "n_keys": 60, "stalled": 1, "seeds": 3},
                                        {"label": "ELU+1", "n_keys": 80, "stalled": 1, "seeds": 3}]

    proc = run_cli(["experiment=st", f"results_dir={exp.parent}", "logger=none",
                    "figures=false"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    report = (exp / "report.md").read_text()
    for needle in ("## Stalls", "2 of 14 runs stalled, at 2 points", "stalls 2 (0 cleared)",
                   "| ELU+1 | 60 | 1 of 3 | 33% |",
                   "ELU+1, seed 2, n_keys 80: stalled: 1 key of 80 never learned (key 37, "
                   "confused with 12: collides); final eval loss 0.02",
                   "No stall was checked", "counts as it ended",
                   "- **Stalls** (a few keys never learned under capacity): 2 of 14 runs "
                   "stalled; 0 checked"):  # a verdict's title, then its words, then a colon
        assert needle in report, needle
    table = pd.read_csv(exp / "capacity.csv")
    assert table["observed_capacity"].iloc[0] == pytest.approx(crossing(40, 1e-4, 60, 0.02))
    assert (table["stalled_runs"].iloc[0], table["stalls_checked"].iloc[0]) == (2, 0)
    assert table["observed_capacity_verified"].iloc[0] == table["observed_capacity"].iloc[0]
    assert pd.read_parquet(exp / "runs.parquet")["stalled"].sum() == 2


def test_a_stall_counts_the_keys_an_evaluation_queries(tmp_path):
    """At 300 keys an evaluation queries keys 0..199 (trainer.eval_max_queries): three dead keys
    and nothing else wrong read as accuracy 1 - 3/200, not 1 - 3/300; a run without a cap
    (null) queries every key."""
    exp = tmp_path / "q"
    for cap in (200, None):
        write_run(exp, n_keys=300, loss=0.02, seed=1 if cap else 2, status="plateau",
                  accuracy=1 - 3 / 200, diagnostics={"dead_keys": 3},
                  config=f"trainer:\n  eval_max_queries: {cap or 'null'}\n")
    write_run(exp, n_keys=300, loss=1e-4, seed=3, diagnostics={"dead_keys": 0})
    runs, _, _ = load_runs(exp)
    marked = dict(zip(runs["seed"], stalls.stalled(runs, TAU)))
    assert marked == {1: True, 2: False, 3: False}


def test_a_configuration_that_is_only_infeasible_keeps_a_plain_label(tmp_path):
    """dot_scaling asks DPFP for d_dot 16 at d_key 32: infeasible points, with no config.yaml
    (so no lr) and nu None. Their row says no_data under a label without "None" or "lr=", and
    the feasible configurations' labels do not grow an lr."""
    lr = "trainer:\n  lr: 0.001\n"
    write_series(tmp_path / "i", {32: 0.0005, 64: 0.3}, feature_map="dpfp", params={"nu": 1},
                 d_dot=64, d_key=32, config=lr)
    path = write_run(tmp_path / "i", n_keys=4, loss=None, accuracy=None, feature_map="dpfp",
                     params={"nu": None}, d_dot=16, d_key=32, status="infeasible",
                     reason="dpfp cannot reach d_dot=16 with d_key=32")
    (path / "config.yaml").unlink()
    runs, _, _ = load_runs(tmp_path / "i")
    assert sorted(runs["label"].unique()) == ["DPFP", "DPFP-1"]
    capacity = capacity_table(runs, seed_table(runs, TAU, 0.99))
    assert capacity["label"].tolist() == ["DPFP", "DPFP-1"]
    assert capacity["outcome"].tolist() == ["no_data", "fails_at"]


@pytest.mark.parametrize("order", [1, -1])
def test_labels_sort_by_their_numbers_whatever_order_they_come_in(order):
    """Numbers compare as numbers, decimals included, and equal numbers by their text: the
    report's tables and colours must not depend on the (hash-seeded) order of a set."""
    from kernelzoo.analysis.labels import natural

    labels = ["lr=0.003", "lr=0.10", "FAVOR+ m=128", "lr=0.0003", "lr=0.1", "FAVOR+ m=64",
              "lr=0.001"]
    assert natural(labels[::order]) == ["FAVOR+ m=64", "FAVOR+ m=128", "lr=0.0003", "lr=0.001",
                                        "lr=0.003", "lr=0.1", "lr=0.10"]


def test_sweep_lines_count_the_experiments_points_and_what_an_interruption_left_open():
    """An interrupted record says how many points it set out to train and how many its sweeper
    counted as finished (jobs that ended before the signal); a record's experiment_points is
    the sweep's size."""
    history = {"wall_seconds": 700.0, "invocations": [
        {"points": 6, "outcomes": {"skipped": 1}, "wall_seconds": 600.0,
         "interrupted": "SIGTERM"},
        {"points": 5, "outcomes": {"skipped": 0, "plateau": 2, "failed": 1}, "wall_seconds": 0.0,
         "interrupted": "SIGINT"},
        {"points": 4, "experiment_points": 80, "grids": [0], "wall_seconds": 100.0,
         "outcomes": {"skipped": 1, "plateau": 3}, "launcher": "BasicLauncher",
         "machine": "a CPU"}]}
    lines = sweep_lines(history, 69)
    assert lines[0] == ("- Sweep wall clock: 700 s (11.7 min) over 3 invocations: 600 s for 6 "
                        "points (5 to train), interrupted by SIGTERM; 0 s for 5 points (5 to "
                        "train, 2 finished), interrupted by SIGINT; 100 s for 4 points of "
                        "grids [0] (3 trained).")
    assert lines[1] == "- Points of the experiment: 80; with a summary: 69 (partial sweep)."
    assert lines[2:] == ["- Sweep machine: a CPU.", "- Launcher: BasicLauncher."]
    history["invocations"][0] |= {"launcher": "JoblibLauncher", "machine": "a CPU"}
    history["invocations"].append({**history["invocations"][0]})
    assert sweep_lines(history, 69)[2:] == [  # every invocation's, most used first
        "- Sweep machine: a CPU.", "- Launcher: JoblibLauncher (2 invocations); BasicLauncher "
                                   "(1 invocation)."]
    old = {**history, "invocations": history["invocations"][:1]}
    assert sweep_lines(old, 6)[1] == "- Points planned by the largest invocation: 6; with a " \
                                     "summary: 6."


def test_counts_of_one_read_singular():
    from kernelzoo.config.words import plural

    assert [plural(n, "point") for n in (0, 1, 2)] == ["0 points", "1 point", "2 points"]


@pytest.mark.parametrize("outcomes, values, expected", [
    # no bound: the plain median with its order-statistic interval
    (["fails_at"] * 3, [70.0, 90.0, 75.0], (75.0, 70.0, 90.0, 0.75, "fails_at")),
    # a lower bound above the middle seed: the median is a point, its interval open above
    (["fails_at", "fails_at", "never_fails"], [50.0, 60.0, 64.0],
     (60.0, 50.0, math.inf, 0.75, "fails_at")),
    # two lower bounds: the median is ">= 64", as the seeds decide it
    (["fails_at", "never_fails", "never_fails"], [50.0, 64.0, 64.0],
     (64.0, 50.0, math.inf, 0.75, "never_fails")),
    # a lower bound below the points: the median lies in [70, 80]; a lower bound at 70
    (["fails_at", "never_fails", "fails_at"], [70.0, 64.0, 80.0],
     (70.0, 64.0, math.inf, 0.75, "never_fails")),
    # an upper bound above the points: the median in [12, 14]; an upper bound at 14
    (["fails_everywhere", "fails_at", "fails_at"], [16.0, 12.0, 14.0],
     (14.0, 0.0, 16.0, 0.75, "fails_everywhere")),
    # two seeds, one a lower bound: the median's upper end is open (was 57 as a value)
    (["fails_at", "never_fails"], [50.0, 64.0], (57.0, 50.0, math.inf, 0.5, "never_fails")),
    # plateaus are points: their outcome carries
    (["plateau", "plateau", "fails_at"], [32.0, 31.0, 30.0], (31.0, 30.0, 32.0, 0.75, "plateau")),
    # one bound alone: its half-line
    (["never_fails"], [128.0], (128.0, 128.0, math.inf, math.nan, "never_fails")),
])
def test_the_configuration_median_treats_a_bound_as_the_interval_it_allows(outcomes, values,
                                                                          expected):
    got = censored_median(outcomes, values)
    assert got[:3] == expected[:3] and got[4] == expected[4]
    assert got[3] == pytest.approx(expected[3], nan_ok=True)


def test_the_median_takes_the_outcome_of_the_seed_it_is():
    """A plateau at 32, a lower bound at 32 and a failure at 29: the median is the plateau's
    point, 32, and a plateau."""
    assert censored_median(["plateau", "never_fails", "fails_at"], [32.0, 32.0, 29.0])[::4] == \
        (32.0, "plateau")
