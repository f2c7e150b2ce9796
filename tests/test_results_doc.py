"""docs/results.md and README's results summary are written from the committed stores' tables
(scripts/results_doc.py): the committed text matches its stores, and a number changed in a store
is caught."""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import results_doc  # noqa: E402  (the repository's tooling, not the package)
KEPT = ("capacity.csv", "headlines.csv", "answer.csv", "verdicts.csv", "runs.parquet",
        "sweep.json", "headline.png", "capacity_scaling.png")


def test_the_committed_results_match_their_stores(capsys):
    with pytest.raises(SystemExit) as done:
        results_doc.main(["--check"])
    assert done.value.code == 0, capsys.readouterr().err
    text = (ROOT / "docs" / "results.md").read_text()
    for study in results_doc.STUDIES:
        assert f"## `{study}`" in text, study
    assert results_doc.START in (ROOT / "README.md").read_text()


def scratch(tmp_path: Path) -> Path:
    """A copy of what the documents are written from, and of what they write: the stores'
    tables, the experiment files, docs/results.md, README and results/predictors.csv."""
    for study in results_doc.STUDIES:
        store, copy = ROOT / "results" / "reference" / study, \
            tmp_path / "results" / "reference" / study
        copy.mkdir(parents=True)
        for name in KEPT:
            if (store / name).exists():
                shutil.copy(store / name, copy / name)
    shutil.copytree(ROOT / "experiments", tmp_path / "experiments")
    (tmp_path / "docs").mkdir()
    shutil.copy(ROOT / "docs" / "results.md", tmp_path / "docs" / "results.md")
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    shutil.copy(ROOT / "results" / "predictors.csv", tmp_path / "results" / "predictors.csv")
    return tmp_path


@pytest.mark.slow  # four builds of the documents; make test runs the check itself (above)
@pytest.mark.parametrize("study, table, column", [("figure2", "capacity.csv", "observed_capacity"),
                                                  ("zoo", "headlines.csv", "evidence"),
                                                  ("zoo", "answer.csv", "estimate"),
                                                  ("zoo", "capacity.csv",
                                                   "rank_at_d_dot_initial")])
def test_a_number_changed_in_a_store_fails_the_check(tmp_path, capsys, study, table, column):
    root = scratch(tmp_path)
    with pytest.raises(SystemExit) as same:
        results_doc.main(["--check", "--root", str(root)])
    assert same.value.code == 0
    path = root / "results" / "reference" / study / table
    frame = pd.read_csv(path)
    row = frame[column].first_valid_index()
    if column == "evidence":  # README's table quotes the zoo's between-sizes verdict
        row = frame.index[frame["id"].str.startswith("between_sizes.")][0]
        frame.loc[row, column] = re.sub(r"\d+\.\d+", lambda m: f"{float(m[0]) + 1:.3g}",
                                        frame.loc[row, column], count=1)
    else:
        frame.loc[row, column] = frame.loc[row, column] * 1.1 + 1
    frame.to_csv(path, index=False)
    with pytest.raises(SystemExit) as drifted:
        results_doc.main(["--check", "--root", str(root)])
    assert drifted.value.code == 1
    err = capsys.readouterr().err
    if table != "answer.csv":  # the answer is README's first screen, not docs/results.md's
        assert f"{root / 'docs' / 'results.md'}: differs from the stores" in err
    if table in ("headlines.csv", "answer.csv"):
        assert f"{root / 'README.md'}: differs from the stores" in err
    if column == "rank_at_d_dot_initial":  # a predictor of the held-out scores
        assert f"{root / 'results' / 'predictors.csv'}: differs from the stores" in err
    results_doc.main(["--root", str(root)])  # make docs: rewritten, then the check passes
    with pytest.raises(SystemExit) as fixed:
        results_doc.main(["--check", "--root", str(root)])
    assert fixed.value.code == 0


def test_readmes_first_screen_is_the_answer_written_from_the_zoos_facts():
    """The 15 lines after README's title answer which map, how much, how sure: the block that
    results_doc.answer writes from results/reference/zoo/answer.csv, one line per size."""
    lines = (ROOT / "README.md").read_text().splitlines()
    assert lines[0] == "# kernelzoo"
    first = lines[1:16]
    block = results_doc.answer(ROOT)
    assert block[0] in first and block[-1] in first and block[1] in first
    facts = pd.read_csv(ROOT / "results" / "reference" / "zoo" / "answer.csv")
    sizes = [line for line in first if line.startswith("- **d_dot ")]
    assert [int(line.split()[2].rstrip("**:")) for line in sizes] == \
        list(dict.fromkeys(facts["size"].dropna().astype(int)))
    rule = pd.read_csv(ROOT / "results" / "reference" / "stopping_rule" / "verdicts.csv")
    beyond = rule[(rule["kind"] == "optimisation") & (rule["view"] == "loss")
                  & (rule["outcome"] == "rises beyond the margin")].iloc[0]
    line = next(line for line in first if line.startswith("- **Under the published stopping"))
    assert (f"{beyond['subject']} " in line and f"(+{beyond['estimate']:.3g} keys "
            f"[{beyond['low']:.3g}, {beyond['high']:.3g}], rises beyond the margin)" in line)
    softmax = facts[facts["kind"] == "unsized"]  # the zoo's softmax: no d_dot, in keys
    assert len(softmax) == 2 and any(line.startswith("- **No d_dot**") and all(
        f"{s} " in line for s in softmax["subject"]) for line in first)
    best = facts[facts["kind"] == "holds"].iloc[0]
    assert f"{best['subject']} {best['estimate']:.2f} [{best['low']:.2f}, {best['high']:.2f}]" \
        in sizes[0]
