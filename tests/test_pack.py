"""Packed training (pack.py): a run trained inside a pack is the run trained alone."""

import csv
import json

import pytest
import torch
from conftest import PYTHON, base_env, run_cmd, slow_but, smoke_args, sweep
from hydra import compose, initialize_config_dir

from hydra_plugins.kernelzoo_sweeper.packs import Point, jobs
from kernelzoo.records import store
from kernelzoo.training import pack, packing
from kernelzoo.maps.catalog import FEATURE_MAPS, build_feature_map
from kernelzoo.config import CONF, Config
from kernelzoo.core.model import RetrievalModel, retrieval_loss
from kernelzoo.core.task import RetrievalTask
from kernelzoo.training.job import run

TINY = ["d_key=8", "logger=none", "trainer.max_steps=300", "trainer.eval_every=50",
        "trainer.eval_sequences=4", "trainer.patience=100", "trainer.progress=false"]
CASES = {
    "elu": ["feature_map=elu"],
    "dpfp": ["feature_map=dpfp", "feature_map.nu=2"],
    "favor_fixed": ["feature_map=favor_fixed", "feature_map.m=16"],
    "favor_redrawn": ["feature_map=favor", "feature_map.m=16"],
    "softmax": ["feature_map=softmax"],
    "delta": ["feature_map=elu", "memory=delta", "task=update"],
    "fwm": ["feature_map=dpfp", "feature_map.nu=1", "memory=fwm", "task=update"],
    "hedgehog": ["feature_map=hedgehog"],
}


def composed(*overrides):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def curve(results, rid) -> list[dict]:
    path = store.run_dir(str(results), "adhoc", rid) / "curve.csv"
    return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(path.open())]


def train(results, overrides, members=()):
    cfg = composed(*TINY, f"results_dir={results}", *overrides,
                   f"pack_members={json.dumps([list(m) for m in members])}")
    return {rid: summary for rid, summary in run(cfg, echo=lambda line: None)}


def assert_same_curve(a, b, rel):
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for x, y in zip(a, b):
        for k in ("train_loss", "eval_loss"):
            assert x[k] == pytest.approx(y[k], rel=rel, abs=1e-12), (x["step"], k)
        assert x["eval_accuracy"] == y["eval_accuracy"]


@pytest.mark.parametrize("case", slow_but({"dpfp", "favor_redrawn"}, CASES))
def test_a_run_in_a_pack_with_other_seeds_and_more_keys_is_the_run_alone(tmp_path, case):
    """float64: the same batches and the same curve within 1e-6 over 300 steps, beside a
    run of another seed and a run with more keys (padded)."""
    point = [*CASES[case], "n_keys=10", "seed=1", "trainer.dtype=float64"]
    alone = train(tmp_path / "alone", point)
    packed = train(tmp_path / "packed", point, members=[(10, 2), (16, 1)])
    (rid,) = alone
    assert len(packed) == 3 and packed[rid]["steps"] == alone[rid]["steps"] == 300
    assert packed[rid]["status"] == alone[rid]["status"]
    assert_same_curve(curve(tmp_path / "packed", rid), curve(tmp_path / "alone", rid), 1e-6)


def test_float32_packs_agree_within_1e_3_over_100_steps(tmp_path):
    point = ["feature_map=dpfp", "n_keys=12", "trainer.max_steps=100"]
    alone = train(tmp_path / "alone", point)
    train(tmp_path / "packed", point, members=[(12, 2), (14, 3)])
    (rid,) = alone
    assert_same_curve(curve(tmp_path / "packed", rid), curve(tmp_path / "alone", rid), 1e-3)


def test_a_run_that_stops_leaves_the_pack_and_the_others_go_on_unchanged(tmp_path):
    """S=3 converges early and is compacted out (parameters and Adam state); S=12 runs on
    exactly as alone."""
    point = ["feature_map=elu", "n_keys=12", "trainer.dtype=float64", "trainer.lr=0.01"]
    alone = train(tmp_path / "alone", point)
    packed = train(tmp_path / "packed", point, members=[(3, 1), (12, 2)])
    (rid,) = alone
    small = next(s for s in packed.values() if s["n_keys"] == 3)
    assert small["status"] == "converged" and small["steps"] < packed[rid]["steps"]
    assert_same_curve(curve(tmp_path / "packed", rid), curve(tmp_path / "alone", rid), 1e-6)


