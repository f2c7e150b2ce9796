"""The typed schema (kernelzoo.config) and the checks before anything is written: paths, types
and ranges, devices, the memory estimate, and every point of a sweep.

Most cases go through the command line's door in process (``train.precheck``, the same call
``python -m kernelzoo.train`` makes first); a few run the real command lines to prove that a
rejected one writes nothing anywhere.
"""

from __future__ import annotations

import os
import shutil
import time

import pytest
import torch
from conftest import PYTHON, TINY, analyze, run_cmd, slow_but, sweep
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.types import RunMode
from omegaconf import OmegaConf

from kernelzoo import config
from kernelzoo import train as train_module
from kernelzoo.config import CONF

EXPERIMENT_RULE = "one path component"


def rejected(capsys, tmp_path, *overrides) -> str:
    """The one line ``python -m kernelzoo.train <overrides>`` prints before it exits 2."""
    results = tmp_path / "results"
    with pytest.raises(SystemExit) as exit_info:
        train_module.precheck([f"results_dir={results}", *TINY, *overrides])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    assert not results.exists(), "a rejected command line created its results_dir"
    return lines[0]


@pytest.mark.parametrize("overrides, needles", [
    (["experiment=../../x"], ["experiment=../../x", EXPERIMENT_RULE]),
    (["experiment=/tmp/abs"], ["experiment=/tmp/abs", EXPERIMENT_RULE]),
    (["experiment=a/b"], ["experiment=a/b", EXPERIMENT_RULE]),
    (["experiment=" + "x" * 300], ["x" * 300, "at most 100"]),
    (["experiment=.."], ["experiment=..", "not '.' or '..'"]),
    (["experiment=''"], ["experiment=", EXPERIMENT_RULE]),
    (["experiment=null"], ["experiment=null", "not Optional"]),
    (["experiment=${oc.env:HOME}"], ["experiment=", EXPERIMENT_RULE]),
    (["experiment=été"], ["experiment=été", "cannot be parsed"]),
    (["experiment='été'"], ["experiment='été'", EXPERIMENT_RULE]),
], ids=["dotdot", "absolute", "two-components", "300-chars", "parent", "empty", "null",
        "interpolated-path", "unicode", "unicode-quoted"])
def test_experiment_is_one_safe_path_component(capsys, tmp_path, overrides, needles):
    line = rejected(capsys, tmp_path, *overrides)
    for needle in needles:
        assert needle in line, line


@pytest.mark.parametrize("value, name", [("1", "1"), ("true", "True"), ("inf", "inf"),
                                         ("1e3", "1000.0"), ("my-run_2.b", "my-run_2.b")])
def test_names_yaml_reads_as_other_types_are_taken_as_strings(value, name):
    cfg = config.compose("config", [f"experiment={value}"])
    with config.as_job(cfg) as job:
        assert config.check(job).experiment == name


