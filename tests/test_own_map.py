"""Bring your own map: a feature map defined in the user's own package (registered through the
``kernelzoo.maps.base`` entry point, as ``pip install`` of that package would) and its YAML in
the user's own config directory (``hydra.searchpath``), swept without touching kernelzoo."""

from __future__ import annotations

import json

import pytest

from conftest import DONE, run_cmd, smoke_args

from conftest import PYTHON

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


def make_user_package(root):
    """What `pip install -e .` of a package declaring the entry point leaves on sys.path."""
    site = root / "site"
    (site / "mymaps").mkdir(parents=True)
    (site / "mymaps" / "__init__.py").write_text(MODULE)
    info = site / "mymaps-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mymaps\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[kernelzoo.maps.base]\ncube = mymaps\n")
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
