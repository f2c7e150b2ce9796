"""A cluster that trains and cancels only its own: a job on a compute node, whose /proc does not
show the sweep's process, trains; a sweep's Ctrl-C cancels only the jobs it submitted; the
pickles a job runs are written and read owner-only."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from conftest import PYTHON, TINY, run_cmd

from kernelzoo.training import interrupt

NAMESPACES = shutil.which("unshare") is not None and subprocess.run(
    ["unshare", "-p", "-f", "--mount-proc", "true"], capture_output=True).returncode == 0
node = pytest.mark.skipif(not NAMESPACES, reason="needs unshare -p (root, Linux)")


def _node_env(cli_env: dict) -> dict:
    """The environment sbatch exports to a job: the sweep's marks, as this process set them."""
    saved = {k: os.environ.get(k) for k in (interrupt.SWEEP_PID, interrupt.SWEEP_PLACE)}
    interrupt.mark_sweep()
    env = {**cli_env, interrupt.SWEEP_PID: os.environ[interrupt.SWEEP_PID],
           interrupt.SWEEP_PLACE: os.environ[interrupt.SWEEP_PLACE]}
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    return env


@node
def test_a_worker_in_its_own_pid_namespace_does_not_kill_itself(cli_env):
    """A compute node: the job's /proc has no process of the sweep's pid (its own PID
    namespace). The worker was SIGKILLed at its start (exit 137, no line); it watches nothing
    there and goes on."""
    worker = ("from kernelzoo.training import interrupt; interrupt.die_with_sweep(); "
              "print('alive', flush=True)")
    res = run_cmd(["unshare", "-p", "-f", "--mount-proc", PYTHON, "-c", worker],
                  _node_env(cli_env), timeout=60)
    assert res.returncode == 0 and res.stdout.strip() == "alive", res.explain()
    # in the sweep's place the watch stands: a worker whose sweep is gone ends at once
    gone = {**_node_env(cli_env), interrupt.SWEEP_PID: "999999999"}
    res = run_cmd([PYTHON, "-c", worker], gone, timeout=60)
    assert res.returncode == -9, res.explain()


@node
@pytest.mark.slow  # six runs, each in its own PID namespace: ~25 s
def test_six_jobs_on_emulated_compute_nodes_all_train(tmp_path, cli_env):
    """Six jobs of a sweep, each in a PID namespace of its own as on a compute node, with the
    environment sbatch exports: 0 of 6 trained (each SIGKILLed at its start); now 6 of 6."""
    env = _node_env(cli_env)
    trained = 0
    for fm in ("elu", "dpfp"):
        for n in (3, 4, 6):
            res = run_cmd(["unshare", "-p", "-f", "--mount-proc", PYTHON, "-m",
                           "kernelzoo.train", *TINY, f"feature_map={fm}", f"n_keys={n}",
                           f"results_dir={tmp_path}", "experiment=node"], env, timeout=120)
            assert res.returncode == 0, res.explain()
            trained += 1
    runs = list((tmp_path / "node" / "runs").glob("*/summary.json"))
    assert trained == len(runs) == 6
