"""A cluster that trains and cancels only its own: a job on a compute node, whose /proc does not
show the sweep's process, trains; a sweep's Ctrl-C cancels only the jobs it submitted; the
pickles a job runs are written and read owner-only."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from conftest import PYTHON, TINY, run_cmd

from kernelzoo.training import interrupt

NAMESPACES = shutil.which("unshare") is not None and subprocess.run(
    ["unshare", "-p", "-f", "--mount-proc", "true"], capture_output=True).returncode == 0
node = pytest.mark.skipif(not NAMESPACES, reason="needs unshare -p (root, Linux)")


def on_node(*command) -> list:
    """``command`` as a job on a compute node runs: in a PID namespace of its own, under a
    process that stays PID 1 there (submitit's controller; PID 1 itself ignores SIGKILL sent
    from inside its namespace, which would hide the kill)."""
    return ["unshare", "-p", "-f", "--mount-proc", "sh", "-c", '"$@"; exit $?', "node",
            *map(str, command)]


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
    res = run_cmd(on_node(PYTHON, "-c", worker), _node_env(cli_env), timeout=60)
    assert res.returncode == 0 and res.stdout.strip() == "alive", res.explain()
    # in the sweep's place the watch stands: a worker whose sweep is gone ends at once
    gone = {**_node_env(cli_env), interrupt.SWEEP_PID: "999999999"}
    res = run_cmd([PYTHON, "-c", worker], gone, timeout=60)
    assert res.returncode == -9, res.explain()


# a sweep's job as it starts on a node: it watches its sweep (``die_with_sweep``), then trains
JOB = ("import runpy, sys; from kernelzoo.training import interrupt; interrupt.die_with_sweep(); "
       "sys.argv = ['kernelzoo.train', *sys.argv[1:]]; "
       "runpy.run_module('kernelzoo.train', run_name='__main__')")


@node
@pytest.mark.slow  # six runs, each in its own PID namespace: ~25 s
def test_six_jobs_on_emulated_compute_nodes_all_train(tmp_path, cli_env):
    """Six jobs of a sweep, each in a PID namespace of its own as on a compute node, with the
    environment sbatch exports: 0 of 6 trained (each SIGKILLed at its start); now 6 of 6."""
    env = _node_env(cli_env)
    trained = 0
    for fm in ("elu", "dpfp"):
        for n in (3, 4, 6):
            res = run_cmd(on_node(PYTHON, "-c", JOB, *TINY, f"feature_map={fm}", f"n_keys={n}",
                                  f"results_dir={tmp_path}", "experiment=node"),
                          env, timeout=120)
            assert res.returncode == 0, res.explain()
            trained += 1
    runs = list((tmp_path / "node" / "runs").glob("*/summary.json"))
    assert trained == len(runs) == 6


def replace_as_another_user(path, uid: int = 65534) -> str:
    """As another user of ``path``'s group (root switches to ``uid`` with that gid), replace
    ``path``: "replaced", or "refused" where the system says no."""
    code = ("import os, sys; p = sys.argv[1]; g = os.stat(p).st_gid if os.access(p, os.F_OK) "
            "else os.stat(os.path.dirname(os.path.dirname(p))).st_gid; os.setgroups([g]); "
            f"os.setgid(g); os.setuid({uid})\n"
            "try:\n    t = p + '.evil'; open(t, 'wb').write(b'x'); os.replace(t, p)\n"
            "    print('replaced')\nexcept PermissionError:\n    print('refused')")
    return subprocess.run([PYTHON, "-c", code, str(path)], capture_output=True, text=True,
                          timeout=60).stdout.strip()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")
def test_another_user_cannot_replace_a_queued_job_pickle():
    """A group-shared store (umask 002, in a folder others may enter: pytest's own is owner-only):
    submitit writes a queued job's pickle group-writable, and a group member who replaced it ran
    code as the sweep's owner (shown on a folder made as before). The sweep's job folder is its
    own and owner-only (``private_job_folder``): the replacement is refused."""
    from hydra_plugins.kernelzoo_sweeper.grid_sweeper import private_job_folder

    shared = Path(tempfile.mkdtemp(prefix="kernelzoo-shared-"))
    umask = os.umask(0o002)
    try:
        shared.chmod(0o775)
        sweep_dir = shared / "store" / "exp" / "hydra" / "2026-12-07_12-00-00-1"
        sweep_dir.mkdir(parents=True)
        pickles = {}
        for name, private in (("before", False), ("slurm", True)):
            if private:
                private_job_folder({"submitit_folder": f"{sweep_dir}/{name}/%j"})
            job = sweep_dir / name / "4211_0"
            job.mkdir(parents=True)  # as submitit does, under the sweep's umask
            pickles[name] = job / "4211_0_submitted.pkl"
            pickles[name].write_bytes(b"the job")
            assert pickles[name].stat().st_mode & 0o020  # group-writable, as submitit leaves it
        assert (sweep_dir / "slurm").stat().st_mode & 0o777 == 0o700
        assert replace_as_another_user(pickles["before"]) == "replaced"
        assert replace_as_another_user(pickles["slurm"]) == "refused"
        assert pickles["slurm"].read_bytes() == b"the job"
    finally:
        os.umask(umask)
        shutil.rmtree(shared, ignore_errors=True)


def test_a_sweep_directory_name_differs_across_pid_namespaces(tmp_path):
    """Two sweeps started in the same second under the same pid, in two PID namespaces (two
    containers), collided on one hydra/ folder; its name carries a random token beside the pid.
    A folder already there is refused without advice to delete another sweep's live logs."""
    import re

    from omegaconf import OmegaConf

    import kernelzoo.train  # noqa: F401 - registers the resolver
    from kernelzoo.records import store

    cfg = OmegaConf.create({"d": "${pid:}", "e": "${pid:}"})  # cached: one per sweep's config
    assert cfg.d == cfg.e and re.fullmatch(rf"{os.getpid()}-[0-9a-f]{{6}}", cfg.d)
    (tmp_path / "hydra" / "x").mkdir(parents=True)
    with pytest.raises(store.StoreError) as err:
        store.make_dir(tmp_path, tmp_path / "hydra" / "x")
    assert str(err.value).endswith("run again, which names a new one (remove this one only when "
                                   "no sweep writes there)")