BAD_VALUES = [  # overrides, what the one line must name
    (["n_keys=true"], ["n_keys=true", "an integer from 1 to 1048576"]),
    (["n_keys=0"], ["n_keys=0", "an integer from 1 to 1048576"]),
    (["n_keys=2.5"], ["n_keys=2.5", "Integer"]),
    (["d_key=0"], ["d_key=0"]),
    (["d_dot=0"], ["d_dot=0"]),
    (["d_dot=true"], ["d_dot=true"]),
    (["seed=-1"], ["seed=-1", "from 0 to"]),
    (["seed=18446744073709551616"], ["seed=18446744073709551616", "from 0 to"]),
    (["seed=abc"], ["seed=abc"]),
    (["trainer.threads=0"], ["trainer.threads=0", ">= 1"]),
    (["trainer.eval_query_batch=0"], ["trainer.eval_query_batch=0", ">= 1"]),
    (["trainer.patience=-1"], ["trainer.patience=-1", ">= 0"]),
    (["trainer.lr=0"], ["trainer.lr=0", "finite number > 0"]),
    (["trainer.lr=inf"], ["trainer.lr=inf", "finite"]),
    (["trainer.lr=nan"], ["trainer.lr=nan", "finite"]),
    (["memory.eps=-1e-6"], ["memory.eps=-1e-6", "> 0"]),
    (["memory.update_rule=magic"], ["memory.update_rule=magic", "delta, fwm, gated_delta, sum"]),
    (["trainer.dtype=float16"], ["trainer.dtype=float16", "float32, float64"]),
    (["trainer.progress=maybe"], ["trainer.progress=maybe", "auto, true, false"]),
    (["trainer.pack=0"], ["trainer.pack=0", "auto or an integer >= 1"]),
    (["trainer.pack=many"], ["trainer.pack=many", "auto or an integer >= 1"]),
    (["trainer.compile=fast"], ["trainer.compile=fast", "auto, true, false"]),
    (["trainer.flush_denormal=yes"], ["trainer.flush_denormal=yes", "auto, true, false"]),
    (["task=update", "task.seq_len=0"], ["task.seq_len=0", ">= 1"]),
    (["task.seq_len=7", "n_keys=5"], ["task.seq_len=7", "n_keys=5", "Setting 1"]),
    (["trainer.nope=1"], ["trainer.nope=1", "no key 'nope'", "lr, batch_size"]),
    (["+nope=1"], ["nope=1", "no key 'nope'", "n_keys"]),
    (["+trainer.nope=1"], ["trainer.nope=1", "no key 'nope'"]),
    (["feature_map=nope"], ["feature_map=nope", "dpfp, elu"]),
    (["memory=nope"], ["memory=nope", "delta, fwm, gated_delta, sum"]),
    (["logger.name=slack"], ["logger.name=slack", "wandb, none"]),
    (["search.resolution=0.5"], ["search.resolution=0.5", ">= 1"]),
    (["search.multiples=[]"], ["search.multiples=[]", "non-empty"]),
    (["search.min_keys=10", "search.max_keys=5"], ["search.min_keys=10", "max_keys"]),
    (["feature_map=dpfp", "feature_map.nu=0"], ["feature_map=dpfp", "nu", "got 0"]),
    (["feature_map=favor", "feature_map.seed=1.5"], ["feature_map=favor", "seed", "1.5"]),
    (["feature_map=favor", "feature_map.orthogonal=maybe"], ["orthogonal", "maybe"]),
    (["feature_map=trig", "feature_map.eval_redraw=sometimes"],
     ["feature_map=trig", "eval_redraw", "'sometimes'", "'per_chunk', 'once'"]),
    (["feature_map=softmax", "memory=delta"], ["memory.update_rule=delta", "softmax"]),
    (["n_keys=3,4"], ["n_keys=3,4", "--multirun"]),
    (["n_keys=("], ["n_keys=("]),
    (["trainer.device=quantum"], ["trainer.device=quantum", "auto, cpu, cuda"]),
]


@pytest.mark.parametrize("overrides, needles", BAD_VALUES,
                         ids=["-".join(o) for o, _ in BAD_VALUES])
def test_bad_value_is_one_line_exit_2_before_anything(capsys, tmp_path, overrides, needles):
    line = rejected(capsys, tmp_path, *overrides)
    for needle in needles:
        assert needle in line, line


@pytest.mark.skipif(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") > 600 * 2**30,
                    reason="n_keys=100000 (about 660 GiB) fits in this machine's memory")
def test_a_run_that_cannot_fit_is_refused_with_the_estimate(capsys, tmp_path):
    line = rejected(capsys, tmp_path, "n_keys=100000")
    assert line.startswith("error: n_keys=100000 (") and "needs about" in line and "GiB" in line
    assert "parameters, gradients and Adam state" in line and "valid: n_keys <=" in line


def test_batches_that_cannot_fit_are_refused_with_the_estimate(capsys, tmp_path):
    line = rejected(capsys, tmp_path, "trainer.batch_size=1000000000000")
    assert "trainer.batch_size=1000000000000" in line and "GiB" in line
    assert "valid: trainer.batch_size <=" in line


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="no /proc here")
def test_a_results_dir_that_cannot_be_created_is_refused(capsys, tmp_path):
    line = rejected(capsys, tmp_path, "results_dir=/proc/kernelzoo-results")
    assert "cannot write /proc/kernelzoo-results" in line


