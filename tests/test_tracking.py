"""wandb without network: the first failure to reach the server sends the rest of the sweep and
the analysis offline with one warning (never a timeout per run), and ``make sync`` gives up
after a bounded time with a clear message. Nothing here reaches the network: the server is a
closed local port, the API key a fake."""

from __future__ import annotations

import os
import re
import shutil
import socket
import sys
import time
from pathlib import Path

import pytest
from conftest import PYTHON, analyze, read_all, run_cmd, smoke_args, sweep

from kernelzoo.records import tracking

CLOSED = "http://127.0.0.1:9"  # the discard port: nothing listens there
FAKE_KEY = "0123456789abcdef" * 2 + "01234567"


@pytest.fixture
def online(monkeypatch, tmp_path):
    """Logged in (a fake key), WANDB_MODE unset, the server a closed local port."""
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_API_KEY", FAKE_KEY)
    monkeypatch.setenv("WANDB_BASE_URL", CLOSED)
    for proxy in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy"):
        monkeypatch.delenv(proxy, raising=False)
    return tmp_path / "results"


class FakeWandb:
    """Stands in for wandb.init: records the mode each run asked for."""

    def __init__(self, monkeypatch):
        import wandb

        self.modes = []
        monkeypatch.setattr(wandb, "init", self.init)

    def init(self, mode, **kwargs):
        self.modes.append(mode)
        return type("Run", (), {"dir": "somewhere", "url": None, "finish": lambda *a, **k: None})()


def start(results):
    return tracking.start(True, results, group="g", name="n", config={}, echo=lambda line: None)


def test_an_unreachable_server_sends_this_run_and_the_rest_offline(online, monkeypatch, capsys):
    fake = FakeWandb(monkeypatch)
    began = time.monotonic()
    start(online)
    assert time.monotonic() - began < tracking.CONNECT_TIMEOUT + 1
    warnings = capsys.readouterr().err.strip().splitlines()
    assert len(warnings) == 1 and warnings[0].startswith(f"warning: wandb server {CLOSED} "
                                                         "unreachable"), warnings
    assert tracking.marker(online).is_file()

    def no_probe(url, timeout=0):
        raise AssertionError("the server was probed again")

    monkeypatch.setattr(tracking, "unreachable", no_probe)
    start(online)
    start(online)
    assert fake.modes == ["offline"] * 3 and not capsys.readouterr().err
    assert tracking.resolve_mode(online)[0] == "offline"


def test_the_offline_spell_ends(online, monkeypatch):
    FakeWandb(monkeypatch)
    start(online)
    old = time.time() - tracking.OFFLINE_FOR - 1
    os.utime(tracking.marker(online), (old, old))
    assert tracking.resolve_mode(online)[0] == "online"


def test_a_sweep_checks_afresh_and_a_reachable_server_clears_the_failure(online, monkeypatch,
                                                                         capsys):
    FakeWandb(monkeypatch)
    start(online)
    capsys.readouterr()
    with socket.create_server(("127.0.0.1", 0)) as server:
        monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{server.getsockname()[1]}")
        tracking.check_server(online)
    assert not tracking.marker(online).exists() and not capsys.readouterr().err
    assert tracking.resolve_mode(online)[0] == "online"


def test_a_proxy_is_what_is_probed(online, monkeypatch):
    """Behind a proxy the server itself is not reachable directly: the proxy is probed."""
    with socket.create_server(("127.0.0.1", 0)) as proxy:
        monkeypatch.setenv("http_proxy", f"http://127.0.0.1:{proxy.getsockname()[1]}")
        assert tracking.unreachable("http://wandb.example.invalid") is None
    assert tracking.unreachable(CLOSED) is not None


