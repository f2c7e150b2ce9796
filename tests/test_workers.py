"""Every sweep fills the machine it is given: one worker per usable core by default (affinity
and CPU quota respected, at most one per job, as many as memory holds, one on a GPU), and the
sweep says how many workers and threads it runs."""

from __future__ import annotations

import os
import re
import shutil

import pytest
from conftest import PYTHON, cgroup_tree, run_cmd, smoke_args, sweep

from kernelzoo.training import workers


def test_a_cpu_quota_is_read_from_the_process_own_group_and_its_parents(tmp_path):
    v2 = cgroup_tree(tmp_path / "v2", "0::/job_42/step_0\n", {
        "job_42/cpu.max": "150000 100000\n", "job_42/step_0/cpu.max": "max 100000\n"})
    assert workers.cpu_quota(*v2) == 1.5
    v1 = cgroup_tree(tmp_path / "v1", "3:cpu,cpuacct:/docker/abc\n4:memory:/\n", {
        "cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "300000\n",
        "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n",
        "cpu,cpuacct/cpu.cfs_quota_us": "-1\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n"})
    assert workers.cpu_quota(*v1) == 3.0
    none = cgroup_tree(tmp_path / "none", "0::/\n", {"cpu.max": "max 100000\n"})
    assert workers.cpu_quota(*none) is None
    assert workers.cpu_quota(tmp_path / "missing", tmp_path) is None


@pytest.mark.parametrize("visible", [2, 4])
def test_usable_cores_follow_the_affinity(visible, tmp_path, monkeypatch):
    """A machine with 2 or 4 cores visible to the process (taskset, a SLURM cpuset): as many
    workers as cores; under a quota of 1.5 cores, 2."""
    monkeypatch.delenv("LOKY_MAX_CPU_COUNT", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(visible)))
    free = cgroup_tree(tmp_path, "0::/\n", {})
    assert workers.usable_cores(*free) == visible
    assert workers.workers(jobs=100, cores=workers.usable_cores(*free)) == visible
    quota = cgroup_tree(tmp_path / "q", "0::/job\n", {"job/cpu.max": "150000 100000\n"})
    assert workers.usable_cores(*quota) == 2
    one = cgroup_tree(tmp_path / "one", "0::/job\n", {"job/cpu.max": "50000 100000\n"})
    assert workers.usable_cores(*one) == 1


def test_workers_are_capped_by_jobs_memory_and_a_gpu():
    assert workers.workers(jobs=3, cores=16) == 3
    assert workers.workers(jobs=40, cores=16, job_bytes=3 << 30, memory=24 << 30) == 8
    assert workers.workers(jobs=40, cores=16, job_bytes=64 << 30, memory=24 << 30) == 1
    assert workers.workers(jobs=40, cores=16, gpu=True) == 1
    assert workers.workers(jobs=0, cores=2) == 1


@pytest.mark.slow  # two dry runs: ~10 s
def test_a_dry_run_names_one_worker_per_usable_core(tmp_path, cli_env):
    """The default launcher, on this machine as the user gets it (no test's cap), and under
    ``taskset -c 0``: the dry run names the workers it would start."""
    env = {k: v for k, v in cli_env.items() if k != "LOKY_MAX_CPU_COUNT"}
    cores = len(os.sched_getaffinity(0))
    res = sweep("smoke", smoke_args(tmp_path, "dry_run=true"), env)
    assert res.returncode == 0, res.explain()
    assert (f"(launcher: JoblibLauncher, one worker per usable core: up to {cores} of "
            f"{os.cpu_count()} core") in res.stdout, res.stdout
    if shutil.which("taskset"):
        res = run_cmd(["taskset", "-c", "0", PYTHON, "-m", "kernelzoo.sweep", "smoke",
                       *smoke_args(tmp_path, "dry_run=true"), "--no-analysis"], env)
        assert res.returncode == 0, res.explain()
        assert "one worker per usable core: up to 1 of" in res.stdout.splitlines()[0]


def test_the_progress_line_names_workers_and_threads(smoke_results):
    """The session's smoke sweep (one usable core in a test: LOKY_MAX_CPU_COUNT=1) ran under the
    default launcher, its jobs in its own process, and each progress line says so."""
    lines = re.findall(r"^progress: .*$", smoke_results.result.stdout, re.M)
    assert lines and all("runs (1 worker x 1 thread), elapsed" in line for line in lines), lines
