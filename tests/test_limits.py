"""Resource limits a run meets before it trains: the memory a cgroup (SLURM's --mem, a
container) or ``ulimit -v`` leaves it, and a d_dot too wide to build; each refused with one
line before anything is allocated or trained."""

from __future__ import annotations

import os
import resource

import pytest
from conftest import TINY, cgroup_tree

from kernelzoo.config import UsageError
from kernelzoo.training import devices


def test_the_memory_limit_of_a_cgroup_or_ulimit_is_read(tmp_path, monkeypatch):
    monkeypatch.setattr(resource, "getrlimit", lambda which: (resource.RLIM_INFINITY,) * 2)
    v2 = cgroup_tree(tmp_path / "v2", "0::/job_42/step_0\n", {
        "job_42/memory.max": f"{3 << 30}\n", "job_42/step_0/memory.max": "max\n"})
    assert devices.process_limit(*v2) == (3 << 30, "its cgroup's memory limit")
    v1 = cgroup_tree(tmp_path / "v1", "4:memory:/slurm/uid_1/job_7\n2:cpu:/\n", {
        "memory/slurm/uid_1/job_7/memory.limit_in_bytes": f"{2 << 30}\n",
        "memory/memory.limit_in_bytes": "9223372036854771712\n"})
    assert devices.process_limit(*v1) == (2 << 30, "its cgroup's memory limit")
    none = cgroup_tree(tmp_path / "none", "0::/\n", {"memory.max": "max\n"})
    assert devices.process_limit(*none) is None
    monkeypatch.setattr(resource, "getrlimit", lambda which: (1 << 30, resource.RLIM_INFINITY))
    # ulimit -v bounds the whole address space: what the process already holds is not free
    statm = tmp_path / "statm"
    statm.write_text("1000 200 100 1 0 300 0\n")
    page = os.sysconf("SC_PAGE_SIZE")
    assert devices.process_limit(*v1, statm) == ((1 << 30) - 1000 * page, "its ulimit -v")


def _plan(*overrides):
    from kernelzoo import config
    from kernelzoo.training.plan import plan

    cfg = config.compose("config", [*TINY, *overrides])
    with config.as_job(cfg) as job:
        return plan(job)


def test_a_run_above_the_cgroup_limit_is_refused_before_training(monkeypatch):
    """In a memory cgroup (SLURM --mem) a run estimated above the limit was accepted and
    OOM-killed without a word."""
    assert _plan("n_keys=200").memory_estimate
    monkeypatch.setattr(devices, "process_limit",
                        lambda: (4 << 20, "its cgroup's memory limit"))
    with pytest.raises(UsageError) as err:
        _plan("n_keys=200")
    assert "more than the 4 MiB of cpu under its cgroup's memory limit; valid: " in str(err.value)


def test_a_d_dot_too_wide_to_build_is_refused_before_its_map_is_built(monkeypatch):
    """favor d_dot=1e9 built its projection (128 GB) before the memory check refused it: an
    allocation error, or the OOM killer where memory is overcommitted."""
    from kernelzoo.maps import random_features

    built = []
    monkeypatch.setattr(random_features.torch, "empty",
                        lambda *a, **k: built.append(a) or pytest.fail("the map was built"))
    with pytest.raises(UsageError) as err:
        _plan("feature_map=favor", "d_dot=1000000000")
    assert str(err.value).startswith(
        "feature_map=favor with d_dot=1000000000: its features alone, one vector per sequence "
        "of a batch of ") and not built