@pytest.mark.slow
def test_sweep_and_analysis_without_network_cost_one_warning(tmp_path, cli_env):
    """The smoke sweep with wandb online but the server a closed port, then its analysis:
    bounded in time, one warning in all, every run trained and logged offline. (~40 s.)"""
    env = {k: v for k, v in cli_env.items() if k != "WANDB_MODE"}
    env.update(WANDB_API_KEY=FAKE_KEY, WANDB_BASE_URL=CLOSED)
    results = tmp_path / "results"
    began = time.monotonic()
    res = sweep("smoke", smoke_args(results, "logger=wandb"), env, timeout=300)
    assert res.returncode == 0, res.explain()
    done = analyze(["experiment=smoke", f"results_dir={results}"], env, timeout=300)
    assert done.returncode == 0, done.explain()
    assert time.monotonic() - began < 150
    warnings = [line for line in (res.stderr + done.stderr).splitlines() if "wandb" in line]
    assert len(warnings) == 1 and "unreachable" in warnings[0], res.stderr + done.stderr
    assert len(read_all(results, "smoke")) == 6
    offline = list((results / "wandb").glob("offline-run-*"))
    assert len(offline) == 5 + 1, offline  # the trained points and the analysis
    # the sweep says once where its runs log; each run's own line is in its train.log
    assert len(re.findall(r"^wandb: offline \(the wandb server was unreachable", res.stdout,
                          re.M)) == 1, res.stdout


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("make") is None or shutil.which("timeout") is None,
                    reason="make or timeout is not installed")
def test_make_sync_gives_up_in_bounded_time(tmp_path, cli_env):
    env = {k: v for k, v in cli_env.items() if k != "WANDB_MODE"}
    env.update(WANDB_API_KEY=FAKE_KEY, WANDB_BASE_URL=CLOSED)
    results = tmp_path / "results"
    make_run = run_cmd([PYTHON, "-c", "import wandb, sys; r = wandb.init(dir=sys.argv[1], "
                        "mode='offline', project='p'); r.log({'a': 1}); r.finish()",
                        str(results)], env, timeout=120)
    assert make_run.returncode == 0, make_run.explain()
    venv = Path(sys.executable).parents[1]
    began = time.monotonic()
    res = run_cmd(["make", "-s", "-o", f"{venv}/.installed", "sync", f"VENV={venv}",
                   f"RESULTS={results}", "SYNC_TIMEOUT=5"], env, timeout=120)
    assert time.monotonic() - began < 60
    assert res.returncode != 0, res.explain()
    assert "wandb sync gave up after 5 s" in res.stderr and str(results / "wandb") in res.stderr


def test_a_checkout_is_told_to_make_sync():
    from kernelzoo.records import tracking

    assert tracking.SYNC == "`make sync`"  # tests run in a checkout (a plain install: test_install)
def test_a_runs_configuration_key_groups_its_seeds_and_sizes_of_memory():
    """The summary value wandb groups a configuration's runs by: every run of it (any seed,
    any n_keys) shares it, another parameter or learning rate does not."""
    summary = {"feature_map": "dpfp", "feature_map_params": {"nu": 1}, "d_key": 16, "d_dot": 32,
               "update_rule": "sum", "seed": 1, "n_keys": 16, "final_eval_loss": 0.01}
    key = tracking.configuration_key(summary, 0.001)
    assert key == "dpfp nu=1 d_key=16 d_dot=32 sum lr=0.001"
    assert tracking.configuration_key({**summary, "seed": 2, "n_keys": 40}, 0.001) == key
    assert tracking.configuration_key(summary, 0.003) != key
    assert tracking.configuration_key({**summary, "feature_map_params": {"nu": 2}}, 0.001) != key
    assert tracking.configuration_key({**summary, "feature_map_params": {}}) == \
        "dpfp d_key=16 d_dot=32 sum"


# ------------------------------------------------------------------ wandb cannot cost a run

class _Broken:
    """A wandb run whose service is gone: every call raises, as after wandb-core dies."""

    def __init__(self):
        self.calls = 0

    def log(self, *args, **kwargs):
        self.calls += 1
        raise ConnectionResetError("Connection lost")

    finish = log


def test_a_failing_wandb_call_costs_one_warning_and_turns_tracking_off(monkeypatch, capsys):
    """Each call into wandb is contained: the first failure warns once (for the whole process,
    however many runs its pack holds) and that tracker calls wandb no more."""
    monkeypatch.setattr(tracking, "_WARNED", [])
    runs = [_Broken(), _Broken()]
    trackers = [tracking.Tracker(r) for r in runs]
    for t in trackers:
        t.log({"loss": 1.0}, step=1)
        t.log({"loss": 0.5}, step=2)
        t.summary({"status": "converged"})
        t.finish(0)
    assert [r.calls for r in runs] == [1, 1]
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["warning: wandb failed to log (ConnectionResetError: Connection lost); the "
                   "run goes on untracked, results are in the local store"]


