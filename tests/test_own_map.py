"""Bring your own map: docs/own_map.md's folder (a package with the entry point
``kernelzoo.feature_maps``, the map's YAML, an experiment of its own) built from the doc's blocks
and swept by the doc's commands as written, a map of the user's swept in a packaged experiment
through ``hydra.searchpath``, and the former entry-point group still read."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from conftest import DONE, PYTHON, REPO, run_cmd, smoke_args

from kernelzoo.maps.base import ENTRY_POINTS, OLD_ENTRY_POINTS

DOC = (REPO / "docs" / "own_map.md").read_text()
# "`cube-map/<file>`<intro>:" then a fenced block: the file's text
FILES = dict(re.findall(r"^`cube-map/(\S+?)`[^`]*?:\n\n```\w+\n(.*?)```", DOC, re.M | re.S))
COMMANDS = re.search(r"```bash\n(cd cube-map.*?)```", DOC, re.S).group(1).splitlines()
# the one-file way: "`cube-file/<file>`<intro>:" then its block
ONE_FILE = dict(re.findall(r"^`cube-file/(\S+?)`[^`]*?:\n\n```\w+\n(.*?)```", DOC, re.M | re.S))
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


def make_user_package(root, group=ENTRY_POINTS):
    """What `pip install` of a package declaring the entry point leaves on sys.path."""
    site = root / "site"
    (site / "mymaps").mkdir(parents=True)
    (site / "mymaps" / "__init__.py").write_text(MODULE)
    info = site / "mymaps-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mymaps\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{group}]\ncube = mymaps\n")
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


# ------------------------------------------------------------------ the user's map checked

OWN_MAPS = '''
import torch
from kernelzoo.maps.base import FeatureMap


class NotANumber(FeatureMap):
    name = "not_a_number"

    def __init__(self, d_key):
        super().__init__(d_key, d_key, {})

    def forward(self, x, is_query=False):
        return x * float("nan")


class Narrow(FeatureMap):
    """Declares d_dot = d_key, emits half of it."""
    name = "narrow"

    def __init__(self, d_key):
        super().__init__(d_key, d_key, {})

    def forward(self, x, is_query=False):
        return x[..., : x.shape[-1] // 2]


class Scaled(FeatureMap):
    name = "scaled"

    def __init__(self, d_key, scale):
        super().__init__(d_key, d_key, {"scale": scale})

    def forward(self, x, is_query=False):
        return self.params["scale"] * x
'''


@pytest.fixture
def own_maps(tmp_path, monkeypatch):
    """The three maps above, registered as a plugin package's would be (kernelzoo's registry
    restored afterwards); the run of one on a tiny task, in-process."""
    from conftest import TINY

    from kernelzoo import config
    from kernelzoo.maps import base
    from kernelzoo.training.job import run as run_job

    (tmp_path / "ownmaps.py").write_text(OWN_MAPS)
    monkeypatch.syspath_prepend(str(tmp_path))
    import ownmaps

    monkeypatch.setattr(base, "FEATURE_MAPS", dict(base.FEATURE_MAPS))
    from kernelzoo.maps import catalog

    monkeypatch.setattr(catalog, "FEATURE_MAPS", base.FEATURE_MAPS)
    for cls in (ownmaps.NotANumber, ownmaps.Narrow, ownmaps.Scaled):
        base.register(cls)

    def run(name: str):
        cfg = config.compose("config", [f"results_dir={tmp_path / 'results'}", *TINY,
                                        "trainer.max_steps=50", f"feature_map.name={name}"])
        with config.as_job(cfg) as job:
            return run_job(job, echo=lambda line: None)

    return run


def test_a_map_with_non_finite_features_is_recorded_diverged(own_maps):
    """A map returning NaN ended the run in its initial diagnostics (svdvals of NaN)."""
    ((_, summary),) = own_maps("not_a_number")
    assert summary["status"] == "diverged" and summary["phi_rank_initial"] is None
    assert "non-finite features" in summary["reason"]


@pytest.mark.parametrize("name, line", [
    ("narrow", "feature_map=narrow: its features at a first call have width 2, not the 4 it "
               "declares (d_dot, FeatureMap.__init__); valid: a forward that returns d_dot "
               "features per key"),
    ("scaled", "feature_map=scaled: no value for scale, which its constructor requires; valid: "
               "feature_map.scale=<value>"),
])
def test_a_map_of_another_width_or_missing_a_parameter_is_one_line(own_maps, name, line):
    """A narrower map than it declares trained as if it had its d_dot; a constructor argument
    without a value was a TypeError traceback."""
    from kernelzoo.config import UsageError

    with pytest.raises(UsageError) as err:
        own_maps(name)
    assert str(err.value) == line


@pytest.mark.parametrize("group", [ENTRY_POINTS, OLD_ENTRY_POINTS])
def test_a_users_map_is_found_under_the_group_and_its_former_name(tmp_path, cli_env, group):
    """The entry-point group ``kernelzoo.feature_maps``; the former ``kernelzoo.maps.base`` is
    still read, with one warning line."""
    site, _ = make_user_package(tmp_path, group)
    env = {**cli_env, "PYTHONPATH": f"{cli_env['PYTHONPATH']}:{site}"}
    res = run_cmd([PYTHON, "-c", "from kernelzoo.maps.catalog import map_class; "
                   "print(map_class('cube').__name__)"], env)
    assert res.returncode == 0 and res.stdout.split() == ["Cube"], res.explain()
    assert res.stderr.splitlines() == ([] if group == ENTRY_POINTS else [
        "warning: feature map plugin 'cube' (mymaps) is registered under the deprecated "
        "entry-point group 'kernelzoo.maps.base'; valid: 'kernelzoo.feature_maps'"])


def test_a_map_of_one_file_named_by_target_sweeps_with_nothing_installed(tmp_path, cli_env):
    """docs/own_map.md's one-file way: cube.py and feature_map/cube.yaml (``_target_:
    cube.Cube``) from the doc's blocks, the package example's experiment beside them, swept by
    the console script from that folder (whose own path holds no cube.py: the sweep puts the
    folder on every worker's import path) with tiny runs; the summary names the map."""
    assert set(ONE_FILE) == {"cube.py", "feature_map/cube.yaml"}
    sweep_script = Path(PYTHON).with_name("kernelzoo-sweep")
    if not sweep_script.exists():
        pytest.skip("kernelzoo is not installed in this environment (make install)")
    root = tmp_path / "cube-file"
    for name, text in {**ONE_FILE, "experiments/cube.yaml": FILES["experiments/cube.yaml"]}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    results = tmp_path / "results"
    res = run_cmd([sweep_script, "cube", *TINY, "n_keys=4,8", f"results_dir={results}",
                   "--no-analysis"], cli_env, timeout=300, cwd=root)
    assert res.returncode == 0, res.explain()
    summaries = [json.loads(p.read_text()) for p in (results / "cube" / "runs").glob("*/summary.json")]
    mine = [s for s in summaries if s["feature_map"] == "cube"]
    assert len(mine) == 2 and {s["feature_map_params"]["gain"] for s in mine} == {2.0}
    assert {s["status"] for s in mine} <= {"converged", "plateau", "max_steps"}


@pytest.mark.parametrize("target, words", [
    ("nowhere.Cube", "feature_map._target_=nowhere.Cube: no module 'nowhere' on the path"),
    ("kernelzoo.maps.base.register", "is not a FeatureMap subclass with a name"),
    ("kernelzoo.maps.base.Nope", "module 'kernelzoo.maps.base' has no 'Nope'"),
    ("Cube", "feature_map._target_=Cube: not an import path; valid: <module>.<Class>")])
def test_a_target_that_is_no_map_is_named_in_one_line(target, words):
    from kernelzoo.maps.catalog import ConfigError, load_target

    with pytest.raises(ConfigError) as err:
        load_target(target)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_a_target_that_cannot_be_imported_stops_the_command_before_training(tmp_path, cli_env):
    res = run_cmd([PYTHON, "-m", "kernelzoo.train", "+feature_map._target_=nowhere.Cube",
                   "~feature_map.name", *TINY, f"results_dir={tmp_path}"], cli_env)
    assert res.returncode == 2 and len(res.stderr.splitlines()) == 1, res.explain()
    assert "feature_map._target_=nowhere.Cube: no module 'nowhere' on the path" in res.stderr
    assert not (tmp_path / "adhoc").exists()


def test_an_unknown_map_names_both_ways_in():
    from kernelzoo.maps.catalog import ConfigError, build_feature_map

    with pytest.raises(ConfigError, match="unknown feature map 'posneg'; valid: .*feature_map."
                                          "_target_=<module>.<Class> .* entry point in "
                                          "'kernelzoo.feature_maps'"):
        build_feature_map("posneg", d_key=4)
