"""docs/results.md and README's results summary are written from the committed stores
(kernelzoo.results_doc): the committed text matches its stores, and a number changed in a store
is caught."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest

from kernelzoo import results_doc

ROOT = Path(__file__).resolve().parents[1]
KEPT = ("capacity.csv", "scaling.csv", "factorial.csv", "runs.parquet", "sweep.json")


def test_the_committed_results_match_their_stores(capsys):
    with pytest.raises(SystemExit) as done:
        results_doc.main(["--check"])
    assert done.value.code == 0, capsys.readouterr().err
    text = (ROOT / "docs" / "results.md").read_text()
    for study in results_doc.STUDIES:
        assert f"## `{study}`" in text, study
    assert results_doc.START in (ROOT / "README.md").read_text()


def scratch(tmp_path: Path) -> Path:
    """A copy of what the documents are written from: the stores' tables, the experiment
    files, docs/results.md and README."""
    for study in results_doc.STUDIES:
        store, copy = ROOT / "results" / "reference" / study, \
            tmp_path / "results" / "reference" / study
        copy.mkdir(parents=True)
        for name in KEPT:
            if (store / name).exists():
                shutil.copy(store / name, copy / name)
    shutil.copytree(ROOT / "experiments", tmp_path / "experiments")
    (tmp_path / "docs").mkdir()
    for name in ("results.md", "analysis.md"):
        shutil.copy(ROOT / "docs" / name, tmp_path / "docs" / name)
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    return tmp_path


@pytest.mark.slow  # four builds of the documents; make test runs the check itself (above)
@pytest.mark.parametrize("study, column", [("figure2", "observed_capacity"), ("zoo", "ratio_acc")])
def test_a_number_changed_in_a_store_fails_the_check(tmp_path, capsys, study, column):
    root = scratch(tmp_path)
    with pytest.raises(SystemExit) as same:
        results_doc.main(["--check", "--root", str(root)])
    assert same.value.code == 0
    path = root / "results" / "reference" / study / "capacity.csv"
    table = pd.read_csv(path)
    row = table[column].first_valid_index()
    table.loc[row, column] = table.loc[row, column] * 1.1 + 1
    table.to_csv(path, index=False)
    with pytest.raises(SystemExit) as drifted:
        results_doc.main(["--check", "--root", str(root)])
    assert drifted.value.code == 1
    err = capsys.readouterr().err
    assert f"{root / 'docs' / 'results.md'}: differs from the stores" in err
    if study == "zoo":  # README's summary quotes the zoo's accuracy-view ranking
        assert f"{root / 'README.md'}: differs from the stores" in err
    results_doc.main(["--root", str(root)])  # make docs: rewritten, then the check passes
    with pytest.raises(SystemExit) as fixed:
        results_doc.main(["--check", "--root", str(root)])
    assert fixed.value.code == 0
