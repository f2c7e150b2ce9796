"""``records.analysed``: whether a store changed since its last analysis (``make sweep``
re-analyses only then)."""

from __future__ import annotations

import json
import os

import pytest
from synthetic import write_run

from kernelzoo.records.analysed import main, mark, up_to_date


def test_a_store_is_up_to_date_until_a_run_or_the_search_changes(tmp_path):
    exp, args = tmp_path / "smoke", ["experiment=smoke"]
    run = write_run(exp, n_keys=20, loss=1e-4)
    (exp / "report.md").write_text("# report\n")
    assert not up_to_date(exp, args)  # never marked
    mark(exp, args)
    assert up_to_date(exp, args)
    (exp / "sweep.json").write_text(json.dumps({"invocations": []}))  # every sweep appends
    assert up_to_date(exp, args)
    assert not up_to_date(exp, [*args, "logger=none"])  # another analysis
    stat = (run / "summary.json").stat()
    os.utime(run / "summary.json", ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))  # rewritten
    assert not up_to_date(exp, args)
    for change in (lambda: write_run(exp, n_keys=40, loss=1.0),  # a new run
                   lambda: (exp / "search.json").write_text("{}"),  # the search went on
                   lambda: (exp / "report.md").unlink()):  # the report is gone
        mark(exp, args)
        change()
        assert not up_to_date(exp, args)


def test_the_command_says_one_line_or_exits_1(tmp_path, capsys):
    exp = tmp_path / "smoke"
    write_run(exp, n_keys=20, loss=1e-4)
    with pytest.raises(SystemExit) as stop:
        main(["check", str(exp), "experiment=smoke"])
    assert stop.value.code == 1 and capsys.readouterr().out == ""
    main(["mark", str(exp), "experiment=smoke"])
    main(["check", str(exp), "experiment=smoke"])
    assert capsys.readouterr().out == (f"the analysis of {exp} is up to date: no run changed "
                                       "since (make plots re-analyses)\n")


@pytest.mark.slow  # an analysis by the CLI: ~10 s
def test_make_plots_marks_the_analysis_so_the_next_sweep_does_not_repeat_it(tmp_path, cli_env,
                                                                           capsys):
    """``make plots`` (python -m kernelzoo.analyze) did not mark the analysed stamp, so the next
    ``make sweep`` analysed again (and logged a second wandb analysis run). The analysis marks
    itself, with its arguments as the sweep checks them."""
    from conftest import PYTHON, run_cmd
    from synthetic import write_series

    from kernelzoo.sweep import Ran, analyse

    results = tmp_path / "results"
    write_series(results / "mine", {16: 1e-4, 32: 1e-4, 64: 0.3})
    res = run_cmd([PYTHON, "-m", "kernelzoo.analyze", "experiment=mine",
                   f"results_dir={results}", "logger=none"], cli_env)
    assert res.returncode == 0, res.explain()
    capsys.readouterr()
    assert analyse(Ran("mine", str(results), False, ["logger=none"])) == 0
    assert capsys.readouterr().out.startswith(f"the analysis of {results / 'mine'} is up to date")
