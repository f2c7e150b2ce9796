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


def analyze_store(results: Path, experiment: str, threshold: float = 0.01) -> Path:
    """Run the analysis on ``results/experiment`` as `python -m kernelzoo.analyze` would, with no
    logger; returns the experiment directory."""
    analyze.analyze(OmegaConf.create({"experiment": experiment, "results_dir": str(results),
                                      "threshold": threshold, "accuracy_threshold": 0.99,
                                      "logger": {"name": "none"}}))
    return results / experiment
