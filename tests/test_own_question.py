"""Your own question without traps: a d_dot that a map's fixed parameters cannot reach is
refused before anything trains, naming the fix, while a point no d_key reaches is recorded as
infeasible; README's two-map example runs as written."""

from __future__ import annotations

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


def test_readmes_two_map_example_plans_both_maps(tmp_path, cli_env):
    res = sweep([*TWO_MAPS, "d_key=16", "dry_run=true", f"results_dir={tmp_path}"], cli_env,
                tmp_path)
    assert res.returncode == 0, res.explain()
    assert "plan dpfp-nu2-dkey16-" in res.stdout and "plan elu-dkey16-" in res.stdout
    assert "infeasible" not in res.stdout


def test_cfg_job_on_a_swept_axis_shows_its_first_point(tmp_path, cli_env):
    """``--cfg job`` with ``seed=1,2`` answered with Hydra's "add --multirun"."""
    res = run_cmd([PYTHON, "-m", "kernelzoo.sweep", "smoke", "seed=1,2", "--cfg", "job"], cli_env)
    assert res.returncode == 0, res.explain()
    assert res.stderr.strip() == ("showing the point seed=1, the first of each swept axis "
                                  "(dry_run=true lists every point)")
    assert "\nseed: 1\n" in res.stdout and "--multirun" not in res.output


def test_a_search_counts_its_series_as_configurations_and_seeds(tmp_path, cli_env):
    """"6 configurations x seeds" meant 6 series."""
    res = sweep([*TWO_MAPS, "d_key=16", "dry_run=true", f"results_dir={tmp_path}"], cli_env,
                tmp_path)
    assert "sweep two_maps: search=bisect over 6 series (2 configurations, 3 seeds)" \
        in res.stdout, res.explain()
