"""Bring your own map: docs/own_map.md's folder (a package with the entry point, the map's YAML,
an experiment of its own) built from the doc's blocks and swept by the doc's commands as written,
and a map of the user's swept in a packaged experiment through ``hydra.searchpath``."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from conftest import DONE, PYTHON, REPO, run_cmd, smoke_args

DOC = (REPO / "docs" / "own_map.md").read_text()
# "`cube-map/<file>`<intro>:" then a fenced block: the file's text
FILES = dict(re.findall(r"^`cube-map/(\S+?)`[^`]*?:\n\n```\w+\n(.*?)```", DOC, re.M | re.S))
COMMANDS = re.search(r"```bash\n(.*?)```", DOC, re.S).group(1).splitlines()
MODULE = FILES["mymaps/__init__.py"]
# tiny runs, no tracking, the store in the test's directory
TINY = ["trainer=smoke", "d_key=4", "logger=none", "trainer.threads=1"]


def test_the_doc_holds_a_whole_example():
    assert set(FILES) == {"pyproject.toml", "mymaps/__init__.py", "feature_map/cube.yaml",
                          "experiments/cube.yaml"}
    assert COMMANDS == ["cd cube-map", "pip install -e .", "kernelzoo-sweep cube"]


@pytest.mark.slow
def test_the_docs_walk_through_runs_as_written(tmp_path, cli_env):
    """The folder from the doc's blocks; its commands in order: ``cd``, ``pip install`` (into a
    site folder of the test's, ``--target``, so kernelzoo's environment stays as it was; not
    editable there), ``kernelzoo-sweep cube`` with tiny runs: the user's map, from the user's
    package, in the user's experiment, analysed."""
    sweep_script = Path(PYTHON).with_name("kernelzoo-sweep")
    if not sweep_script.exists():
        pytest.skip("kernelzoo is not installed in this environment (make install)")
    root = tmp_path / "cube-map"
    for name, text in FILES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    site, results = tmp_path / "site", tmp_path / "results"
    env = {**cli_env, "PYTHONPATH": f"{cli_env['PYTHONPATH']}:{site}"}
    cwd = tmp_path
    for line in COMMANDS:
        cmd = shlex.split(line)
        if cmd[0] == "cd":
            cwd = cwd / cmd[1]
            continue
        if cmd[0] == "pip":
            cmd = [PYTHON, "-m", "pip", *[a for a in cmd[1:] if a != "-e"], "-q", "--no-deps",
                   "--no-build-isolation", "--target", str(site)]
        else:
            cmd = [sweep_script, *cmd[1:], *TINY, f"results_dir={results}"]
        res = run_cmd(cmd, env, timeout=400, cwd=cwd)
        assert res.returncode == 0, res.explain()
    assert (site / "mymaps-0.1.0.dist-info" / "entry_points.txt").is_file()
    trained = {rid for rid, _ in DONE.findall(res.stdout)}
    assert len(trained) == 12 and sum(r.startswith("cube-") for r in trained) == 6, res.stdout
    assert "analysed 12 runs of cube -> " in res.stdout, res.explain()
    report = (results / "cube" / "report.md").read_text()
    assert "Cube" in report and "ELU+1" in report
    summary = json.loads(next((results / "cube" / "runs").glob("cube-*/summary.json")).read_text())
    assert summary["feature_map_params"] == {"gain": 2.0} and summary["d_dot"] == 4


def make_user_package(root):
    """What `pip install` of a package declaring the entry point leaves on sys.path."""
    site = root / "site"
    (site / "mymaps").mkdir(parents=True)
    (site / "mymaps" / "__init__.py").write_text(MODULE)
    info = site / "mymaps-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mymaps\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[kernelzoo.maps.base]\ncube = mymaps\n")
    conf = root / "myconf" / "feature_map"
    conf.mkdir(parents=True)
    (conf / "cube.yaml").write_text(FILES["feature_map/cube.yaml"])
    return site, root / "myconf"


@pytest.mark.slow
def test_a_users_map_sweeps_without_editing_kernelzoo(tmp_path, cli_env):
    site, conf = make_user_package(tmp_path)
    env = {**cli_env, "PYTHONPATH": f"{cli_env['PYTHONPATH']}:{site}"}
    results = tmp_path / "results"
    res = run_cmd([PYTHON, "-m", "kernelzoo.sweep", "smoke", *smoke_args(results),
                   "feature_map=cube", f"hydra.searchpath=[file://{conf}]", "--no-analysis"], env)
    assert res.returncode == 0, res.explain()
    trained = DONE.findall(res.stdout)
    assert trained and all(rid.startswith("cube-") for rid, _ in trained), res.stdout
    summary = json.loads(next((results / "smoke" / "runs").glob("cube-*/summary.json")).read_text())
    assert summary["feature_map"] == "cube" and summary["feature_map_params"] == {"gain": 2.0}
    assert summary["d_dot"] == summary["d_key"]
