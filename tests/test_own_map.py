"""Bring your own map: a feature map defined in the user's own package (registered through the
``kernelzoo.feature_maps`` entry point, as ``pip install`` of that package would) and its YAML in
the user's own config directory (``hydra.searchpath``), swept without touching kernelzoo."""

from __future__ import annotations

import json

import pytest

from conftest import DONE, PYTHON, run_cmd, smoke_args

from kernelzoo.maps.base import ENTRY_POINTS, OLD_ENTRY_POINTS

MODULE = '''
import torch
from kernelzoo.maps.base import FeatureMap, register


@register
class Cube(FeatureMap):
    """phi(x) = x^3 elementwise, my own map: d_dot = d_key."""

    name = "cube"

    def __init__(self, d_key, gain=1.0):
        super().__init__(d_key, d_key, {"gain": gain})

    def forward(self, x, is_query=False):
        return self.params["gain"] * x**3
'''


def make_user_package(root, group=ENTRY_POINTS):
    """What `pip install -e .` of a package declaring the entry point leaves on sys.path."""
    site = root / "site"
    (site / "mymaps").mkdir(parents=True)
    (site / "mymaps" / "__init__.py").write_text(MODULE)
    info = site / "mymaps-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mymaps\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{group}]\ncube = mymaps\n")
    conf = root / "myconf" / "feature_map"
    conf.mkdir(parents=True)
    (conf / "cube.yaml").write_text("# my own map\nname: cube\ngain: 2.0\n")
    return site, root / "myconf"


@pytest.mark.slow
def test_a_users_map_sweeps_without_editing_kernelzoo(tmp_path, cli_env):
    site, conf = make_user_package(tmp_path)
    env = {**cli_env, "PYTHONPATH": f"{cli_env['PYTHONPATH']}:{site}"}
    results = tmp_path / "results"
    res = run_cmd([PYTHON, "-m", "kernelzoo.sweep", "smoke", *smoke_args(results),
                   "feature_map=cube", f"hydra.searchpath=[file://{conf}]"], env)
    assert res.returncode == 0, res.explain()
    trained = DONE.findall(res.stdout)
    assert trained and all(rid.startswith("cube-") for rid, _ in trained), res.stdout
    summary = json.loads(next((results / "smoke" / "runs").glob("cube-*/summary.json")).read_text())
    assert summary["feature_map"] == "cube" and summary["feature_map_params"] == {"gain": 2.0}
    assert summary["d_dot"] == summary["d_key"]


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