def test_padding_contributes_nothing_to_outputs_losses_or_gradients():
    """One step of a mixed pack against each model alone, and the padded entries' gradients
    are exactly 0 (so Adam never moves them)."""
    torch.manual_seed(0)
    models = [RetrievalModel(S, build_feature_map("dpfp", d_key=6, nu=1), "delta").double()
              for S in (5, 9)]
    alone = [RetrievalModel(S, m.phi, "delta").double() for S, m in zip((5, 9), models)]
    for a, m in zip(alone, models):
        a.load_state_dict(m.state_dict())
    p = pack.Pack(models)
    batches = [RetrievalTask(S, 2 * S, S, True, i, torch.device("cpu")).train_batch(8)
               for i, S in enumerate((5, 9))]
    p.losses(batches).sum().backward()
    for i, (a, b) in enumerate(zip(alone, batches)):
        retrieval_loss(a(b.keys, b.values, b.query), b.target).mean().backward()
        for name in p.names:
            grad = p.params[name].grad[i]
            own = p._unpad(name, a, grad)
            torch.testing.assert_close(own, a.get_parameter(name).grad, rtol=1e-10, atol=1e-12)
            assert float(grad.abs().sum()) == pytest.approx(float(own.abs().sum()), abs=1e-12)


def _elu_pack(dtype=torch.float64):
    torch.manual_seed(0)
    models = [RetrievalModel(S, build_feature_map("elu", d_key=6), "sum").to(dtype) for S in (5, 9)]
    batches = [RetrievalTask(S, S, S, False, i, torch.device("cpu")).train_batch(8)
               for i, S in enumerate((5, 9))]
    return pack.Pack(models), batches


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_a_compiled_step_whose_gradients_differ_is_dropped_for_the_eager_one(capsys, dtype):
    """The first step compares the compiled step with the eager one: a step with the right
    losses but gradients off by 1% (float64: 1e-6) is reported in one line and replaced."""
    p, batches = _elu_pack(dtype)
    eager = [g.clone() for g in torch.autograd.grad(p.losses(batches).sum(), p.parameters())]
    off = 1e-2 if dtype == torch.float32 else 1e-6

    def wrong(*args):  # the eager losses, with each gradient scaled by 1 + off
        losses = p._forward(*args)
        return losses.detach() + (1 + off) * (losses - losses.detach())

    p.compiled = wrong
    losses = p.losses(batches)
    assert p.compiled is None and p.checked
    grads = torch.autograd.grad(losses.sum(), p.parameters())
    for g, e in zip(grads, eager):
        torch.testing.assert_close(g, e, rtol=0, atol=0)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].endswith("; training eagerly") and err[0].startswith(
        "warning: trainer.compile: the compiled step differs from the eager one (gradient of "
        f"{next(iter(p.params))}: max relative difference ")


