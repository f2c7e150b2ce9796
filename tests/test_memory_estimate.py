"""The memory estimate (``footprint.footprint``) and the check made with it (``check_memory``).

The fast tests hold the count to plain counts of what the code holds, on tiny runs; the slow one
trains the quick matrix of ``python -m kernelzoo.bench --estimate`` (maps x update rules x batch
sizes, and packs; about two minutes) and holds the estimate to within 25% above every measured
peak.
"""

import dataclasses

import pytest
import torch

from kernelzoo.bench import estimate, report as bench_report
from kernelzoo.training import devices
from kernelzoo.maps import base as feature_maps
from kernelzoo.maps.catalog import build_feature_map
from kernelzoo.config import MemoryConf, TaskConf, TrainerConf, UsageError
from kernelzoo.training.footprint import MARGIN, footprint, map_costs
from kernelzoo.core.model import RetrievalModel
from kernelzoo.training.pack import Pack
from kernelzoo.core.task import RetrievalTask

NORMALISATION = {"sum": "attention", "delta": "sum", "fwm": "none"}
CPU = torch.device("cpu")


def settings(rule, **trainer):
    return MemoryConf(update_rule=rule, normalisation=NORMALISATION[rule],
                      chunk_size=16 if rule == "fwm" else 64), TrainerConf(**trainer)


def trained_pack(phi, rule, n_keys, batch_size=4):
    """A pack of one run after one step, as ``runner.fit`` holds it: model, pack, optimiser."""
    torch.manual_seed(0)
    mem, _ = settings(rule)
    model = RetrievalModel(n_keys, phi, rule, mem.normalisation, chunk_size=mem.chunk_size)
    pack = Pack([model])
    opt = torch.optim.Adam(pack.parameters(), lr=1e-3, fused=True)
    task = RetrievalTask(n_keys, n_keys, n_keys, False, 0, CPU)
    pack.losses([task.train_batch(batch_size)]).sum().backward()
    opt.step()
    return model, pack, opt


def plain_bytes(tensors) -> int:
    """Bytes of the distinct storages among ``tensors``."""
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                for t in tensors if t is not None and t.dim()}
    return sum(storages.values())


@pytest.mark.parametrize("rule", ["sum", "delta", "fwm"])
@pytest.mark.parametrize("name, params", [("elu", {}), ("hedgehog", {})])
def test_the_parameters_are_what_a_run_holds_between_steps(rule, name, params):
    """Model, the pack's stacked copy, gradients and Adam's two moments: the plain count."""
    phi = build_feature_map(name, d_key=8, **params)
    model, pack, opt = trained_pack(phi, rule, n_keys=12)
    held = [*model.parameters(), *model.buffers(), *pack.parameters(),
            *(p.grad for p in pack.parameters()),
            *(v for state in opt.state.values() for k, v in state.items() if k != "step")]
    mem, tr = settings(rule)
    assert footprint(phi, mem, tr, [(12, 12, 12)])["parameters"] == plain_bytes(held)


@pytest.mark.parametrize("rule", ["sum", "delta"])
def test_a_checkpoint_adds_the_copies_of_adam_state_it_takes_out(rule):
    """``Pack.adam_state`` unpads each moment (a copy) and clones it: twice what it returns."""
    phi = build_feature_map("elu", d_key=8)
    _, pack, opt = trained_pack(phi, rule, n_keys=12)
    taken = plain_bytes(t for state in pack.adam_state(0, opt).values() for t in state.values())
    mem, tr = settings(rule)
    parts = footprint(phi, mem, tr, [(12, 12, 12)])
    assert parts["checkpoint"] - parts["parameters"] == round(2 * taken * (1 + MARGIN))
    no_checkpoints = footprint(phi, mem, dataclasses.replace(tr, checkpoint_minutes=None),
                               [(12, 12, 12)])
    assert no_checkpoints["checkpoint"] == 0


