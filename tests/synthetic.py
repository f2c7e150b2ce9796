"""Write fake results stores for the analysis tests: summary.json and curve.csv, no training."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from omegaconf import OmegaConf

from kernelzoo import analyze

CURVE = ("step", "train_loss", "eval_loss", "eval_accuracy")


def accuracy_of(loss):
    """A plausible accuracy for a synthetic loss: 1 - loss, None when the loss is None."""
    return None if loss is None else max(0.0, 1.0 - loss)


def write_run(exp_dir: Path, *, n_keys: int, loss, seed: int = 1, feature_map: str = "elu",
              params: dict | None = None, d_key: int = 64, d_dot: int | None = 64,
              update_rule: str = "sum", status: str = "converged", accuracy="auto",
              reason: str | None = None, wall_seconds: float = 2.0,
              diagnostics: dict | None = None, dead: list | None = None,
              config: str = "", task: str = "capacity") -> Path:
    """One run directory with summary.json, curve.csv and config.yaml; returns the directory.
    ``diagnostics``: summary fields of the diagnostics (dead_keys, phi_effective_rank, ...);
    ``dead``: the dead keys of its diagnostics.json; ``config``: more config.yaml lines."""
    params = params or {}
    tag = "-".join(f"{k}{v}" for k, v in sorted(params.items()))
    run_id = f"{feature_map}{tag}-dkey{d_key}-ddot{d_dot}-S{n_keys}-{update_rule}-seed{seed}"
    path = exp_dir / "runs" / run_id
    path.mkdir(parents=True)
    accuracy = accuracy_of(loss) if accuracy == "auto" else accuracy
    summary = {
        "run_id": run_id, "experiment": exp_dir.name, "task": task,
        "feature_map": feature_map, "feature_map_params": params, "d_key": d_key,
        "d_dot": d_dot, "predicted_capacity": d_dot, "n_keys": n_keys, "seq_len": n_keys,
        "update_rule": update_rule, "normalisation": "attention", "seed": seed,
        "status": status, "reason": reason, "steps": 500, "final_eval_loss": loss,
        "best_eval_loss": loss, "final_eval_accuracy": accuracy, "wall_seconds": wall_seconds,
        "device": "cpu (synthetic)", "kernelzoo_version": "0.1.0", **(diagnostics or {}),
    }
    (path / "summary.json").write_text(json.dumps(summary, indent=2))
    (path / "config.yaml").write_text(f"n_keys: {n_keys}\nseed: {seed}\n{config}")
    if dead is not None:
        (path / "diagnostics.json").write_text(json.dumps({"dead_keys": dead}))
    if loss is not None:
        with open(path / "curve.csv", "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(CURVE)
            for i, step in enumerate(range(100, 600, 100)):
                eval_loss = loss * 2.0 ** (4 - i)
                writer.writerow([step, eval_loss, eval_loss, accuracy_of(eval_loss)])
    return path


def write_series(exp_dir: Path, losses: dict, **config) -> list[Path]:
    """One run per ``{n_keys: final_eval_loss}`` entry of one configuration and seed."""
    return [write_run(exp_dir, n_keys=n, loss=loss, **config) for n, loss in losses.items()]


def analyze_store(results: Path, experiment: str, threshold: float = 0.01,
                  figures: bool = False) -> Path:
    """Run the analysis on ``results/experiment`` as `python -m kernelzoo.analyze` would, with no
    logger and, unless a test looks at them, no figures (nine tenths of an analysis' time);
    returns the experiment directory."""
    analyze.analyze(OmegaConf.create({"experiment": experiment, "results_dir": str(results),
                                      "threshold": threshold, "accuracy_threshold": 0.99,
                                      "figures": figures, "logger": {"name": "none"}}))
    return results / experiment


REPLACEMENT = "task:\n  replacement: true\n"  # config.yaml lines of Setting 2


def write_grid_store(exp_dir: Path) -> None:
    """Setting 1 at d_key 64: ELU+1 (d_dot 64), DPFP-1 and DPFP-2 (128, 256; one family at two
    levels) with 3 seeds each, failing a little past d_dot, the seeds apart; FAVOR+ m=32
    (d_dot 64) with one seed, failing past 40; ReLU and ReLU² at d_dot 65 and 66, beside ELU+1's
    64; their losses crossing tau between two grid points."""
    grid = [16, 32, 48, 64, 80, 96, 128, 160, 192, 256, 320]
    for seed, shift in ((1, 0), (2, 16), (3, 32)):
        for d_dot, config in ((64, {}), (128, dict(feature_map="dpfp", params={"nu": 1})),
                              (256, dict(feature_map="dpfp", params={"nu": 2}))):
            write_series(exp_dir, {n: 1e-4 if n <= d_dot - 32 + shift else 0.3 for n in grid},
                         seed=seed, d_dot=d_dot, **config)
    write_series(exp_dir, {n: 1e-4 if n <= 32 else 0.3 for n in grid[:6]}, feature_map="favor",
                 params={"m": 32}, d_dot=64)
    for fmap, d_dot in (("relu", 65), ("squared_relu", 66)):
        write_series(exp_dir, {n: 1e-4 if n <= 48 else 0.3 for n in grid[:6]}, feature_map=fmap,
                     d_dot=d_dot)


def write_update_store(exp_dir: Path) -> None:
    """A Figure 3-like store, keys drawn with replacement, one seed: ELU+1 delta failing past 40;
    FAVOR+ m=32 delta diverging at 60 and 100 (finite at 80 alone between them); DPFP-1 fwm at
    its floor 0.5 / S at 20 keys, far above it beyond."""
    grid = [20, 40, 60, 80, 100]
    common = dict(update_rule="delta", task="update", config=REPLACEMENT)
    write_series(exp_dir, {n: 1e-3 if n <= 40 else 0.2 for n in grid}, **common)
    for n in grid:
        diverged = n in (60, 100)
        write_run(exp_dir, n_keys=n, loss=None if diverged else 0.3, feature_map="favor",
                  params={"m": 32}, d_dot=64, status="diverged" if diverged else "plateau",
                  **common)
    write_series(exp_dir, {n: 0.5 / n if n == 20 else 0.5 for n in grid}, feature_map="dpfp",
                 params={"nu": 1}, d_dot=128, update_rule="fwm", task="update",
                 config=REPLACEMENT)


def seeds_of_capacity(capacity) -> "pd.DataFrame":
    """A seeds table (``capacity.seed_table``'s columns) whose three seeds per configuration are
    its interval's ends and its median in every view (a 3-seed order-statistic interval is the
    seeds' range), each seed with the configuration's outcome in that view."""
    import pandas as pd

    from kernelzoo.analysis.capacity import SUFFIX

    rows = []
    for r in capacity.to_dict("records"):
        for i, at in enumerate(("ci_low", "observed_capacity", "ci_high"), 1):
            row = {"label": r["label"], "seed": i}
            for s in SUFFIX.values():
                outcome = r.get(f"outcome{s}", "fails_at")
                bound = outcome in ("never_fails", "fails_everywhere")
                row[f"value{s}"] = r[f"observed_capacity{s}" if bound else f"{at}{s}"]
                row[f"outcome{s}"] = outcome
            rows.append(row)
    return pd.DataFrame(rows)
