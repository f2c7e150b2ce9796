"""The report of ``python -m kernelzoo.bench``: its measured rows written to ``bench.csv`` and
``bench.md``, and the issue's targets judged against them (``bench.py`` measures the rows,
``bench_pack.py`` the packed ones).
"""

from __future__ import annotations

import csv
import io
import math
import os
import sys
from pathlib import Path

import torch

from kernelzoo.bench import pack as bench_pack
from kernelzoo.records import files, history, store
from kernelzoo.config.words import plural

SWEEP_SECONDS = {"quick": 45, "figure2": 75 * 60}  # the wall-time targets of whole sweeps
COLUMNS = ["case", "feature_map", "n_keys", "d_dot", "baseline_ms", "kernelzoo_ms", "ratio",
           "baseline_peak_mb", "kernelzoo_peak_mb", "floor_ms", "pack", "compile", "compile_s"]


def write_csv(rows: list[dict], path: Path, columns=COLUMNS) -> None:
    """``rows`` as CSV with ``columns`` (bench.csv's by default), floats to 4 digits."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns)
    writer.writeheader()
    for r in rows:
        writer.writerow({k: _cell(r.get(k, ""), "{:.4g}") for k in columns})
    files.atomic_write_text(path, out.getvalue())


def _cell(value, fmt: str) -> str:
    """A float formatted with fmt, nan as an empty cell, anything else as str."""
    if isinstance(value, float):
        return "" if math.isnan(value) else fmt.format(value)
    return str(value)


def read_csv(path: Path) -> list[dict]:
    """The rows of a ``bench.csv`` as ``write_csv`` wrote them (numbers back as numbers, empty
    cells as nan), to rebuild ``bench.md`` without measuring again."""
    def number(text):
        return float(text) if text else float("nan")
    rows = []
    for r in csv.DictReader(io.StringIO(files.read_text(path), newline="")):
        row = {k: number(r[k]) for k in COLUMNS if k.endswith(("_ms", "_mb", "_s")) or k == "ratio"}
        row.update(case=r["case"], feature_map=r["feature_map"], n_keys=int(r["n_keys"]),
                   d_dot=r["d_dot"] if r["d_dot"] == "inf" else int(float(r["d_dot"])),
                   pack=int(r["pack"]), compile=r["compile"] == "True")
        rows.append(row)
    return rows


def _span(values, fmt: str) -> str:
    """'lo-hi' of values in fmt, or one value when they agree to the shown digits."""
    lo, hi = fmt.format(min(values)), fmt.format(max(values))
    return lo if lo == hi else f"{lo}-{hi}"


def notes(rows: list[dict], eval_flop_ratio=None) -> list[str]:
    """What the table's numbers mean, each quoted from ``rows`` (eval_flop_ratio: as in
    ``targets``; without it the evaluation note is left out)."""
    from kernelzoo.core.rules import fwm
    from kernelzoo.training import packing

    train = [r for r in rows if r["case"] == "train_step"]
    out = ["Both sides use fused Adam (`ADAM`), as the training loop does on the CPU, so the "
           "kernelzoo column is the step a run takes."]
    if train:
        small = min(r["n_keys"] for r in train)
        at = [r for r in train if r["n_keys"] == small]
        out.append(f"Small n_keys: both sides are bound by per-op framework overhead (the n_keys "
                   f"{small} rows: {_span([r[k] for r in at for k in ('baseline_ms', 'kernelzoo_ms')], '{:.1f}')}"
                   f" ms for about a hundred small ops forward and backward), so the ratios there "
                   f"are {_span([r['ratio'] for r in at], '{:.1f}')}x; no eager-mode rewrite "
                   "removes that floor.")
        lowest = sorted({s for s in {r["n_keys"] for r in train}
                         if min((r for r in train if r["n_keys"] == s),
                                key=lambda r: r["ratio"])["feature_map"].startswith("favor")})
        if lowest:
            out.append("FAVOR+: both sides compute the same B x L x 2m features (projection, exp); "
                       "that shared work caps the ratio where the baseline's extra work (one-hot "
                       "projection, state) is small: a FAVOR+ row has the lowest train-step ratio "
                       f"at n_keys {', '.join(map(str, lowest))}.")
    evals = [r for r in rows if r["case"] == "eval"]
    if evals and eval_flop_ratio is not None:
        spans = [f"{_span([eval_flop_ratio(r, r['d_dot']) for r in evals if r['n_keys'] == s], '{:.0f}')}x"
                 f" at n_keys {s}" for s in sorted({r["n_keys"] for r in evals})]
        out.append("Evaluation: the replicated baseline does this many times the multiply-adds "
                   f"of the one pass (listed above): {', '.join(spans)}; the one pass also pays "
                   "the framework floor, so no ratio reaches those bounds.")
    out.append("floor/kernelzoo: the fraction of the counted floor (`floor_ms`) reached; "
               "elementwise work and overhead are not in the floor, so small rows sit far below "
               "100%.")
    if any(r["case"] == "packed" for r in rows):
        runs = packing.most_runs("auto", "cpu", 32, 64, False)
        alone = next(s for s in range(1, 10_000) if runs(s) == 1)
        out.append("Rows with case `packed` (`bench_pack.py`): per run-step, a pack of `pack` runs "
                   "of one n_keys (eager, or compiled by torch.compile: `compile`, with its "
                   "first-step cost `compile_s`) against one run's eager step. On the CPU a pack "
                   f"pays only while its keys fit in cache (`packing.most_runs`: {runs(20)} runs at "
                   f"n_keys 20, {runs(100)} at 100, none from {alone} at d_key 64); beyond that "
                   "every elementwise pass goes to memory. Compilation fuses those passes, but "
                   "its cost grows with the pack, is paid per new shape in every worker, and what "
                   "it gains differs between CPUs, which is why `trainer.compile=auto` compiles "
                   "on CUDA only.")
    if any(r["case"].startswith("fwm") for r in rows):
        out.append("Rows `fwm` and `fwm_read` (DPFP-1, Setting 2): the literal loop updates the "
                   "whole (B, d_v, D) state at every write and autograd keeps each one; "
                   f"`fwm.state` (what `memory.read` uses from {fwm.CHUNKED_FROM} state "
                   "entries) forms the state once per chunk of `chunk_size` writes "
                   "(`conf/memory/fwm.yaml`) and loops over (B, d_v) vectors in between, its "
                   "backward written out. A write is a sequential step of small operations, so "
                   "framework overhead sets the time.")
    large = [r["floor_ms"] / r["kernelzoo_ms"] for r in train if r["n_keys"] >= 300
             and not math.isnan(r["floor_ms"])]
    out.append("Sweep wall times are read from each sweep's `sweep.json` (written by the sweeper, "
               "summed over its invocations; `--sweeps` names the results directory). Most of "
               "figure2's steps are in points above capacity that train until the plateau rule "
               "stops them"
               + (f"; at n_keys >= 300 the train step reaches {_span(large, '{:.0%}')} of the "
                  "counted floor here, so more cores or a GPU (`scripts/gpu_check.sh`) is the way "
                  "to a shorter sweep." if large else "."))
    return out


def _header(device, clock, rates, seconds: float) -> list[str]:
    cores = len(os.sched_getaffinity(0))
    gpu = f", GPU {torch.cuda.get_device_name(device)}" if device.type == "cuda" else ""
    return [
        "# kernelzoo benchmark", "",
        f"- machine: {history.cpu_model()}, {cores} cores{gpu}; torch {torch.__version__}, "
        f"{plural(torch.get_num_threads(), 'thread')}, device {device}",
        f"- command: `{' '.join(['python -m kernelzoo.bench'] + sys.argv[1:])}` ({seconds:.0f} s)",
        f"- clock: {'thread CPU time' if clock == 'cpu' else 'wall time'}, best of repeats "
        f"after a warm-up; measured matmul {rates[0]:.0f} GFLOP/s, bandwidth {rates[1]:.1f} GB/s; "
        "denormal floats flushed to 0 as training flushes them (`trainer.flush_denormal=auto`): "
        "in the rows of sum-rule training steps (train_step, packed) and the fwm rows",
        "- peak memory: rise of the peak RSS over one unit of work (a step, an evaluation) in a "
        "fresh subprocess (cuda: max_memory_allocated, in process); empty where not measured", "",
    ]


def write_markdown(rows, path: Path, device, clock, rates, seconds: float,
                   target_lines: list[str], eval_flop_ratio=None) -> None:
    """bench.md: the machine, the command, the table with the fraction of the floor reached,
    target_lines (``targets`` and ``sweep_targets``) and the notes."""
    _write(rows, path, _header(device, clock, rates, seconds), target_lines, eval_flop_ratio)


def rewrite_markdown(rows, path: Path, target_lines: list[str], eval_flop_ratio=None) -> None:
    """bench.md again from ``rows`` (``read_csv``), keeping the machine lines of the bench.md at
    ``path``: the table, targets and notes follow the CSV without measuring again."""
    old = files.read_text(path).splitlines()
    header = old[:old.index("", old.index("# kernelzoo benchmark") + 2) + 1]
    _write(rows, path, header, target_lines, eval_flop_ratio)


def _write(rows, path: Path, header: list[str], target_lines: list[str], eval_flop_ratio) -> None:
    lines = header + [
        "| " + " | ".join(COLUMNS + ["floor/kernelzoo"]) + " |",
        "|" + "---|" * (len(COLUMNS) + 1),
    ]
    for r in rows:
        cells = [_cell(r.get(k, ""), "{:.3g}") for k in COLUMNS]
        floor = r["floor_ms"] / r["kernelzoo_ms"]
        lines.append("| " + " | ".join(cells + ["" if math.isnan(floor) else f"{floor:.0%}"]) + " |")
    lines += ["", "## Targets", ""] + [f"- {t}" for t in target_lines]
    lines += ["", "## Notes", ""] + [f"- {n}" for n in notes(rows, eval_flop_ratio)]
    files.atomic_write_text(path, "\n".join(lines) + "\n")


def sweep_targets(results: Path) -> list[str]:
    """Each named sweep's wall time against its target, from ``<results>/<name>/sweep.json``."""
    out = []
    for name, seconds in SWEEP_SECONDS.items():
        what = f"`{name}` sweep in at most {_duration(seconds)}"
        try:
            record = history.read_sweep(results / name)
        except store.StoreError as err:
            out.append(f"{what}: unknown, {err}")
            continue
        if record is None:
            out.append(f"{what}: no sweep recorded in {results / name}")
            continue
        runs, wall = record["invocations"], float(record["wall_seconds"])
        trained = sum(map(history.trained_points, runs))
        out.append(f"{what}: {'met' if wall <= seconds else 'NOT met'} ({_duration(wall)} for "
                   f"{trained} trained points over {plural(len(runs), 'invocation')} on "
                   f"{runs[-1].get('machine', 'an unrecorded machine')})")
    return out


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def targets(rows: list[dict], eval_flop_ratio) -> list[str]:
    """The issue's targets, each met / NOT met with the numbers behind it, and the reasons
    (eval_flop_ratio: ``bench.eval_flop_ratio``, passed in as bench imports this module)."""
    def check(what, selected, need):
        if not selected:
            return f"{what}: not measured in this run"
        worst = min(selected, key=lambda r: r["ratio"])
        ok = worst["ratio"] >= need
        short = [f"{r['feature_map']} {r['ratio']:.1f}x" for r in selected if r["ratio"] < need]
        return (f"{what} >= {need}x: {'met' if ok else 'NOT met'} (lowest {worst['ratio']:.1f}x, "
                f"{worst['feature_map']} at n_keys {worst['n_keys']})"
                + ("" if ok else f"; below: {', '.join(short)}"))
    train = [r for r in rows if r["case"] == "train_step"]
    evals = [r for r in rows if r["case"] == "eval"]
    packed = bench_pack.targets(rows)
    out = [check("train step, DPFP-3 at n_keys 600",
                 [r for r in train if r["feature_map"] == "dpfp-3" and r["n_keys"] == 600], 30)]
    for s in sorted({r["n_keys"] for r in train}):
        out.append(check(f"train step, every map at n_keys {s}",
                         [r for r in train if r["n_keys"] == s], 10 if s >= 200 else 3))
    for s in sorted({r["n_keys"] for r in evals}):
        out.append(check(f"evaluation at n_keys {s}", [r for r in evals if r["n_keys"] == s], 300))
        out.append(f"evaluation at n_keys {s}: the FLOP ratio of the two (the bound at equal "
                   "rates) is " + ", ".join(f"{r['feature_map']} {eval_flop_ratio(r, r['d_dot']):.0f}x"
                                            for r in evals if r["n_keys"] == s))
    for case, what in (("delta", "delta rule train step"), ("delta_read", "delta rule read alone")):
        for s in sorted({r["n_keys"] for r in rows if r["case"] == case}):
            out.append(check(f"{what}, L {2 * s}",
                             [r for r in rows if r["case"] == case and r["n_keys"] == s], 10))
    floor = [r for r in train if r["n_keys"] == 20]
    if floor:
        out.append("framework floor, the train step at n_keys 20 (kernelzoo / baseline): "
                   + ", ".join(f"{r['feature_map']} {r['kernelzoo_ms']:.1f} / {r['baseline_ms']:.1f} ms"
                               for r in floor))
    return out + packed


