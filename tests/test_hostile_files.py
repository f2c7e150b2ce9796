"""Files that would hang a reader or fill its memory: a FIFO where a reference store keeps a
table or a record, a YAML bomb, JSON nested past reason, numbers that are no result. Each is
named as damaged or as the one line of the command, never waited on or expanded."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest
from synthetic import write_series

from kernelzoo.analysis import published
from kernelzoo.analysis.runs import load_runs
from kernelzoo.records import loaders

# ------------------------------------------------------------------ FIFOs in a reference store


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", ["sweep.json", "capacity.csv"])
def test_a_fifo_in_a_reference_store_is_one_line_of_the_docs_check(tmp_path, capsys, name):
    """``results_doc --check`` (make docs, and the drift test of make test) waited forever on
    a FIFO where a reference store keeps its sweep record or its capacity table."""
    from test_results_doc import scratch

    import results_doc

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


# ------------------------------------------------------------------ YAML and JSON within limits

def _bomb(levels: int) -> str:
    """A billion-laughs config.yaml: each level an anchored list of nine aliases of the one
    before, under the trainer section the analysis flattens (9^levels values)."""
    lines = ["trainer:", "  l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"  l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


HOSTILE = {  # file, its text, what the damaged line says
    "yaml bomb": ("config.yaml", _bomb(7), "more than 1048576 values once its aliases are "
                                           "expanded"),
    "a self-referring alias": ("config.yaml", "trainer: &t\n  again: *t\n",
                               "an alias that contains itself"),
    "deep yaml": ("config.yaml", "trainer: " + "[" * 5000 + "]" * 5000 + "\n",
                  "nested deeper than 64 levels"),
    "yaml nan": ("config.yaml", "trainer:\n  lr: .nan\n", "nan, not a finite number"),
    "summary nan": ("summary.json", None, "NaN, not a finite number"),
    "summary infinity": ("summary.json", None, "1e999 is beyond the largest finite number"),
    "summary huge integer": ("summary.json", None, "the integer 100000000000000000000000... "
                                                   "is beyond 64 bits"),
    "deep json": ("summary.json", "[" * 100000 + "]" * 100000, "nested deeper than 64 levels"),
}


def _spoiled_summary(path: Path, case: str) -> str:
    text = (path / "summary.json").read_text()
    summary = json.loads(text)
    if case == "summary nan":
        return text.replace(f'"final_eval_loss": {json.dumps(summary["final_eval_loss"])}',
                            '"final_eval_loss": NaN')
    if case == "summary infinity":
        return text.replace(f'"wall_seconds": {json.dumps(summary["wall_seconds"])}',
                            '"wall_seconds": 1e999')
    return text.replace(f'"seed": {summary["seed"]}', '"seed": 1' + "0" * 5000)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_file_beyond_the_loaders_limits_is_listed_as_damaged(tmp_path, case):
    """A billion-laughs config.yaml made the analysis and the stall-check sweep (both read the
    store through load_runs) hang with memory growing; NaN and Infinity in a summary were
    data. Each is now the file's damaged line, and the other runs are analysed."""
    name, text, words = HOSTILE[case]
    bad, *fine = write_series(tmp_path / "exp", {10: 1e-4, 20: 1e-4, 30: 0.5})
    (bad / name).write_text(text if text is not None else _spoiled_summary(bad, case))
    runs, missing, damaged = load_runs(tmp_path / "exp")
    assert sorted(runs["run_dir"]) == sorted(p.name for p in fine) and not missing
    what = "config" if name == "config.yaml" else "summary"
    assert damaged == [f"{bad / name}: not a readable {what} ({words})"]


def test_the_loaders_keep_what_the_store_writes():
    assert loaders.load_yaml("trainer:\n  lr: 0.001\n  max_steps: 9223372036854775807\n"
                             "seeds: &s [1, 2]\nagain: *s\n") == {
        "trainer": {"lr": 0.001, "max_steps": 2 ** 63 - 1}, "seeds": [1, 2], "again": [1, 2]}
    assert loaders.load_json('{"loss": "inf", "n": -12, "x": 1.5e-300, "none": null}') == {
        "loss": "inf", "n": -12, "x": 1.5e-300, "none": None}
    assert loaders.load_yaml("") is None
    with pytest.raises(loaders.LimitError, match="-Infinity, not a finite number"):
        loaders.load_json("[-Infinity]")