def test_a_link_planted_at_the_wandb_folder_is_not_followed(tmp_path, cli_env):
    """``<results_dir>/wandb`` a link out of the store: offline runs (each run's resolved config)
    and debug logs were written where it pointed. A sweep that logs to wandb refuses it in one
    line before anything is written; outside, nothing is written."""
    results, outside = tmp_path / "results", tmp_path / "elsewhere"
    results.mkdir()
    outside.mkdir()
    (results / "wandb").symlink_to(outside)
    res = sweep("smoke", smoke_args(results, "logger=wandb", "grids=[2]"), cli_env)
    assert res.returncode != 0, res.explain()
    assert "Traceback" not in res.output
    [line] = [x for x in res.stderr.splitlines() if x.strip()]
    assert line.endswith(f"{results / 'wandb'}: a symbolic link in the store; kernelzoo follows "
                         f"no link out of {results}: replace it with a directory or use another "
                         "results_dir"), line
    assert list(outside.iterdir()) == []
    # a run outside a sweep: one warning, the run trains untracked, still nothing outside
    tracker = tracking.start(True, results, group="g", name="n", config={}, echo=print)
    assert tracker.run is None and list(outside.iterdir()) == []


@pytest.mark.slow  # two runs of ~25 s, wandb's service killed after their first evaluations
def test_a_sweep_whose_wandb_service_is_killed_finishes_every_run(tmp_path, cli_env, background):
    """Killing ``wandb-core`` mid-training failed both runs of the pack ("Connection lost", no
    summary). Now the sweep finishes every run with its summary, and one warning says why the
    rest is untracked."""
    import signal

    results = tmp_path / "results"
    long = ["trainer.max_steps=20000", "trainer.patience=1000", "trainer.stop_loss=1e-30"]
    job = background([PYTHON, "-m", "kernelzoo.sweep", "smoke",
                      *smoke_args(results, "logger=wandb", "launcher=basic", *long,
                                  "hydra.sweeper.grids=[{feature_map: elu, n_keys: '6,5'}]"),
                      "--no-analysis"], cli_env)

    def service() -> list[int]:
        from kernelzoo.training import interrupt

        return [p for p in interrupt.descendants(job.proc.pid)
                if b"wandb-core" in Path(f"/proc/{p}/cmdline").read_bytes()]

    assert job.wait_for(lambda _: service() and list(results.glob("smoke/runs/*/curve.csv")),
                        timeout=60), job.stdout
    for pid in service():
        os.kill(pid, signal.SIGKILL)
    assert job.wait(timeout=200) == 0, job.stdout + job.stderr
    summaries = read_all(results, "smoke")
    assert len(summaries) == 2 and all(s["steps"] == 20000 for s in summaries.values())
    assert job.stderr.count("warning: wandb failed to") == 1, job.stderr
    assert "Traceback" not in job.stdout + job.stderr, job.stderr


@pytest.mark.slow  # a tmpfs mount (root) and two short runs: ~10 s
def test_a_full_wandb_directory_costs_one_warning_and_no_run(tmp_path, cli_env):
    """``<results_dir>/wandb`` full (an 8 KiB tmpfs): a trained run was left without its
    summary, with 5,678 lines of logging tracebacks. Now one warning, every summary written."""
    import subprocess

    results = tmp_path / "results"
    (results / "wandb").mkdir(parents=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8k", "tmpfs",
                              str(results / "wandb")], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        res = sweep("smoke", smoke_args(results, "logger=wandb", "trainer.max_steps=2000",
                                        "hydra.sweeper.grids=[{feature_map: elu, n_keys: '6,5'}]"),
                    cli_env)
    finally:
        subprocess.run(["umount", str(results / "wandb")], check=False)
    assert res.returncode == 0, res.explain()
    assert len(read_all(results, "smoke")) == 2
    warnings = [line for line in res.stderr.splitlines() if line.startswith("warning: wandb")]
    assert len(warnings) <= 1 and "Traceback" not in res.output, res.explain()
    assert len(res.output.splitlines()) < 20, res.explain()
