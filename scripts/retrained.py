"""How far float-level noise moves a seed: the stopping_rule store trains again, under the
published patience, runs of dot_scaling and the zoo with the same run ids (the same
configuration, seed, n_keys and settings). Their first training and this one differ only where
the arithmetic did (another pack, another process). This compares them, from the stores as
committed, and re-runs no analysis:

    python scripts/retrained.py           # write results/retrained.csv, print the summary
    python scripts/retrained.py --check   # exit 1 when results/retrained.csv differs

Per run id trained in both: whether the final eval loss is the same to the bit, and the first
evaluation step where the two curves differ (the shared prefix, verified, never assumed). Per
(configuration, seed) searched in both: the loss-view failure point of each training, and the
difference. The summary sets the spread of those differences beside the spread of the seeds
within a configuration (docs/analysis.md, "Numerics").
"""

from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from kernelzoo.analysis.pipeline import seeds_of
from kernelzoo.records.files import atomic_write_text, read_text

ROOT = Path(__file__).resolve().parents[1]
AGAIN = "stopping_rule"  # the store that trains the others' runs again
FIRST = ("dot_scaling", "zoo")
PUBLISHED = "trainer.patience=10"  # the label words of the retrained setting
THRESHOLD, ACCURACY = 0.01, 0.99  # tau and the accuracy view's threshold (conf/search/bisect)


def _summary(run_dir: Path) -> dict:
    return json.loads(read_text(run_dir / "summary.json"))


def _curve(run_dir: Path) -> pd.DataFrame:
    return pd.read_csv(io.StringIO(read_text(run_dir / "curve.csv")))


def runs(root: Path) -> pd.DataFrame:
    """One row per run id trained in both stores: the store it came from, whether the final
    eval losses are equal, and the first eval step whose loss differs (NaN: none, within the
    shorter curve)."""
    again = root / "results" / "reference" / AGAIN / "runs"
    rows = []
    for first in FIRST:
        for old in sorted((root / "results" / "reference" / first / "runs").iterdir()):
            new = again / old.name
            if not (new / "summary.json").exists() or not (old / "summary.json").exists():
                continue
            a, b = _curve(old), _curve(new)
            n = min(len(a), len(b))
            differs = a["eval_loss"].to_numpy()[:n] != b["eval_loss"].to_numpy()[:n]
            rows.append({"store": first, "run_id": old.name,
                         "same_final": _summary(old)["final_eval_loss"]
                         == _summary(new)["final_eval_loss"],
                         "first_difference": float(a["step"].iloc[int(differs.argmax())])
                         if differs.any() else np.nan})
    return pd.DataFrame(rows)


def seeds(root: Path) -> pd.DataFrame:
    """One row per (configuration, seed) whose loss-view failure point both trainings found."""
    again = seeds_of(root / "results" / "reference" / AGAIN, AGAIN, THRESHOLD, ACCURACY)
    again = again[again["label"].str.endswith(" " + PUBLISHED)]
    again = again.assign(label=again["label"].str.removesuffix(" " + PUBLISHED))
    frames = []
    for first in FIRST:
        found = seeds_of(root / "results" / "reference" / first, first, THRESHOLD, ACCURACY)
        both = found.merge(again, on=["label", "seed"], suffixes=("_first", "_again"))
        frames.append(both.assign(store=first))
    both = pd.concat(frames, ignore_index=True)
    both = both[(both["outcome_first"] == "fails_at") & (both["outcome_again"] == "fails_at")]
    return both[["store", "label", "seed", "value_first", "value_again"]].assign(
        difference=both["value_again"] - both["value_first"]).reset_index(drop=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--root", type=Path, default=ROOT)
    args = parser.parse_args(argv)
    found = seeds(args.root)
    text = found.to_csv(index=False, float_format="%.6g")
    path = args.root / "results" / "retrained.csv"
    if args.check:
        if not path.exists() or read_text(path) != text:
            print(f"{path}: differs from the stores (python scripts/retrained.py)",
                  file=sys.stderr)
            return 1
        return 0
    atomic_write_text(path, text)
    same = runs(args.root)
    print(f"runs trained twice: {len(same)}, final eval loss the same to the bit: "
          f"{int(same['same_final'].sum())}; curves that differ before either ends: "
          f"{int(same['first_difference'].notna().sum())}")
    print(summary(found))
    return 0


def summary(found: pd.DataFrame) -> str:
    """The seeds searched twice: how many moved, the spread of the moves, and beside it the
    spread of the seeds within a configuration (pooled over configurations, first training)."""
    moved = found["difference"].abs() > 0
    by = found.groupby("label")["value_first"]
    pooled = float(np.sqrt(((found["value_first"] - by.transform("mean")) ** 2).sum()
                           / (len(found) - by.ngroups)))
    return (f"seeds searched twice: {len(found)}, failure point moved: {int(moved.sum())}; "
            f"difference sd {found['difference'].std(ddof=1):.3g} keys (one training's float "
            f"noise: sd / sqrt 2 = {found['difference'].std(ddof=1) / np.sqrt(2):.3g}), largest "
            f"{found['difference'].abs().max():.3g}; the seeds within a configuration spread by "
            f"{pooled:.3g} keys (pooled sd)")


if __name__ == "__main__":
    sys.exit(main())
