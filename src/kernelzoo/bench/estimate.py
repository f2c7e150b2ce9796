"""The memory estimate measured: ``python -m kernelzoo.bench --estimate``.

It measures how close ``footprint.footprint``, the memory estimate a run is
checked against before it trains, comes to what runs hold: every point of ``ESTIMATE_MAPS`` x
update rules x ``ESTIMATE_BATCHES`` at ``ESTIMATE_KEYS`` keys (``--quick``: ``QUICK_ESTIMATE``)
is trained briefly (``estimate_row``), and a few packs of three runs, and its peak compared
with the estimate; rows in ``estimate.csv`` and ``estimate.md`` (quick: ``estimate_quick.*``),
written after each point: a stopped run goes on where it stopped; ``--rebuild`` recomputes the
estimates of the measured rows.
"""

from __future__ import annotations

import gc
import tempfile
import time
from pathlib import Path

import torch

from kernelzoo.bench import report as bench_report
from kernelzoo.config import CONF
from kernelzoo.core import rules
from kernelzoo.training.footprint import footprint

ESTIMATE_KEYS, ESTIMATE_BATCHES = 200, (32, 256, 1024)
ESTIMATE_MAPS = {  # label -> overrides: the published maps as the figures ran them, and the
    # others at the zoo's d_dot 64 (nearest reachable for the quadratic maps), d_key 16 where
    # the map keeps it
    "softmax": ["feature_map=softmax"],
    "elu": ["feature_map=elu"],
    "dpfp-1": ["feature_map=dpfp", "feature_map.nu=1"],
    "dpfp-3": ["feature_map=dpfp", "feature_map.nu=3"],
    "favor-64": ["feature_map=favor", "feature_map.m=64"],
    "favor_fixed-64": ["feature_map=favor_fixed", "feature_map.m=64"],
    **{f"{name}-{d_dot}": [f"feature_map={name}", "d_key=16", f"d_dot={d_dot}"]
       for name, d_dot in (("trig", 128), ("identity", 64), ("squared_relu", 64),
                           ("hedgehog", 64), ("t2r", 64), ("cosformer", 64), ("taylor", 66), ("rebased", 65),
                           ("polysketch", 66))},
}
QUICK_ESTIMATE = {"maps": ("elu", "dpfp-1", "favor-64"), "batches": (32, 256), "n_keys": 64}
# packs of three runs (n_keys S, 0.9 S, 0.8 S) of these maps at these batch sizes (quick: the first)
PACKED = {"maps": ("elu", "dpfp-1"), "fractions": (0.9, 0.8), "batches": (32, 256)}
RULES = tuple(rules.RULES)
SHORT_RUN = ["logger=none", "trainer.progress=false", "trainer.max_steps=4",
             "trainer.eval_every=2", "trainer.checkpoint_minutes=0"]  # every phase, twice


def estimate_points(quick: bool = False) -> list[dict]:
    """The points of --estimate: a map label, an update rule, a batch size, n_keys and the
    n_keys of the other runs of its pack ("pack", () alone); softmax only with the sum rule (it
    has no state). Then packs of three (PACKED: n_keys S, 0.9 S and 0.8 S, as the sweeper packs
    them) of a few maps. Keys get key_eps 1e-6, so that under the sum normalisation (the delta
    rules') a key of all-zero features (relu-like maps) is no 0 / 0 in the first steps (it
    changes no tensor's size)."""
    maps = QUICK_ESTIMATE["maps"] if quick else ESTIMATE_MAPS
    batches = QUICK_ESTIMATE["batches"] if quick else ESTIMATE_BATCHES
    n_keys = QUICK_ESTIMATE["n_keys"] if quick else ESTIMATE_KEYS
    others = tuple(round(f * n_keys) for f in PACKED["fractions"])
    packed = PACKED["batches"][:1] if quick else PACKED["batches"]
    return [{"feature_map": m, "update_rule": rule, "batch_size": b, "n_keys": n_keys,
             "pack": pack}
            for pack, chosen, sizes in (((), maps, batches), (others, PACKED["maps"], packed))
            for m in chosen for rule in RULES for b in sizes
            if not (m == "softmax" and not rules.RULES[rule].by_scores)]