def test_the_estimate_leaves_the_published_sweeps_alone():
    """figure2's largest points (S = 600, FAVOR+ m = 512) are far below a laptop's memory."""
    from kernelzoo.config import MemoryConf, TrainerConf
    from kernelzoo.maps.catalog import build_feature_map
    from kernelzoo.training.footprint import footprint

    for name, params, rule, normalisation in (
            ("favor", {"m": 512, "variant": "hyperbolic"}, "sum", "attention"),
            ("dpfp", {"nu": 3}, "sum", "attention"), ("dpfp", {"nu": 1}, "delta", "sum")):
        phi = build_feature_map(name, d_key=64, **params)
        need = footprint(phi, MemoryConf(update_rule=rule, normalisation=normalisation),
                         TrainerConf(), [(600, 600, 600)])
        assert max(need.values()) < 2**30, need


@pytest.mark.parametrize("device", [
    pytest.param("cuda", marks=pytest.mark.skipif(torch.cuda.is_available(),
                                                  reason="a CUDA device is here")),
    "cuda:99",
    pytest.param("mps", marks=pytest.mark.skipif(torch.backends.mps.is_available(),
                                                 reason="MPS is here")),
])
def test_a_device_this_machine_lacks_is_refused(capsys, tmp_path, device):
    line = rejected(capsys, tmp_path, f"trainer.device={device}")
    assert f"trainer.device={device}" in line and "valid:" in line


# ------------------------------------------------------------------ the real command lines

def _nothing_written(root, cwd):
    assert sorted(p.name for p in root.iterdir()) == ["cwd"], sorted(root.rglob("*"))
    assert not list(cwd.iterdir())


@pytest.mark.parametrize("command", slow_but({"analyze"}, ["train", "sweep", "analyze"]))
def test_an_escaping_experiment_writes_nothing_anywhere(tmp_path, cli_env, command):
    root, cwd = tmp_path / "root", tmp_path / "root" / "cwd"
    cwd.mkdir(parents=True)
    outside = tmp_path / "outside"
    args = {"train": [PYTHON, "-m", "kernelzoo.train", *TINY],
            "sweep": [PYTHON, "-m", "kernelzoo.sweep", "smoke"],
            "analyze": [PYTHON, "-m", "kernelzoo.analyze", "logger=none"]}[command]
    res = run_cmd([*args, f"results_dir={root / 'results'}", f"experiment=../../{outside.name}"],
                  cli_env, cwd=cwd, timeout=120)
    assert res.returncode == 2, res.explain()
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "one path component" in lines[0], res.explain()
    assert not outside.exists()
    _nothing_written(root, cwd)


@pytest.mark.slow
def test_a_device_this_machine_lacks_fails_a_sweep_before_anything(tmp_path, cli_env):
    """trainer.device=cuda (or a cuda:N beyond the count) as one value of a sweep: exit 2, one
    line, and no 'infeasible' record under another run id, nothing at all written."""
    results = tmp_path / "results"
    res = sweep("smoke", [f"results_dir={results}", "trainer.device=cpu,cuda:99"], cli_env)
    assert res.returncode == 2, res.explain()
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "trainer.device=cuda:99" in lines[0], res.explain()
    assert not results.exists()


def test_a_typo_in_the_third_value_fails_the_sweep_up_front(tmp_path, cli_env):
    results = tmp_path / "results"
    res = sweep("smoke", [f"results_dir={results}", "seed=1,2,x", "launcher=local"], cli_env)
    assert res.returncode == 2, res.explain()
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "seed=x" in lines[0] and "Traceback" not in res.output
    assert not results.exists()
    res = analyze([f"results_dir={results}", "experiment=smoke", "threshold=2"], cli_env)
    assert res.returncode == 2 and "threshold=2" in res.stderr and not results.exists()


@pytest.mark.parametrize("launcher, needle", [
    (["launcher=local", "hydra.launcher.n_jobs=0"], "hydra.launcher.n_jobs=0"),
    pytest.param(["launcher=slurm"], "no srun", marks=pytest.mark.skipif(
        shutil.which("srun") is not None, reason="this is a SLURM machine")),
], ids=["joblib-n_jobs-0", "slurm-without-slurm"])
@pytest.mark.slow
def test_launcher_settings_that_would_fail_at_launch_fail_first(tmp_path, cli_env, launcher,
                                                                  needle):
    results = tmp_path / "results"
    res = sweep("smoke", [f"results_dir={results}", *launcher], cli_env)
    assert res.returncode == 2, res.explain()
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0], res.explain()
    assert not results.exists()


