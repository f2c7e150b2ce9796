"""One run end to end: the CLI, the results store, skipping, run ids, wandb mode."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import slow_but
from wandb_records import summary_keys
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from kernelzoo.records import store, tracking
from kernelzoo.records import summary as schema
from kernelzoo.training import runner
from kernelzoo.maps.catalog import build_feature_map
from kernelzoo import config
from kernelzoo.config import CONF, Config
from kernelzoo.core.model import RetrievalModel
from kernelzoo.training.pack import Pack
from kernelzoo.core.task import RetrievalTask
from kernelzoo.records.rundir import RunDir
from kernelzoo.training.job import run
from kernelzoo.training.plan import Infeasible, locate, plan, resolve

ROOT = Path(__file__).resolve().parents[1]


def cli(*args, env=None, timeout=300):
    full_env = {**os.environ, "WANDB_SILENT": "true", **(env or {})}
    full_env.setdefault("WANDB_MODE", "disabled")
    return subprocess.run([sys.executable, "-m", "kernelzoo.train", *args], cwd=ROOT,
                          env=full_env, capture_output=True, text=True, timeout=timeout)


def run_dirs(results, experiment="adhoc"):
    return sorted((Path(results) / experiment / "runs").iterdir())


def composed(*overrides):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def test_elu_20_keys_converges_and_writes_a_complete_store_entry(tmp_path):
    env = {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path)}
    res = cli("feature_map=elu", "n_keys=20", f"results_dir={tmp_path}", "trainer.threads=1",
              env=env)
    assert res.returncode == 0, res.stderr
    (path,) = run_dirs(tmp_path)
    summary = store.read_summary(path)
    assert summary["status"] == "converged"
    assert summary["final_eval_loss"] <= 1e-3
    assert summary["final_eval_accuracy"] == 1.0
    assert summary["feature_map"] == "elu" and summary["d_dot"] == 64
    numbers = summary["numerics"]  # what sets its arithmetic (training.devices.numerics)
    assert numbers["torch"] == torch.__version__ and numbers["device"].startswith("cpu: ")
    assert (numbers["threads"], numbers["pack"], numbers["compiled"]) == (1, 1, False)
    assert numbers["blas"] and isinstance(numbers["flush_denormal"], bool)
    assert summary["predicted_capacity"] == 64 and summary["n_keys"] == 20
    assert summary["seq_len"] == 20 and summary["update_rule"] == "sum"
    assert summary["steps"] % 100 == 0
    assert {f.name for f in schema.FIELDS if f.kind == schema.REQUIRED} <= set(summary)
    assert list(summary) == [f.name for f in schema.FIELDS]  # diagnostics included, in order
    assert path.name == summary["run_id"] and path.name.startswith("elu-dkey64-S20-sum-seed1-")
    lines = (path / "curve.csv").read_text().splitlines()
    assert lines[0] == "step,train_loss,eval_loss,eval_accuracy"
    assert len(lines) - 1 == summary["steps"] // 100
    assert float(lines[-1].split(",")[2]) == pytest.approx(summary["final_eval_loss"], rel=1e-4)
    assert "n_keys: 20" in (path / "config.yaml").read_text()
    offline = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(offline) == 1, "one offline wandb run under the results directory"
    assert "wandb: offline" in res.stdout
    # read back: the run groups by its configuration and carries its final eval loss and accuracy
    logged = summary_keys(next(offline[0].glob("*.wandb")))
    assert json.loads(logged["configuration"]) == "elu d_key=64 d_dot=64 sum lr=0.001"
    assert json.loads(logged["final_eval_loss"]) == pytest.approx(summary["final_eval_loss"])
    assert json.loads(logged["final_eval_accuracy"]) == 1.0


@pytest.mark.slow
def test_finished_run_is_skipped_and_force_reruns_it(tmp_path):
    args = ("feature_map=elu", "n_keys=4", "d_key=8", "trainer=smoke",
            "trainer.max_steps=100", f"results_dir={tmp_path}", "logger=none")
    assert cli(*args).returncode == 0
    (path,) = run_dirs(tmp_path)
    first = (path / "summary.json").stat().st_mtime_ns
    again = cli(*args)
    assert again.returncode == 0 and "skip " in again.stdout and "\ndone " not in "\n" + again.stdout
    assert (path / "summary.json").stat().st_mtime_ns == first
    forced = cli(*args, "force=true")
    assert forced.returncode == 0 and "done " in forced.stdout
    assert (path / "summary.json").stat().st_mtime_ns != first


@pytest.mark.slow
def test_run_directory_without_summary_is_redone_from_scratch(tmp_path):
    args = ("feature_map=elu", "n_keys=4", "d_key=8", "trainer=smoke",
            "trainer.max_steps=100", f"results_dir={tmp_path}", "logger=none")
    assert cli(*args).returncode == 0
    (path,) = run_dirs(tmp_path)
    (path / "summary.json").unlink()
    (path / "curve.csv").write_text("garbage from a killed attempt\n")
    (path / "stale.tmp").write_text("x")
    res = cli(*args)
    assert res.returncode == 0 and "done " in res.stdout
    assert store.read_summary(path)["status"] in schema.STATUSES
    assert not (path / "stale.tmp").exists()
    assert (path / "curve.csv").read_text().startswith("step,")


def test_infeasible_d_dot_is_recorded_with_its_reason_and_exit_0(tmp_path):
    res = cli("feature_map=dpfp", "d_dot=100", f"results_dir={tmp_path}", "logger=none")
    assert res.returncode == 0
    (path,) = run_dirs(tmp_path)
    summary = store.read_summary(path)
    assert summary["status"] == "infeasible" and "d_dot=100" in summary["reason"]
    assert summary["steps"] == 0 and not (path / "curve.csv").exists()


@pytest.mark.parametrize("args, needle", slow_but({(("n_keys=0",), "n_keys=0")}, [
    (("feature_map=dpfp", "feature_map.nu=0"), "nu"),
    (("n_keys=0",), "n_keys=0"),
    (("trainer.device=quantum",), "quantum"),
    (("memory.update_rule=magic",), "magic"),
]))
def test_rejected_config_exits_2_with_one_short_line(tmp_path, args, needle):
    res = cli(*args, f"results_dir={tmp_path}", "logger=none")
    assert res.returncode == 2
    assert needle in res.stderr and "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) <= 2
    assert not (tmp_path / "adhoc" / "runs").exists(), "nothing trained or recorded"


@pytest.mark.parametrize("module, args", [("kernelzoo.train", ()),
                                          ("kernelzoo.sweep", ("quick",))])
def test_a_torch_that_does_not_fit_ulimit_v_is_one_line_naming_the_limit(tmp_path, module, args):
    """256 MiB of address space holds Python and Hydra but not libtorch's shared objects."""
    import resource

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (256 * 2 ** 20, resource.RLIM_INFINITY))

    res = subprocess.run([sys.executable, "-m", module, *args, f"results_dir={tmp_path}",
                          "logger=none", "dry_run=true"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, preexec_fn=limit)
    assert res.returncode == 2, res.stderr[-2000:]
    assert res.stderr.startswith("error: PyTorch cannot be loaded under ulimit -v 262144 KiB")
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert not any(tmp_path.iterdir()), "nothing written"


@pytest.mark.slow
def test_unknown_key_is_an_error_not_ignored(tmp_path):
    res = cli("trainer.lrr=0.1", f"results_dir={tmp_path}", "logger=none")
    assert res.returncode != 0 and "lrr" in res.stderr and "Traceback" not in res.stderr


def test_run_id_depends_on_the_experiment_not_on_logging_or_threads():
    base = ("feature_map=dpfp", "feature_map.nu=2", "n_keys=260")
    ids = {}
    how = [("logger=none",), ("trainer.threads=1",), ("trainer.progress=false",),
           ("trainer.flush_denormal=false",)]
    for extra in [(), *how, ("seed=2",), ("trainer.lr=0.01",), ("feature_map.nu=3",)]:
        p = plan(composed(*base, *extra))
        ids[extra] = store.run_id(p.identity.as_dict(), {"nu": p.phi.params["nu"]})
    same = {ids[()], *(ids[extra] for extra in how)}
    assert len(same) == 1
    assert ids[()].startswith("dpfp-nu2-dkey64-S260-sum-seed1-")
    assert len({ids[()], ids[("seed=2",)], ids[("trainer.lr=0.01",)],
                ids[("feature_map.nu=3",)]}) == 4


def _flushes() -> bool:
    return (torch.tensor([1e-39]) * 3).item() == 0.0  # 3e-39 is a denormal float32


@pytest.mark.skipif(not torch.set_flush_denormal(False), reason="a CPU without FTZ/DAZ")
@pytest.mark.parametrize("setting, memory, steps, evaluations", [
    ("auto", "fwm", True, True), ("auto", "sum", True, False), ("auto", "delta", False, False),
    ("auto", "sum memory.normalisation=sum", False, False), ("true", "delta", True, True),
    ("false", "fwm", False, False)])
def test_training_flushes_denormals_as_set_and_then_restores_them(tmp_path, monkeypatch, setting,
                                                                   memory, steps, evaluations):
    seen = {"steps": set(), "evaluations": set()}
    losses, evaluate = runner.Pack.losses, runner.evaluate

    def in_step(*args, **kwargs):
        seen["steps"].add(_flushes())
        return losses(*args, **kwargs)

    def in_evaluation(*args, **kwargs):
        seen["evaluations"].add(_flushes())
        return evaluate(*args, **kwargs)

    monkeypatch.setattr(runner.Pack, "losses", in_step)
    monkeypatch.setattr(runner, "evaluate", in_evaluation)
    rule, *more = memory.split()
    cfg = composed("d_key=8", "n_keys=4", "logger=none", "trainer=smoke", "trainer.max_steps=50",
                   "trainer.progress=false", f"trainer.flush_denormal={setting}",
                   f"memory={rule}", *more, f"results_dir={tmp_path}")
    (_, summary), = run(cfg, echo=lambda line: None)
    assert summary["steps"] == 50
    assert seen == {"steps": {steps}, "evaluations": {evaluations}}
    assert not _flushes()  # restored


@pytest.mark.skipif(not torch.set_flush_denormal(False), reason="a CPU without FTZ/DAZ")
def test_flushed_sum_rule_steps_train_bit_identical_parameters():
    """trainer.flush_denormal=auto flushes the sum rule's training steps (devices.py): where
    FAVOR+'s exp features underflow to denormals (m 128 at 100 keys), the parameters trained
    flushed and not are bit-identical."""
    def pack_and_task():
        torch.manual_seed(1)
        phi = build_feature_map("favor", d_key=64, m=128, variant="hyperbolic")
        phi.use_generator(torch.Generator().manual_seed(2))
        return Pack([RetrievalModel(100, phi)]), RetrievalTask(100, 100, 100, False, 1, "cpu")

    pack, task = pack_and_task()
    batch = task.train_batch(32)
    features = pack.models[0].phi(pack.models[0].keys_and_query(batch.keys, batch.values,
                                                                batch.query)[0])
    assert ((features > 0) & (features < torch.finfo(torch.float32).tiny)).any()

    def train(flush: bool):
        pack, task = pack_and_task()
        opt = torch.optim.Adam(pack.parameters(), lr=1e-3, fused=True)
        torch.set_flush_denormal(flush)
        try:
            for _ in range(40):
                losses = pack.losses([task.train_batch(32)])
                opt.zero_grad(set_to_none=True)
                losses.sum().backward()
                opt.step()
        finally:
            torch.set_flush_denormal(False)
        return {n: p.detach() for n, p in pack.params.items()}

    flushed, kept = train(True), train(False)
    assert all(torch.equal(flushed[n], kept[n]) for n in kept)


def test_committed_runs_keep_their_run_ids():
    """A run id is the store's directory name, so it must never change: the first committed run
    of every map and run-id parameters (``dpfp-nu2``, ``favor-m64-varianthyperbolic``, ...) of
    every reference experiment is planned from its config.yaml to its own directory name, and
    an infeasible point (recorded without a config.yaml) from its experiment's overrides."""
    seen = set()
    for file in sorted((ROOT / "results" / "reference").glob("*/runs/*/config.yaml")):
        run = file.parent
        kind = (run.parent.parent.name, run.name.split("-dkey")[0])
        if kind in seen:
            continue
        cfg = OmegaConf.merge(OmegaConf.structured(Config), yaml.safe_load(file.read_text()))
        assert locate(cfg, resolve(cfg).identity)[0] == run.name
        seen.add(kind)
    assert len(seen) >= 50
    point = ["+experiments=dot_scaling", "feature_map=dpfp", "d_dot=16", "n_keys=4", "seed=1"]
    with config.as_job(config.compose("config", point)) as job:
        p = resolve(job)
        assert isinstance(p, Infeasible)
        assert locate(job, p.identity)[0] == "dpfp-dkey32-S4-sum-seed1-3f2cf939"
    assert (ROOT / "results/reference/dot_scaling/runs/dpfp-dkey32-S4-sum-seed1-3f2cf939").is_dir()



@pytest.mark.slow
def test_every_committed_run_keeps_its_run_id():
    """Every run of every reference store with a config.yaml plans to its directory name."""
    wrong, count = [], 0
    torch.set_num_threads(1)
    for file in sorted((ROOT / "results" / "reference").glob("*/runs/*/config.yaml")):
        cfg = OmegaConf.merge(OmegaConf.structured(Config), yaml.safe_load(file.read_text()))
        count += 1
        if locate(cfg, resolve(cfg).identity)[0] != file.parent.name:
            wrong.append(str(file.parent.relative_to(ROOT)))
    assert count > 3000 and not wrong, wrong[:5]

def test_d_dot_resolves_the_feature_map_parameters():
    p = plan(composed("feature_map=dpfp", "d_dot=384"))
    assert p.phi.params["nu"] == 3 and p.identity.d_dot == 384
    p = plan(composed("feature_map=elu", "d_dot=32"))
    assert p.phi.d_key == 32 and p.identity.d_key == 32


def test_wandb_mode_follows_env_then_login_then_offline(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert tracking.resolve_mode()[0] == "disabled"
    monkeypatch.delenv("WANDB_MODE")
    assert tracking.resolve_mode()[0] == "offline"
    (tmp_path / "netrc").write_text("machine api.wandb.ai\n  login user\n  password " + "a" * 40)
    assert tracking.resolve_mode()[0] == "online"


def a_summary(**fields) -> dict:
    return schema.new(run_id="elu-S4", experiment="adhoc", task="capacity", feature_map="elu",
                      feature_map_params={}, d_key=4, d_dot=4, predicted_capacity=4, n_keys=4,
                      seq_len=4, update_rule="sum", normalisation="attention", seed=1,
                      **{"status": "converged", **fields})


def test_store_summary_is_json_and_rejects_corruption(tmp_path):
    summary = a_summary(final_eval_loss=float("nan"), margin=float("-inf"))
    RunDir(tmp_path).write_summary(summary)
    data = json.loads((tmp_path / "summary.json").read_text())
    assert data["final_eval_loss"] is None and data["margin"] == "-inf"
    with pytest.raises(ValueError, match="best_eval_loss is \"inf\", not a finite number >= 0"):
        RunDir(tmp_path).write_summary(a_summary(best_eval_loss=float("inf")))
    (tmp_path / "summary.json").write_text('{"status": "conv')
    with pytest.raises(store.StoreError, match="summary.json"):
        store.read_summary(tmp_path)


def test_one_summary_schema_for_writers_and_readers(tmp_path):
    """Writers build summaries from the declared fields (defaults, order); the store writes and
    reads only what the schema accepts; older summaries read as they always did."""
    summary = a_summary()
    assert list(summary)[-2:] == ["resumes", "stall_check_of"]  # no diagnostics: never measured
    assert summary["steps"] == 0 and summary["kernelzoo_version"]
    with pytest.raises(ValueError, match="no field n_key"):
        a_summary(n_key=4)
    with pytest.raises(ValueError, match="lacks status"):
        schema.new(**{k: v for k, v in summary.items() if k != "status"})
    with pytest.raises(ValueError, match="steps is 1.5, not an integer"):
        RunDir(tmp_path).write_summary(a_summary(steps=1.5))
    assert not (tmp_path / "summary.json").exists()
    older = {k: v for k, v in summary.items() if k not in ("resumes", "stall_check_of")}
    (tmp_path / "summary.json").write_text(json.dumps({**older, "extra": [1]}))
    read = store.read_summary(tmp_path)  # absent: stall_check_of null, resumes absent; kept
    assert read == {**older, "extra": [1], "stall_check_of": None}
    for bad, message in (({"dead_keys": 1.5}, "dead_keys is 1.5, not an integer >= 0 or null"),
                         ({"status": "done"}, "status 'done' is not one of converged"),
                         ({"margin": "x"}, "margin is \"x\", not a number")):
        (tmp_path / "summary.json").write_text(json.dumps({**summary, **bad}))
        with pytest.raises(store.StoreError, match=message):
            store.read_summary(tmp_path)


def test_committed_summaries_are_what_the_schema_writes(tmp_path):
    """A committed summary of a trained run with resumes (the newest committed) is byte for
    byte what ``RunDir.write_summary`` makes of it, but for stall_check_of (null in every committed
    run; absent from the older ones): the writers' fields and their order are the schema's."""
    full = [f for f in sorted((ROOT / "results" / "reference").glob("*/runs/*/summary.json"))
            if '"resumes"' in f.read_text()][::10]
    assert len(full) > 10
    for f in full:
        RunDir(tmp_path).write_summary(schema.new(**store.read_summary(f.parent)))
        written, committed = ((path / "summary.json").read_text().replace(
            '  "stall_check_of": null,\n', "") for path in (tmp_path, f.parent))
        assert written == committed, f


@pytest.mark.slow
def test_published_capacity_dpfp1_60_converges_elu_120_does_not(tmp_path):
    """The issue's acceptance check at d_key 64 (minutes on a CPU)."""
    res = cli("-m", "feature_map=dpfp", "n_keys=60", f"results_dir={tmp_path}", "logger=none",
              timeout=3600)
    assert res.returncode == 0
    res = cli("feature_map=elu", "n_keys=120", f"results_dir={tmp_path}", "logger=none",
              timeout=3600)
    assert res.returncode == 0
    by_map = {s["feature_map"]: s for s in map(store.read_summary, run_dirs(tmp_path))}
    assert by_map["dpfp"]["status"] == "converged"
    assert by_map["elu"]["status"] != "converged" and by_map["elu"]["final_eval_loss"] > 1e-2


@pytest.mark.slow
def test_multirun_with_local_workers_from_python_dash_m(tmp_path):
    """`python -m kernelzoo.train -m launcher=local` works: workers can import the task."""
    res = cli("-m", "launcher=local", "hydra.launcher.n_jobs=2", "feature_map=elu", "n_keys=3,4",
              "d_key=4", "trainer=smoke", "trainer.max_steps=50", f"results_dir={tmp_path}",
              "logger=none")
    assert res.returncode == 0, res.stderr[-2000:]
    summaries = [store.read_summary(p) for p in run_dirs(tmp_path)]
    assert sorted(s["n_keys"] for s in summaries) == [3, 4]
