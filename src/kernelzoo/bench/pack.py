"""The ``packed`` rows of ``make bench``: run-steps per second of the training engine.

For ELU+1 and DPFP-2 (d_key 64, batch 32, Setting 1) at n_keys 20, 100, 300 and 600, a pack of
K = 1, 8 or 32 runs of one n_keys (``pack.Pack``, the training loop's step: K batches drawn,
forward, the summed loss's backward, fused Adam), eager and compiled (``torch.compile``,
``trainer.compile=true``), against today's baseline: one run's eager step through
``RetrievalModel`` (the step ``bench.py``'s train_step rows time). ``baseline_ms`` and
``kernelzoo_ms`` are milliseconds per run-step (a pack's step time / K); ``ratio`` is the
throughput ratio. Compilation happens in the warm-up, outside the timing; its cost is
reported in the notes of bench.md (``compile_s``).
"""

from __future__ import annotations

import time

import torch

from kernelzoo.maps.catalog import build_feature_map
from kernelzoo.core.model import RetrievalModel, retrieval_loss
from kernelzoo.training.pack import Pack
from kernelzoo.training.packing import most_runs
from kernelzoo.core.task import RetrievalTask

MAPS = {"linear": ("elu", {}), "dpfp-2": ("dpfp", {"nu": 2})}
D_KEY, BATCH = 64, 32


def auto_pack(n_keys: int) -> int:
    """The pack size trainer.pack=auto chooses on the CPU for these rows (``packing.most_runs``)."""
    return most_runs("auto", "cpu", BATCH, D_KEY, False)(n_keys)


def cases(quick: bool = False) -> list[dict]:
    """Per map and n_keys: auto's choice (eager), and K = 1, 8, 32 eager and compiled."""
    if quick:
        return [{"case": "packed", "feature_map": "linear", "n_keys": 20, "pack": k,
                 "compile": False} for k in (1, 8)]
    rows = []
    for fm in MAPS:
        for s in (20, 100, 300, 600):
            for k, c in dict.fromkeys([(auto_pack(s), False), (1, True), (8, False), (8, True),
                                       (32, False), (32, True)]):
                rows.append({"case": "packed", "feature_map": fm, "n_keys": s, "pack": k,
                             "compile": c})
    return rows


def _models(row: dict, k: int, device) -> tuple[list[RetrievalModel], list[RetrievalTask]]:
    name, params = MAPS[row["feature_map"]]
    S, models, tasks = row["n_keys"], [], []
    for seed in range(k):
        torch.manual_seed(seed)
        models.append(RetrievalModel(S, build_feature_map(name, d_key=D_KEY, **params)).to(device))
        tasks.append(RetrievalTask(S, S, S, False, seed, device))
    return models, tasks


def setup(row: dict, side: str, device: torch.device):
    """One step of the side: ``baseline`` one run alone, eager (per run-step: K = 1);
    ``kernelzoo`` the pack of the row (``pack`` runs, compiled or not)."""
    k = 1 if side == "baseline" else row["pack"]
    models, tasks = _models(row, k, device)
    if side == "baseline":
        (model,), (task,) = models, tasks
        opt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)

        def step():
            b = task.train_batch(BATCH)
            loss = retrieval_loss(model(b.keys, b.values, b.query), b.target).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        return step
    pack = Pack(models)
    if row["compile"]:
        pack.compile()
    opt = torch.optim.Adam(pack.parameters(), lr=1e-3, fused=True)

    def packed_step():
        losses = pack.losses([t.train_batch(BATCH) for t in tasks])
        opt.zero_grad(set_to_none=True)
        losses.sum().backward()
        opt.step()
    return packed_step


def run_row(row: dict, device, clock: str, best_ms, budget_s: float) -> dict:
    """A bench.csv row of case ``packed`` (bench_report.COLUMNS), per run-step."""
    fns = {side: setup(row, side, device) for side in ("baseline", "kernelzoo")}
    start = time.perf_counter()
    fns["kernelzoo"]()  # compiles (when asked) outside the timing
    compile_s = time.perf_counter() - start
    ms = best_ms(fns, device, clock, budget_s)
    name, params = MAPS[row["feature_map"]]
    d_dot = build_feature_map(name, d_key=D_KEY, **params).d_dot
    per_run = ms["kernelzoo"] / row["pack"]
    return {**row, "d_dot": d_dot, "baseline_ms": ms["baseline"], "kernelzoo_ms": per_run,
            "ratio": ms["baseline"] / per_run, "baseline_peak_mb": float("nan"),
            "kernelzoo_peak_mb": float("nan"), "floor_ms": float("nan"),
            "compile_s": compile_s if row["compile"] else float("nan")}


def targets(rows: list[dict]) -> list[str]:
    """The packing targets: >= 3x run-throughput at n_keys 20 and 100, >= 1.5x at
    n_keys >= 300, for the engine as ``trainer.pack=auto``/``trainer.compile=auto`` choose on
    this device (the CPU: ``auto_pack``, eager) and for the best lever setting measured."""
    packed = [r for r in rows if r["case"] == "packed"]
    if not packed:
        return []
    out = []
    for s in sorted({r["n_keys"] for r in packed}):
        need = 3 if s <= 100 else 1.5
        at = [r for r in packed if r["n_keys"] == s]
        auto = [r for r in at if r["pack"] == auto_pack(s) and not r["compile"]]
        best = {fm: max((r for r in at if r["feature_map"] == fm), key=lambda r: r["ratio"])
                for fm in sorted({r["feature_map"] for r in at})}
        if auto:
            low = min(auto, key=lambda r: r["ratio"])
            out.append(f"packed engine as auto chooses (pack {auto_pack(s)}, eager) at "
                       f"n_keys {s} >= {need}x: {'met' if low['ratio'] >= need else 'NOT met'} "
                       f"(lowest {low['ratio']:.1f}x, {low['feature_map']})")
        out.append(f"best lever setting at n_keys {s}: " + ", ".join(
            f"{fm} {r['ratio']:.1f}x (pack {r['pack']}{', compiled' if r['compile'] else ''})"
            for fm, r in best.items()))
    alone = [r for r in packed if r["compile"] and r["pack"] == 1]
    if alone:
        out.append("one run compiled (pack 1) against eager, n_keys "
                   f"{min(r['n_keys'] for r in alone)}-{max(r['n_keys'] for r in alone)}: "
                   + _ranges(alone, "ratio", "{:.1f}-{:.1f}x"))
    compiled = [r for r in packed if r["compile"]]
    if compiled:
        out.append("compilation (torch.compile, first step of a new shape): "
                   + _ranges(compiled, "compile_s", "{:.0f}-{:.0f} s") + " per shape"
                   + (f"; {_ranges(alone, 'compile_s', '{:.0f}-{:.0f} s')} for one run" if alone else ""))
    return out


def _ranges(rows: list[dict], key: str, fmt: str) -> str:
    """Each feature map's lowest and highest ``key`` over rows, formatted with fmt."""
    maps = sorted({r["feature_map"] for r in rows})
    return ", ".join(f"{fm} " + fmt.format(min(r[key] for r in rows if r["feature_map"] == fm),
                                           max(r[key] for r in rows if r["feature_map"] == fm))
                     for fm in maps)