def test_a_compiled_backward_that_fails_leaves_the_pack_eager(capsys):
    """The first-step check runs the compiled backward: its failure is a failed compilation."""
    p, batches = _elu_pack()

    class Failing(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            raise RuntimeError("backward compiler: unsupported op")

    p.compiled = lambda *args: Failing.apply(p._forward(*args))
    p.losses(batches).sum().backward()
    assert p.compiled is None
    assert capsys.readouterr().err == ("warning: trainer.compile: compilation failed (backward "
                                       "compiler: unsupported op); training eagerly\n")


def test_a_compiled_step_that_agrees_is_kept_and_checked_once_per_shape(capsys):
    """The check runs the compiled step's backward, which may free what it used (FAVOR+'s key
    scores do): the step then trains on a fresh compiled forward."""
    p, batches = _elu_pack()
    calls = []

    class Once(torch.autograd.Function):  # a backward that frees its state, as FAVOR+'s does
        @staticmethod
        def forward(ctx, x):
            ctx.freed = False
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            assert not ctx.freed, "a second backward through one graph"
            ctx.freed = True
            return grad

    def same(*args):
        calls.append(1)
        return Once.apply(p._forward(*args))

    p.compiled = same
    for _ in range(3):
        p.losses(batches).sum().backward()
    assert p.compiled is same and p.checked and len(calls) == 4  # the first step twice
    opt = torch.optim.Adam(p.parameters())
    p.drop([0], opt)  # a new shape is compared again
    assert not p.checked
    p.losses(batches[1:]).sum().backward()
    assert p.compiled is same and p.checked and len(calls) == 6
    assert capsys.readouterr().err == ""


def test_packs_keep_padding_within_a_quarter_of_the_work():
    keys = [20, 40, 60, 80, 100, 400, 420, 440, 460, 480, 500, 520, 540, 560, 580, 600]
    packs = packing.form(keys, lambda S: 8)
    assert sorted(i for p in packs for i in p) == list(range(len(keys)))
    for members in packs:
        sizes = [keys[i] for i in members]
        assert len(sizes) <= 8 and sizes == sorted(sizes, reverse=True)
        work = sum(map(packing.step_cost, sizes))
        assert 1 - work / (len(sizes) * packing.step_cost(max(sizes))) <= packing.PADDING_WASTE
    assert [keys[i] for i in packs[0]] == [600, 580, 560, 540, 520, 500, 480, 460]
    assert packing.form([50] * 20, lambda S: 8) == [list(range(8)), list(range(8, 16)),
                                                 list(range(16, 20))]
    assert packing.form(keys, lambda S: 1) == [[i] for i in sorted(range(len(keys)),
                                                                key=lambda i: -keys[i])]
    assert [len(p) for p in packing.form([20] * 4 + [300] * 4, lambda S: 1 if S > 100 else 8)] == \
        [1, 1, 1, 1, 4]


@pytest.mark.slow
def test_the_smoke_sweep_packed_and_alone_gives_the_same_runs(smoke_results, tmp_path):
    """The session's smoke sweep packs by default (trainer.pack=auto); with trainer.pack=1
    every run trains alone: same statuses and losses."""
    results = tmp_path / "results"
    res = sweep("smoke", smoke_args(results, "trainer.pack=1"), base_env(tmp_path))
    assert res.returncode == 0, res.stderr
    assert "a pack of" not in res.stdout and "a pack of 2" in smoke_results.result.stdout
    packed, alone = (
        {d.name: store.read_summary(d) for d in (r / "smoke" / "runs").iterdir()}
        for r in (smoke_results.results, results))
    assert packed.keys() == alone.keys() and len(alone) == 6
    for rid, s in alone.items():
        assert packed[rid]["status"] == s["status"] and packed[rid]["steps"] == s["steps"]
        if s["final_eval_loss"] is not None:
            assert packed[rid]["final_eval_loss"] == pytest.approx(s["final_eval_loss"], rel=1e-4)


@pytest.mark.slow  # torch.compile: trainer.compile=auto compiles on CUDA only
@pytest.mark.parametrize("rule", ["sum", "fwm", "favor", *sorted(FEATURE_MAPS)])
def test_compiled_and_eager_steps_agree(tmp_path, capsys, rule):
    """trainer.compile=true (torch.compile of the pack's step) against eager, float64, a mixed
    pack: compiled throughout (its first-step check passed) and the same curves within 1e-6,
    for every registered map (its conf defaults) and the fwm and FAVOR+ paths; on cuda where
    there is one (``scripts/gpu_check.sh``). fwm: its state (fwm.state, 16384 entries here) is
    left out of the compiled graph, so the step compiles in seconds, not never; so are FAVOR+'s
    key scores (Favor.key_scores, its ``eager``), with the redrawn projections in the graph."""
    point, member = {"sum": (["feature_map=dpfp", "n_keys=8"], (6, 2)),
                     "fwm": ([*CASES["fwm"], "n_keys=16"], (12, 2)),
                     "favor": ([*CASES["favor_redrawn"], "n_keys=8"], (6, 2))
                     }.get(rule, ([f"feature_map={rule}", "n_keys=8"], (6, 2)))
    if rule in FEATURE_MAPS and rule != "elu" and not torch.cuda.is_available():
        pytest.skip("every map on cuda (scripts/gpu_check.sh); on the CPU minutes each")
    point = [*point, "trainer.dtype=float64", "trainer.max_steps=100"]
    torch._dynamo.reset()  # each map compiled afresh: a second shape would compile dynamic
    eager = train(tmp_path / "eager", [*point, "trainer.compile=false"], members=[member])
    train(tmp_path / "compiled", [*point, "trainer.compile=true"], members=[member])
    assert "trainer.compile" not in capsys.readouterr().err  # compiled throughout, not eager
    for rid in eager:
        assert_same_curve(curve(tmp_path / "compiled", rid), curve(tmp_path / "eager", rid), 1e-6)


def test_compile_auto_is_for_cuda_and_bad_values_are_refused():
    assert pack.compiles("auto", torch.device("cuda")) and not pack.compiles("auto", torch.device("cpu"))
    assert pack.compiles("true", torch.device("cpu")) and not pack.compiles("false", torch.device("cuda"))
    most = packing.most_runs("auto", "cpu", batch_size=32, d_key=64, replacement=False)
    assert [most(s) for s in (20, 50, 100, 300, 600)] == [8, 5, 2, 1, 1]  # keys within 2 MB
    update = packing.most_runs("auto", "cpu", batch_size=32, d_key=64, replacement=True)
    assert update(50) == 2  # sequences of 2S
    assert packing.most_runs("auto", "cuda", 32, 64, False)(600) == packing.AUTO_SIZE["cuda"]
    assert packing.most_runs("3", "cpu", 32, 64, False)(600) == 3


def test_a_sweeps_packs_are_records_with_one_override_for_hydra():
    """The sweeper packs its checked points (typed n_keys, seed, settings) into Job records;
    the one string a job gets is Job.overrides, read back as the typed pack_members."""
    c = Config()
    c.trainer.pack = "3"
    points = [Point(("feature_map=elu", f"n_keys={n}", f"seed={s}"), n, s, c)
              for n in (20, 40, 60, 80) for s in (1, 2)]
    points.append(Point(("feature_map=dpfp", "n_keys=20"), 20, 1, c))
    found = jobs(points)
    assert [p.runs for p in found] == [3, 3, 2, 1]  # at most trainer.pack, largest first
    assert sorted(pt.overrides for p in found for pt in p.points) == \
        sorted(pt.overrides for pt in points)
    assert found[0].overrides() == ["feature_map=elu", "n_keys=80", "seed=1",
                                    "pack_members=[[80,2],[60,1]]"]
    assert found[-1].overrides() == ["feature_map=dpfp", "n_keys=20"]  # alone: no pack_members
    job = composed(*found[0].overrides())
    assert [tuple(m) for m in job.pack_members] == [(80, 2), (60, 1)]


def test_a_gpu_pack_is_sized_by_the_devices_memory(monkeypatch):
    """On a GPU trainer.pack=auto packed a fixed 32 runs; it fills GPU_FILL of the device's
    memory at the runs' estimates (at most GPU_MOST), so small runs pack more, large ones fewer."""
    import types

    c = Config()
    c.trainer.device = "cuda"
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: types.SimpleNamespace(total_memory=80 << 30))
    small = [Point(("feature_map=elu", "n_keys=20", f"seed={s}"), 20, s, c, 100 << 20, True)
             for s in range(1, 301)]
    large = [Point(("feature_map=elu", "n_keys=600", f"seed={s}"), 600, s, c, 10 << 30, True)
             for s in range(1, 11)]
    assert [j.runs for j in jobs(small)] == [packing.GPU_MOST, 300 - packing.GPU_MOST]
    assert [j.runs for j in jobs(large)] == [6, 4]  # 0.8 x 80 GiB / 10 GiB = 6
    assert packing.most_runs("auto", "cuda", 32, 64, False, lambda S: 1 << 30, 16 << 30)(600) == 12


@pytest.mark.slow
def test_each_run_of_a_pack_logs_its_own_wandb_run(tmp_path):
    """Offline wandb: the runs of one pack are concurrent wandb runs of one process, each with
    its own files and its own summary."""
    env = {**base_env(tmp_path), "WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path)}
    res = run_cmd([PYTHON, "-m", "kernelzoo.train", "feature_map=elu", "n_keys=6", "d_key=8",
                   "trainer=smoke", f"results_dir={tmp_path}", "pack_members=[[4,1],[6,2]]"],
                  env, 300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("done ") == 3 and "a pack of 3" in res.stdout
    runs = sorted((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 3
    summaries = [store.read_summary(d) for d in (tmp_path / "adhoc" / "runs").iterdir()]
    assert sorted((s["n_keys"], s["seed"]) for s in summaries) == [(4, 1), (6, 1), (6, 2)]