def point_overrides(point: dict, n_keys: int | None = None) -> list[str]:
    """The command-line overrides of an --estimate point (with ``n_keys``: of that run of its
    pack, alone)."""
    rule, pack = point["update_rule"], point["pack"] if n_keys is None else ()
    members = ",".join(f"[{n},{i + 2}]" for i, n in enumerate(pack))
    return [*ESTIMATE_MAPS[point["feature_map"]], f"memory={rule}",
            f"n_keys={n_keys or point['n_keys']}", f"trainer.batch_size={point['batch_size']}",
            "memory.key_eps=1e-6",
            *([f"pack_members=[{members}]", f"trainer.pack={1 + len(pack)}"] if pack else [])]


def _composed(overrides: list[str]):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=overrides)


def estimated(point: dict, results_dir: str = "results/local") -> dict:
    """footprint's estimate of a point (its phases, bytes), as ``training.plan`` plans it."""
    from kernelzoo.training.plan import plan

    runs = []
    for n_keys in (point["n_keys"], *point["pack"]):
        p = plan(_composed([*SHORT_RUN, f"results_dir={results_dir}",
                            *point_overrides(point, n_keys)]))
        runs.append((n_keys, p.seq_len, p.eval_seq_len))
    return footprint(p.phi, p.memory, p.trainer, runs, p.device.type)


def estimate_row(point: dict) -> dict:
    """A point trained briefly on the CPU through the trainer (``job.run``: 4 steps, an
    evaluation and a checkpoint every 2, the final diagnostics) under torch.profiler with
    profile_memory, one thread: ``peak_mb``, the most bytes its tensors held at once (the CPU
    allocator's events summed in order: every tensor, deterministic), beside ``estimate_mb``
    (``estimated``) and ``ratio`` = peak / estimate; ``status`` is the run's (diverged if a
    run of its pack diverged: it then skips its evaluations)."""
    from torch.profiler import ProfilerActivity, profile

    from kernelzoo.training.job import run

    with tempfile.TemporaryDirectory() as tmp:
        cfg = _composed([*SHORT_RUN, f"results_dir={tmp}", "trainer.threads=1",
                         *point_overrides(point)])
        gc.collect()
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            summaries = [summary for _, summary in run(cfg, echo=lambda line: None)]
        events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                        if e.name() == "[memory]")
        estimate = estimated(point, tmp)
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    statuses = {s["status"] for s in summaries}
    status = "diverged" if "diverged" in statuses else "/".join(sorted(statuses))
    return compared({**point, "status": status, "peak_mb": peak / 2**20}, estimate)


def compared(row: dict, estimate: dict) -> dict:
    """``row`` (a measured point) with the estimate it is held to: the largest phase's, or, for
    a run that diverged (its first evaluation stops it: no evaluation, diagnostics or
    checkpoint ran), its training step's."""
    phase = ("training step" if row["status"] == "diverged" else
             max((k for k in estimate if k != "parameters"), key=estimate.get))
    return {**row, "estimate_mb": estimate[phase] / 2**20,
            "ratio": row["peak_mb"] * 2**20 / estimate[phase], "estimated_phase": phase}


def run_estimates(quick: bool, out: Path, rebuild: bool = False) -> None:
    """--estimate: measure the points not yet in ``estimate[_quick].csv`` in ``out`` (a long
    run that stopped goes on; remove the file to measure all anew), writing it and ``.md``
    after each; or, rebuilding, recompute the estimates of the measured rows. Rows of points
    the matrix no longer has are dropped."""
    stem = out / ("estimate_quick" if quick else "estimate")
    start = time.perf_counter()
    command = "python -m kernelzoo.bench --estimate" + (" --quick" if quick else "")
    csv_path = stem.with_suffix(".csv")
    points = {bench_report.estimate_key(p) for p in estimate_points(quick)}
    rows = [r for r in (bench_report.read_estimate_csv(csv_path) if csv_path.exists() else [])
            if bench_report.estimate_key(r) in points]  # of points the matrix still has
    if rebuild:
        rows = [compared(r, estimated(r)) for r in rows]
    else:
        torch.set_num_threads(1)
        measured = {bench_report.estimate_key(r) for r in rows}
        for point in estimate_points(quick):
            if bench_report.estimate_key(point) in measured:
                continue
            rows.append(estimate_row(point))
            print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                           for k, v in rows[-1].items()), flush=True)
            bench_report.write_estimate(rows, stem, command, time.perf_counter() - start, False)
    bench_report.write_estimate(rows, stem, command, time.perf_counter() - start, rebuild)
    print(f"wrote {stem}.csv and {stem}.md")