def test_the_training_step_of_a_map_that_keeps_nothing_peaks_at_the_gathered_keys():
    """identity with the sum rule keeps only its keys (batched_dot's): the step peaks where k is
    made, two (B, L, d_key) gathers and their sum, beside the int64 symbols and indices (the
    batches, their stacked copies, the two gathers' indices)."""
    phi = build_feature_map("identity", d_key=64)
    mem, tr = settings("sum", batch_size=512)
    parts = footprint(phi, mem, tr, [(50, 50, 50)])
    rows = 512 * 50
    counted = 3 * rows * 64 * 4 + 6 * 8 * rows
    assert parts["training step"] == round(parts["parameters"] + counted * (1 + MARGIN))


@pytest.mark.parametrize("path, name, peak, kept", [
    ("features", "identity", 32, 0),  # its output is its input
    ("features", "elu", 3 * 32, 0),   # input, exp(min(x, 0)), max(x, 0); keeps its output
    ("scores", "identity", 32 + 1, 32),  # the keys and their score; batched_dot keeps the keys
    ("scores", "elu", 3 * 32, 32),    # as its features; keeps phi(k), not k
])
def test_a_map_is_measured_per_key_row(path, name, peak, kept):
    """map_costs per key row (d_key 32, float32 numbers) against the plain count."""
    phi = build_feature_map(name, d_key=32)
    cost = map_costs(phi, path, True, torch.float32, sliced=True)
    assert cost.peak[0] == pytest.approx(peak * 4)
    assert cost.kept[0] == pytest.approx(kept * 4)
    assert cost.slice == 0 and cost.width == 0


