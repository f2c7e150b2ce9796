"""The sweeper hands the launcher the same jobs, and each job plans the same runs (their run ids
included), as recorded in ``data/dry_run_jobs.json`` for every experiment: a dry run of each into
an empty store, its lines ``#<n> : <overrides>`` (Hydra's launcher), ``plan <run_id>: ...`` and
``infeasible <run_id>: ...`` (each job; parallel workers print theirs in any order). Regenerate the record only for a change meant to alter
what a sweep launches."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import slow_but, sweep

RECORDED = json.loads((Path(__file__).parent / "data" / "dry_run_jobs.json").read_text())


def launched(output: str) -> list[str]:
    """The launcher's jobs and the jobs' plans in a sweep's output, the store's path elided."""
    out = []
    for line in output.splitlines():
        line = re.sub(r"^\[[^]]*\]\[HYDRA\]\s*", "", line)
        line = re.sub(r"results_dir=\S+", "results_dir=STORE", line)
        if re.match(r"#\d+ : |plan |infeasible ", line):
            out.append(line)
    return out


def test_every_experiment_is_recorded():
    experiments = Path(__file__).resolve().parents[1] / "experiments"
    assert set(RECORDED) == {f.stem for f in experiments.glob("*.yaml")}


@pytest.mark.parametrize("experiment", slow_but({"smoke"}, sorted(RECORDED)))
def test_a_dry_run_launches_the_recorded_jobs(experiment, tmp_path, cli_env):
    # the launcher's line per job ("#0 : <overrides>") is kept from the console (conf/config.yaml's
    # hydra_logging); without those quieted loggers it says which points form each job
    result = sweep(experiment, ["dry_run=true", f"results_dir={tmp_path / 'store'}",
                                "logger=none", "~hydra.hydra_logging.loggers"], cli_env,
                   timeout=900)
    assert result.returncode == 0, result.explain()
    got, recorded = launched(result.stdout), RECORDED[experiment]
    jobs = lambda lines: [line for line in lines if line.startswith("#")]  # noqa: E731
    assert jobs(got) == jobs(recorded)  # in the launcher's order
    assert sorted(got) == sorted(recorded)  # parallel workers print their plans in any order