# ------------------------------------------------------------------ hostile store contents

def test_a_summary_with_d_dot_0_is_damaged_not_a_traceback(tmp_path):
    """d_dot 0 divided by zero in the ratios and ended the figures with a ValueError."""
    [zero] = write_series(tmp_path / "exp", {10: 1e-4}, d_dot=0)
    fine = write_series(tmp_path / "exp", {10: 1e-4}, feature_map="relu")
    runs, _, damaged = load_runs(tmp_path / "exp")
    assert list(runs["run_dir"]) == [fine[0].name]
    assert damaged == [f"{zero / 'summary.json'}: d_dot is 0, not an integer >= 1 or null"]


def test_labels_and_run_directory_names_are_escaped(tmp_path):
    """A parameter value or a run directory name holding a table's pipe, HTML or a terminal's
    escape sequence reached report.md and the terminal raw."""
    exp = tmp_path / "exp"
    write_series(exp, {10: 1e-4}, params={"variant": "hyperbolic"})
    [hostile] = write_series(exp, {10: 1e-4}, params={"variant": "positive"})
    summary = json.loads((hostile / "summary.json").read_text())
    summary["feature_map_params"]["variant"] = "a|b <script>\x1b[2J"
    (hostile / "summary.json").write_text(json.dumps(summary))
    odd = exp / "runs" / "run|<b>\x1b[31m"
    odd.mkdir()
    runs, missing, damaged = load_runs(exp)
    assert sorted(runs["label"]) == ["ELU+1 a\\|b &lt;script&gt;\\x1b[2J", "ELU+1 hyperbolic"]
    assert not missing and damaged == [
        f"{exp / 'runs'}/run\\|&lt;b&gt;\\x1b[31m: not a run directory (a run id is letters, "
        "digits, '-', '_' and '.'); left unread"]


# ------------------------------------------------------------------ the docs generator

def test_the_docs_generator_answers_a_store_it_cannot_read_or_a_docs_it_cannot_write(
        tmp_path, capsys, monkeypatch):
    """An unanalysed reference store (no runs.parquet), a sweep.json without wall_seconds and a
    read-only docs/ were tracebacks."""
    import errno

    from test_results_doc import scratch

    import results_doc

    root = scratch(tmp_path)
    quick = root / "results" / "reference" / "quick"
    sweep = json.loads((quick / "sweep.json").read_text())
    (quick / "sweep.json").write_text(json.dumps({"invocations": sweep["invocations"]}))
    with pytest.raises(SystemExit) as done:
        results_doc.main(["--check", "--root", str(root)])
    assert done.value.code == 1 and capsys.readouterr().err.startswith(
        f"error: {quick / 'sweep.json'}: not a sweep record (no total wall_seconds); valid: "
        "analysed stores under ")
    (quick / "runs.parquet").unlink()
    with pytest.raises(SystemExit) as done:
        results_doc.main(["--check", "--root", str(root)])
    assert done.value.code == 1 and capsys.readouterr().err.startswith(
        f"error: {quick / 'runs.parquet'}: No such file or directory; valid: analysed stores")

    def read_only(path, text):
        raise OSError(errno.EROFS, "Read-only file system", str(path))

    monkeypatch.setattr(results_doc, "document", lambda root: "# drifted\n")
    monkeypatch.setattr(results_doc, "atomic_write_text", read_only)
    with pytest.raises(SystemExit) as done:
        results_doc.main(["--root", str(root)])
    assert done.value.code == 1 and capsys.readouterr().err == (
        f"error: {root / 'docs' / 'results.md'}: Read-only file system; valid: a writable "
        f"{root / 'docs'}\n")