def test_a_map_that_slices_its_batch_is_measured_per_slice():
    """DPFP's scores (one query) run batch_slices: what a slice makes is bounded by the slice;
    per key row its backward keeps the keys alone."""
    phi = build_feature_map("dpfp", d_key=32, nu=2)
    cost = map_costs(phi, "scores", True, torch.float32, sliced=True)
    assert cost.kept[0] == pytest.approx(32 * 4)
    assert cost.width == 2 * 32 and cost.slice > 0
    rows_of_a_slice = cost.slice_rows(10**6, 100)
    assert rows_of_a_slice == 100 * (feature_maps.SLICE_ELEMENTS // (100 * 64))


@pytest.mark.parametrize("name, params", [("hedgehog", {}), ("favor", {"m": 8}),
                                          ("t2r", {"m": 16})])
def test_measuring_a_map_leaves_it_and_the_random_streams_as_they_were(name, params):
    phi = build_feature_map(name, d_key=8, **params)
    tensors = {**dict(phi.named_parameters()), **dict(phi.named_buffers())}
    kept = {k: v.clone() for k, v in tensors.items()}
    extra, rng = phi.get_extra_state() if name == "favor" else None, torch.get_rng_state()
    for path in ("scores", "features"):
        map_costs(phi, path, True, torch.float64, sliced=True, normalise=path == "scores")
    assert all(p.grad is None for p in phi.parameters())
    assert all(torch.equal(kept[k], v) for k, v in tensors.items())
    assert torch.equal(rng, torch.get_rng_state())
    if extra is not None:
        assert phi.get_extra_state()["training_calls"] == extra["training_calls"]


@pytest.mark.parametrize("rule", ["sum", "delta", "fwm"])
@pytest.mark.parametrize("name, params", [("elu", {}), ("dpfp", {"nu": 2}), ("favor", {"m": 32})])
def test_the_estimate_grows_with_batch_size_keys_and_runs(rule, name, params):
    """What check_memory's bisections rely on."""
    phi = build_feature_map(name, d_key=16, **params)
    mem, tr = settings(rule)

    def peak(batch_size, runs):
        return max(footprint(phi, mem, dataclasses.replace(tr, batch_size=batch_size),
                             runs).values())

    batches = [peak(b, [(50, 50, 50)]) for b in (1, 2, 5, 32, 100, 1000)]
    keys = [peak(32, [(n, n, n)]) for n in (2, 5, 20, 64, 150, 400)]
    runs = [peak(32, [(50, 50, 50)] * r) for r in (1, 2, 3, 8)]
    assert batches == sorted(batches) and keys == sorted(keys) and runs == sorted(runs)


def refused(rule, batch_size, runs, memory, monkeypatch) -> str:
    monkeypatch.setattr(devices, "device_memory", lambda device: memory)
    phi = build_feature_map("dpfp", d_key=64)
    mem, tr = settings(rule, batch_size=batch_size)
    with pytest.raises(UsageError) as err:
        devices.check_memory(phi, mem, tr, TaskConf(), CPU, runs)
    return str(err.value)


def test_a_refused_run_names_itself_its_estimate_the_memory_and_what_fits(monkeypatch):
    line = refused("delta", 1024, [(200, 200, 200)], 256 * 2**20, monkeypatch)
    assert "\n" not in line and line.startswith("n_keys=200 (feature_map=dpfp of d_dot 128")
    assert "memory=delta, trainer.batch_size=1024" in line and "needs about 1.1" in line
    assert "in its training step" in line and "more than the 256 MiB of cpu" in line
    assert "valid: trainer.batch_size <= " in line and " or n_keys <= " in line
    fits = int(line.split("trainer.batch_size <= ")[1].split()[0])
    phi = build_feature_map("dpfp", d_key=64)
    for batch_size, ok in ((fits, True), (fits + 1, False)):
        mem, tr = settings("delta", batch_size=batch_size)
        assert (max(footprint(phi, mem, tr, [(200, 200, 200)]).values()) <= 256 * 2**20) == ok


def test_a_pack_is_checked_as_a_whole(monkeypatch):
    """Each run fits alone, four together do not: the smaller pack that fits is named."""
    phi = build_feature_map("dpfp", d_key=64)
    mem, tr = settings("fwm", batch_size=64)
    one = max(footprint(phi, mem, tr, [(100, 100, 100)]).values())
    monkeypatch.setattr(devices, "device_memory", lambda device: int(2.5 * one))
    devices.check_memory(phi, mem, tr, TaskConf(), CPU, [(100, 100, 100)])
    line = refused("fwm", 64, [(100, 100, 100)] * 4, int(2.5 * one), monkeypatch)
    assert line.startswith("a pack of 4 runs (n_keys 100, 100, 100, 100)")
    assert "valid: trainer.pack <= 2 or trainer.batch_size <= " in line


def test_the_trainer_checks_a_pack_before_it_trains(tmp_path, monkeypatch):
    """job.run plans each run alone (plan), then the pack the sweeper formed as a whole."""
    from hydra import compose, initialize_config_dir

    from kernelzoo.config import CONF
    from kernelzoo.training.job import run
    from kernelzoo.training.plan import plan

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=[
            "logger=none", "trainer=smoke", "trainer.progress=false", "d_key=8", "n_keys=40",
            "pack_members=[[40,2],[40,3]]", f"results_dir={tmp_path}"])
    p = plan(cfg)
    one = max(footprint(p.phi, p.memory, p.trainer, [(40, 40, 40)]).values())
    monkeypatch.setattr(devices, "device_memory", lambda device: int(1.5 * one))
    with pytest.raises(UsageError, match=r"^a pack of 3 runs .* valid: trainer.pack <= 1"):
        run(cfg, echo=lambda line: None)


@pytest.mark.slow
def test_the_estimate_covers_measured_peaks_within_25_percent():
    """The quick matrix of ``bench --estimate`` (elu, dpfp-1, favor-64 x sum, delta, fwm x
    batch 32, 256 at 64 keys; packs of 64, 58 and 51 keys of elu and dpfp-1 x the rules at batch
    32), each point trained through the trainer under torch's profiler:
    peak <= estimate <= 1.25 peak."""
    low, high = bench_report.ESTIMATE_BAND
    for point in estimate.estimate_points(quick=True):
        row = estimate.estimate_row(point)
        assert row["status"] != "diverged", row
        assert low <= row["ratio"] <= high, row
