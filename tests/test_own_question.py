"""Your own question without traps: a d_dot that a map's fixed parameters cannot reach is
refused before anything trains, naming the fix, while a point no d_key reaches is recorded as
infeasible; README's two-map example runs as written."""

from __future__ import annotations

import pytest
from conftest import PYTHON, run_cmd

TWO_MAPS = ["experiment=two_maps", "seed=1,2,3", "search=bisect", "n_keys=4,256",
            "hydra.sweeper.grids=[{feature_map: dpfp, feature_map.nu: 2}, {feature_map: elu}]"]


def sweep(args, env, cwd):
    return run_cmd([PYTHON, "-m", "kernelzoo.sweep", *args, "--no-analysis"], env, cwd=cwd)


def test_a_fixed_nu_that_cannot_reach_d_dot_is_refused_in_the_dry_run(tmp_path, cli_env):
    """README's two-map example with d_dot=64 (and d_key left at 64): every DPFP point was
    infeasible, the dry run exited 0 and a real run trained an ELU-only "comparison"."""
    res = sweep([*TWO_MAPS, "d_dot=64", "dry_run=true", f"results_dir={tmp_path}"], cli_env,
                tmp_path)
    assert res.returncode == 2, res.explain()
    assert res.stderr.strip().endswith(
        "feature_map=dpfp: nu=2 cannot reach d_dot=64 with d_key=64; valid: d_key=16, or leave "
        "feature_map.nu unset (d_dot then sets it)"), res.explain()
    assert len(res.stderr.strip().splitlines()) == 1


@pytest.mark.slow  # a search dry run: ~7 s
def test_readmes_two_map_example_plans_both_maps_and_counts_its_series(tmp_path, cli_env):
    """README's example as written plans DPFP-2 and ELU+1; the search counts its series as
    configurations and seeds ("6 configurations x seeds" meant 6 series)."""
    res = sweep([*TWO_MAPS, "d_key=16", "dry_run=true", f"results_dir={tmp_path}"], cli_env,
                tmp_path)
    assert res.returncode == 0, res.explain()
    assert "plan dpfp-nu2-dkey16-" in res.stdout and "plan elu-dkey16-" in res.stdout
    assert "infeasible" not in res.stdout
    assert "sweep two_maps: search=bisect over 6 series (2 configurations, 3 seeds)" \
        in res.stdout, res.explain()


def test_cfg_job_on_a_swept_axis_shows_its_first_point(tmp_path, cli_env):
    """``--cfg job`` with ``seed=1,2`` answered with Hydra's "add --multirun"."""
    res = run_cmd([PYTHON, "-m", "kernelzoo.sweep", "smoke", "seed=1,2", "--cfg", "job"], cli_env)
    assert res.returncode == 0, res.explain()
    assert res.stderr.strip() == ("showing the point seed=1, the first of each swept axis "
                                  "(dry_run=true lists every point)")
    assert "\nseed: 1\n" in res.stdout and "--multirun" not in res.output


@pytest.mark.slow  # two CLI calls on a synthetic store: ~9 s
def test_compare_prints_each_views_difference_with_welchs_interval(tmp_path, cli_env):
    """Two configurations of a synthetic store, 3 seeds each: the loss view's line is the
    difference of mean failure points with scipy's Welch interval at 97.5%, read from the same
    seeds; a view where a seed is a bound says so; an unknown label is one line, exit 2."""
    import numpy as np
    from scipy import stats
    from synthetic import write_run

    from kernelzoo.analysis.pipeline import seeds_of

    exp = tmp_path / "results" / "pair"
    fails = {("elu", 1): 48, ("elu", 2): 56, ("elu", 3): 52,
             ("relu", 1): 28, ("relu", 2): 36, ("relu", 3): 32}
    for (fm, seed), at in fails.items():
        for n in (16, 24, 32, 40, 48, 56, 64):
            write_run(exp, n_keys=n, loss=1e-4 if n < at else 0.3, feature_map=fm, seed=seed)
    seeds = seeds_of(exp, "pair", 0.01, 0.99)
    a = seeds.loc[seeds["label"] == "ELU+1", "value"].to_numpy(float)
    b = seeds.loc[seeds["label"] == "ReLU", "value"].to_numpy(float)
    ci = stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.975)
    res = run_cmd([PYTHON, "-m", "kernelzoo.compare", exp, "ELU+1", "ReLU"], cli_env)
    assert res.returncode == 0, res.explain()
    loss = next(line for line in res.stdout.splitlines() if line.startswith("- loss: "))
    assert loss == (f"- loss: ELU+1 holds more, by {np.mean(a) - np.mean(b):+.3g} keys "
                    f"[{ci.low:.3g}, {ci.high:.3g}]"), res.stdout
    res = run_cmd([PYTHON, "-m", "kernelzoo.compare", exp, "ELU+1", "DPFP-2"], cli_env)
    assert res.returncode == 2 and res.stderr.startswith(
        "error: no configuration 'DPFP-2' in "), res.explain()
