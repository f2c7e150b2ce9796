"""Workers or threads: how this machine's cores are best spent on training steps
(``python -m kernelzoo.bench --scaleout``; ``make bench``).

For each map and n_keys of ``ROWS``, the kernelzoo training step of ``throughput.setup`` (d_key
64, batch 32, Setting 1) is run for ``SECONDS`` of wall time three ways:

- ``one``: one process, one thread: what one worker does alone;
- ``threads``: one process with every core's thread (one run on all threads);
- ``workers``: one process per core, one thread each, all at once (one worker per core: how a
  sweep's local launcher runs, ``training.workers``).

Each process warms up (``WARMUP`` steps) and then counts the steps it finishes in one shared
window of wall time; the three ways take turns, ``REPEATS`` times, and each way's best counts
(other load on the machine only slows a window). Per row: steps per second of wall in each
way; ``workers / threads``
(above 1: one worker per core is the better use of the cores at that size) and the scale-out
efficiency ``workers / (cores x one)``: the share of one worker's throughput each worker keeps
when every core works (memory bandwidth and caches are shared), which is what a box with more
cores would keep per worker at best. Written to ``scaleout.csv`` and ``scaleout.md`` in
``--out`` (``--quick``: ``scaleout_quick.*``).
"""

from __future__ import annotations

import argparse
import multiprocessing
import time
from pathlib import Path

import torch

from kernelzoo.bench import report as bench_report
from kernelzoo.config.words import plural
from kernelzoo.records.files import atomic_write_text
from kernelzoo.records.history import cpu_model
from kernelzoo.training.workers import usable_cores

ROWS = [{"feature_map": fm, "n_keys": n} for fm in ("linear", "dpfp-2") for n in (20, 100, 400)]
QUICK_ROWS = [{"feature_map": "linear", "n_keys": n} for n in (20, 200)]
SECONDS, WARMUP, LEAD = 5.0, 3, 4.0  # the counted window, steps before it, and its start
REPEATS = 2  # each way measured this many times, taking turns; its best counts
COLUMNS = ("feature_map", "n_keys", "cores", "one", "threads", "workers", "workers_over_threads",
           "efficiency")


def _count(row: dict, threads: int, start: float, seconds: float) -> int:
    """Steps of ``row``'s training step finished within [start, start + seconds] of wall time,
    on ``threads`` threads, after ``WARMUP`` steps."""
    from kernelzoo.bench.throughput import setup

    torch.set_num_threads(threads)
    step, _ = setup({**row, "case": "train_step"}, "kernelzoo", torch.device("cpu"))
    for _ in range(WARMUP):
        step()
    while time.time() < start:
        time.sleep(0.01)
    done, end = 0, start + seconds
    while time.time() < end:
        step()
        done += 1
    return done


def _rate(row: dict, processes: int, threads: int, seconds: float) -> float:
    """Steps per second of wall of ``processes`` processes at once, ``threads`` threads each."""
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(processes) as pool:
        start = time.time() + LEAD
        counts = pool.starmap(_count, [(row, threads, start, seconds)] * processes)
    return sum(counts) / seconds


def measure(rows: list[dict], seconds: float = SECONDS) -> list[dict]:
    """One result row per row of ``rows`` (module docstring)."""
    cores, out = usable_cores(), []
    for row in rows:
        found = {"one": 0.0, "threads": 0.0, "workers": 0.0}
        for _ in range(REPEATS):
            for way, (processes, threads) in (("one", (1, 1)), ("threads", (1, cores)),
                                              ("workers", (cores, 1))):
                found[way] = max(found[way], _rate(row, processes, threads, seconds))
        one, threads, workers = found["one"], found["threads"], found["workers"]
        out.append({**row, "cores": cores, "one": one, "threads": threads, "workers": workers,
                    "workers_over_threads": workers / threads,
                    "efficiency": workers / (cores * one)})
        print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                       for k, v in out[-1].items()), flush=True)
    return out


def markdown(rows: list[dict], seconds: float) -> str:
    """scaleout.md: the machine, the table, what it says."""
    cores = rows[0]["cores"]
    lines = ["# Workers or threads", "",
             f"- machine: {cpu_model()}, {plural(cores, 'usable core')}; torch {torch.__version__}",
             f"- measured by `python -m kernelzoo.bench --scaleout`: each row's kernelzoo "
             f"training step (d_key 64, batch 32, Setting 1) counted over {seconds:g} s of wall "
             "time, after a warm-up, in one process on one thread (`one`), in one process on "
             f"{plural(cores, 'thread')} (`threads`) and in {cores} processes of one thread at "
             f"once (`workers`), each way's best of {REPEATS} turns; steps per second of wall",
             "",
             "| map | n_keys | one | threads | workers | workers / threads | efficiency |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['feature_map']} | {r['n_keys']} | {r['one']:.1f} | "
                     f"{r['threads']:.1f} | {r['workers']:.1f} | "
                     f"{r['workers_over_threads']:.2f} | {r['efficiency']:.2f} |")
    better = [r for r in rows if r["workers_over_threads"] > 1]
    lows = min(r["efficiency"] for r in rows)
    highs = max(r["efficiency"] for r in rows)
    lines += ["", f"One worker per core is the faster use of the cores in {len(better)} of "
              f"{len(rows)} rows (workers / threads above 1: "
              f"{min(r['workers_over_threads'] for r in rows):.2f}-"
              f"{max(r['workers_over_threads'] for r in rows):.2f}). From 1 to {cores} workers "
              f"the throughput grows {cores * lows:.2f}-{cores * highs:.2f}x: each worker kept "
              f"{lows:.2f}-{highs:.2f} of its throughput alone (efficiency; above 1 is the "
              "noise of a shared machine between windows). A box of C cores would train about "
              "C x efficiency x `one` steps per second with one worker per core, less where its "
              "memory bandwidth binds (16 cores: "
              f"{16 * lows:.0f}-{16 * highs:.0f}x one worker, were the efficiency to hold).", ""]
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m kernelzoo.bench --scaleout",
                                description=__doc__.splitlines()[0])
    p.add_argument("--scaleout", action="store_true", required=True)
    p.add_argument("--quick", action="store_true", help="two rows, half the window")
    p.add_argument("--out", default="results/bench", help="directory of scaleout[_quick].*")
    args = p.parse_args(argv)
    run(args.quick, Path(args.out))


def run(quick: bool, out: Path) -> None:
    """Measure and write scaleout[_quick].csv and .md in ``out``."""
    stem = out / ("scaleout_quick" if quick else "scaleout")
    seconds = SECONDS / 2 if quick else SECONDS
    rows = measure(QUICK_ROWS if quick else ROWS, seconds)
    bench_report.write_csv(rows, stem.with_suffix(".csv"), COLUMNS)
    atomic_write_text(stem.with_suffix(".md"), markdown(rows, seconds))
    print(f"wrote {stem}.csv and {stem}.md")
