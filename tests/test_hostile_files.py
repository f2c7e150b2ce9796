"""Files that would hang a reader or fill its memory: a FIFO where a reference store keeps a
table or a record, a YAML bomb, JSON nested past reason, numbers that are no result. Each is
named as damaged or as the one line of the command, never waited on or expanded."""

from __future__ import annotations

import os

import pandas as pd
import pytest

from kernelzoo.analysis import published

# ------------------------------------------------------------------ FIFOs in a reference store


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", ["sweep.json", "capacity.csv"])
def test_a_fifo_in_a_reference_store_is_one_line_of_the_docs_check(tmp_path, capsys, name):
    """``results_doc --check`` (make docs, and the drift test of make test) waited forever on
    a FIFO where a reference store keeps its sweep record or its capacity table."""
    from test_results_doc import scratch

    from kernelzoo import results_doc

    root = scratch(tmp_path)
    path = root / "results" / "reference" / "quick" / name
    path.unlink()
    os.mkfifo(path)
    with pytest.raises(SystemExit) as done:
        results_doc.main(["--check", "--root", str(root)])
    assert done.value.code == 1
    assert capsys.readouterr().err == (
        f"error: {path}: not a regular file; valid: analysed stores under "
        f"{root / 'results' / 'reference'} (make plots EXPERIMENT=<name> "
        "RESULTS=results/reference)\n")


@pytest.mark.timeout(60)
def test_a_fifo_as_the_reference_table_leaves_the_reference_columns_empty(tmp_path):
    """The analysis of a user's store read the reference ``capacity.csv`` with pd.read_csv,
    which waited forever on a FIFO (make sweep and make plots of every local store hung)."""
    capacity = pd.DataFrame({"label": ["ELU+1", "DPFP-1"], "observed_capacity": [40.0, 90.0]})
    reference = tmp_path / "capacity.csv"
    reference.write_text("label,observed_capacity,outcome\nELU+1,42,fails_at\n")
    found = published.reference_columns(capacity, reference)
    assert found["reference_capacity"].tolist()[0] == 42.0
    assert found["reference_outcome"].tolist()[0] == "fails_at"
    assert found["reference_capacity"].isna().tolist() == [False, True]
    reference.unlink()
    os.mkfifo(reference)
    found = published.reference_columns(capacity, reference)
    assert found["reference_capacity"].isna().all() and found["reference_outcome"].isna().all()