@pytest.mark.parametrize("grids, needle", slow_but({"grids=[3]"}, [
    ("grids=[3]", "grids=[3]: smoke has no grid 3; valid: indices from 0 to 2"),
    ("grids=[]", "grids=[] selects no grid; valid: indices from 0 to 2"),
    ("grids=0,2", "grids=0,2 is a sweep, not a selection; valid: a list, e.g. grids=[0,2]"),
    ("grids=1", "grids=1 is invalid"),
]))
def test_a_bad_grid_selection_fails_the_sweep_up_front(tmp_path, cli_env, grids, needle):
    results = tmp_path / "results"
    res = sweep("smoke", [f"results_dir={results}", grids], cli_env)
    assert res.returncode == 2, res.explain()
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in res.output, res.explain()
    assert not results.exists()


@pytest.mark.slow
def test_hydra_sweep_syntax_still_works(tmp_path, cli_env):
    """glob(...), choice(...), range(...) and a,b sweeps are composed and checked like any
    point (a dry run: each point is planned, nothing trains)."""
    res = run_cmd([PYTHON, "-m", "kernelzoo.train", "--multirun", f"results_dir={tmp_path}",
                   *TINY[:-1], "feature_map=glob(e*)", "seed=choice(1,2)", "n_keys=range(3,5)",
                   "memory=sum,delta", "dry_run=true"], cli_env)
    assert res.returncode == 0, res.explain()
    planned = [line for line in res.stdout.splitlines() if line.startswith("plan elu-dkey4-S")]
    assert len(planned) == 8 and "Traceback" not in res.output, res.explain()


# ------------------------------------------------------------------ every point, composed fast

class FakeSweeper:
    """What points.Composer needs of a sweeper: Hydra's config loader and the master config."""

    def __init__(self, overrides):
        self.hydra_context = type("Context", (), {})()
        self.hydra_context.config_loader = GlobalHydra.instance().config_loader()
        self.config = self.hydra_context.config_loader.load_configuration(
            "config", overrides, run_mode=RunMode.MULTIRUN)


def test_points_are_composed_as_hydra_composes_them_once_per_choice_of_groups(monkeypatch):
    """The cached composition gives each point exactly the config Hydra composes for its job,
    and the 240 points of figure2 take one composition per feature map (4)."""
    from hydra_plugins.kernelzoo_sweeper.points import Composer

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        sweeper = FakeSweeper(["+experiments=figure2"])
        loader = sweeper.hydra_context.config_loader
        composer, calls = Composer(sweeper), []
        real = loader.load_sweep_config
        monkeypatch.setattr(loader, "load_sweep_config",
                            lambda master, ov: calls.append(ov) or real(master, ov))
        points = [["+experiments=figure2", f"feature_map={m}", *extra, f"n_keys={n}"]
                  for m, extra in (("softmax", []), ("elu", []), ("dpfp", ["feature_map.nu=3"]),
                                   ("favor", ["feature_map.m=512"]))
                  for n in range(20, 601, 20)]
        start = time.perf_counter()
        jobs = [composer(p) for p in points]
        seconds = time.perf_counter() - start
        composer.close()
        assert len(calls) == 4, calls
        assert seconds < 30, f"{len(points)} points took {seconds:.1f} s"
        for point, job in zip(points[::17], jobs[::17]):
            full = real(sweeper.config, point)
            expected = OmegaConf.to_container(full, resolve=False)
            del expected["hydra"]
            assert OmegaConf.to_container(job, resolve=False) == expected, point


def test_processes_proving_one_results_dir_writable_at_once_do_not_collide(tmp_path):
    """Two sweeps into one results_dir (or the array tasks of one sweep) start together; each
    proves the directory writable with a probe of its own, never one another could delete."""
    from concurrent.futures import ThreadPoolExecutor

    def prove(_):
        for _ in range(200):
            config.writable(tmp_path)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(prove, range(8)))
    assert list(tmp_path.iterdir()) == []