# ------------------------------------------------ the memory estimate (bench.py --estimate)

ESTIMATE_COLUMNS = ["feature_map", "update_rule", "batch_size", "n_keys", "pack", "status",
                    "peak_mb", "estimate_mb", "ratio", "estimated_phase"]
ESTIMATE_BAND = (0.8, 1.0)  # peak / estimate: the estimate covers the peak, at most 25% above


def read_estimate_csv(path: Path) -> list[dict]:
    """The rows of an ``estimate.csv`` as ``write_estimate`` wrote them (a pack's other runs'
    n_keys as "180+160", none as an empty cell)."""
    return [{**r, "batch_size": int(r["batch_size"]), "n_keys": int(r["n_keys"]),
             "pack": tuple(int(n) for n in r.get("pack", "").split("+") if n),
             **{k: float(r[k]) for k in ("peak_mb", "estimate_mb", "ratio")}}
            for r in csv.DictReader(io.StringIO(files.read_text(path), newline=""))]


def estimate_key(row: dict) -> tuple:
    """What names an --estimate point: map, rule, batch size, n_keys and its pack's others."""
    return (row["feature_map"], row["update_rule"], row["batch_size"], row["n_keys"],
            tuple(row["pack"]))


def write_estimate(rows: list[dict], stem: Path, command: str, seconds: float,
                   rebuilt: bool) -> None:
    """``estimate.csv`` (a row per point) and ``estimate.md``: a table of peak / estimate per
    map and rule (columns: batch sizes) and the range of that ratio against ESTIMATE_BAND."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=ESTIMATE_COLUMNS)
    writer.writeheader()
    for r in rows:
        writer.writerow({k: "+".join(map(str, r[k])) if k == "pack" else _cell(r[k], "{:.4g}")
                         for k in ESTIMATE_COLUMNS})
    files.atomic_write_text(stem.with_suffix(".csv"), out.getvalue())
    batches = sorted({r["batch_size"] for r in rows})
    diverged = sum(r["status"] == "diverged" for r in rows)
    low, high = ESTIMATE_BAND
    inside = sum(low <= r["ratio"] <= high for r in rows)
    lines = [
        "# kernelzoo memory estimate", "",
        f"- machine: {history.cpu_model()}, {len(os.sched_getaffinity(0))} cores; torch "
        f"{torch.__version__}, 1 thread, device cpu",
        f"- command: `{command}`" + (f", then `{command} --rebuild` (the estimates of its rows "
                                     "recomputed)" if rebuilt else
                                     f" (its last invocation: {seconds:.0f} s)"),
        f"- {plural(len(rows), 'point')} at n_keys {rows[0]['n_keys'] if rows else '-'} (a pack: "
        "its largest run's, and its others' beside the map's name), each "
        "trained 4 steps with an evaluation and a checkpoint every 2 and the final diagnostics; "
        "peak: the most MB its tensors held at once (torch.profiler's CPU allocator events); "
        "estimate: `footprint.footprint`, at the phase it finds largest, or at its training step "
        f"where the run diverged (its first evaluation stops it; {diverged} here, marked)",
        f"- peak / estimate from {min(r['ratio'] for r in rows):.3f} to "
        f"{max(r['ratio'] for r in rows):.3f}; within [{low}, {high}] (the estimate covers the "
        f"peak, at most 25% above it): {inside} of {plural(len(rows), 'point')}" if rows else
        "- no point", "",
        "| feature_map | update_rule | " + " | ".join(f"B = {b}: peak / estimate (MB)"
                                                     for b in batches) + " |",
        "|---|---|" + "---|" * len(batches),
    ]
    for (name, rule, pack) in dict.fromkeys((r["feature_map"], r["update_rule"], r["pack"])
                                            for r in rows):
        by_batch = {r["batch_size"]: r for r in rows
                    if (r["feature_map"], r["update_rule"], r["pack"]) == (name, rule, pack)}
        if pack:
            name = f"{name}, a pack of n_keys {by_batch[min(by_batch)]['n_keys']}, " + \
                ", ".join(map(str, pack))
        cells = []
        for b in batches:
            r = by_batch.get(b)
            cells.append("" if r is None else f"{r['ratio']:.3f} ({r['peak_mb']:.4g} / "
                         f"{r['estimate_mb']:.4g})" + (" diverged" if r["status"] == "diverged"
                                                       else ""))
        lines.append(f"| {name} | {rule} | " + " | ".join(cells) + " |")
    files.atomic_write_text(stem.with_suffix(".md"), "\n".join(lines) + "\n")
