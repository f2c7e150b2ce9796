"""The float-level noise of a seed (scripts/retrained.py, results/retrained.csv): docs/analysis.md
quotes what the committed stores give, and the table is what the stores give."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import retrained  # noqa: E402  (the repository's tooling, not the package)


def _docs() -> str:
    return " ".join((ROOT / "docs" / "analysis.md").read_text().split())


def test_docs_quote_the_seeds_searched_twice_as_the_table_gives_them():
    found = pd.read_csv(ROOT / "results" / "retrained.csv")
    words = retrained.summary(found)
    numbers = re.findall(r"\d+(?:\.\d+)?", words)
    seeds, moved, sd, one, largest, spread = numbers[0], numbers[1], numbers[2], numbers[4], \
        numbers[5], numbers[6]
    assert (f"Of the {seeds} seeds searched twice, {moved} moved their loss-view failure point: "
            f"the difference has an sd of {sd} keys (one training's float noise: {one} keys), "
            f"the largest {largest}, while the seeds within a configuration spread by {spread} "
            "keys (pooled sd)") in _docs()
    assert float(one) == pytest.approx(found["difference"].std(ddof=1) / np.sqrt(2), rel=1e-2)


@pytest.mark.slow  # reads three stores' runs and every curve trained twice: ~15 s
def test_the_table_and_the_run_counts_are_the_stores():
    assert retrained.main(["--check"]) == 0
    runs = retrained.runs(ROOT)
    assert (f"Of {len(runs)} runs trained twice, {int(runs['same_final'].sum())} end with the "
            f"same final eval loss to the bit and {int(runs['first_difference'].notna().sum())} "
            "curves part before either ends") in _docs()
