"""Speed and memory of the fast path against the literal reference: ``python -m kernelzoo.bench``.

    python -m kernelzoo.bench [--quick] [--device cpu|cuda] [--threads 1] [--out results/bench]
    python -m kernelzoo.bench --scaleout [--quick] [--out results/bench]   (``scaleout.py``)

Cases (task-spec "Model", d_key 64, batch 32, the Figure 2 feature maps; both sides use the same
parameters, data and optimiser, Adam with ``ADAM`` options):

- ``train_step``: one training step (forward, loss, backward, Adam) of Setting 1 (L = S, one
  query). baseline: ``reference.reference_forward``; kernelzoo: ``model.RetrievalModel``.
- ``eval``: the forward of an evaluation, 20 sequences x min(S, 200) queries, no gradients.
  baseline: ``reference.reference_eval_forward`` (each sequence replicated once per query) in
  batches of 32 queries, as the authors; for S > 100 it is timed on ``EVAL_BASELINE_SEQUENCES``
  sequences and scaled to 20 (the sequences are independent, equal work). kernelzoo: one pass.
- ``delta``: a training step of Setting 2 (S 200, L 400) with the delta rule and DPFP-1, and
  ``delta_read``: the memory read alone (forward and backward), ``memory.read_reference`` (the
  sequential loop) against ``memory.read`` (parallel: one triangular solve here).
- ``fwm`` and ``fwm_read``: the same with the fwm rule, whose renormalisation keeps a loop over
  the writes: the literal loop over (B, d_v, D) states against ``fwm.state`` (chunked, a loop
  over vectors, its backward written out).

Time: best of repeats after a warm-up, the two sides taking turns within a per-side budget; on
the CPU with one thread the clock is the thread's CPU time (robust to other processes on a
shared machine), else wall time (``torch.cuda.synchronize`` on cuda). Both sides of a row run
with denormal floats flushed as training would run them (``trainer.flush_denormal=auto``: the
training steps of the sum rule and everything of the fwm rule flushed; evaluations and the delta
rule not). Peak memory: each (case, side) runs once
in a fresh subprocess that reports the rise of its peak resident set size (``getrusage`` /
VmHWM, reset through /proc/self/clear_refs where allowed) over its size before the step, or
``torch.cuda.max_memory_allocated`` on cuda (in process); only for the largest n_keys of each
case unless ``--memory all``. Outputs (``bench_report``): ``bench.csv`` and ``bench.md`` in
``--out`` (``--quick``: ``bench_quick.*``, so that a quick run does not overwrite the full
table). ``floor_ms``: the contractions a step must do at this machine's measured matmul
rate plus the bytes it must move (Adam's state, keys and their gradients) at its
measured bandwidth; see ``floor_ms``. ``--estimate`` measures the memory estimate instead
(``estimate.py``).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

from kernelzoo.bench import estimate, pack as bench_pack, report as bench_report
from kernelzoo.core import memory
from kernelzoo.config import CONF
from kernelzoo.records import files, loaders
from kernelzoo.training.devices import flushes_denormals
from kernelzoo.maps.catalog import build_feature_map
from kernelzoo.core.model import RetrievalModel, retrieval_loss
from kernelzoo.core.reference import reference_eval_forward, reference_forward
from kernelzoo.core.task import RetrievalTask

D_KEY, BATCH, EVAL_SEQUENCES, EVAL_QUERIES, EVAL_QUERY_BATCH = 64, 32, 20, 200, 32
EVAL_BASELINE_SEQUENCES = 1  # sequences timed for the baseline evaluation when S > 100
ADAM = {"fused": True}  # as the training loop (runner.fit) sets it on the CPU
MAPS = {  # Figure 2 label -> (feature map, parameters)
    "softmax": ("softmax", {}),
    "linear": ("elu", {}),
    **{f"dpfp-{nu}": ("dpfp", {"nu": nu}) for nu in (1, 2, 3)},
    **{f"favor-{m}": ("favor", {"m": m, "variant": "hyperbolic", "redraw": "every_call"})
       for m in (64, 128, 512)},
}


def cases(quick: bool = False) -> list[dict]:
    """The benchmark's rows: dicts with case, feature_map (a MAPS label) and n_keys."""
    if quick:
        return [{"case": "train_step", "feature_map": "dpfp-3", "n_keys": 600},
                {"case": "train_step", "feature_map": "linear", "n_keys": 20},
                {"case": "eval", "feature_map": "dpfp-3", "n_keys": 100},
                {"case": "delta_read", "feature_map": "dpfp-1", "n_keys": 100},
                *bench_pack.cases(quick=True)]
    rows = [{"case": "train_step", "feature_map": fm, "n_keys": s}
            for fm in MAPS for s in (20, 100, 200, 400, 600)]
    rows += [{"case": "eval", "feature_map": fm, "n_keys": s} for fm in MAPS for s in (100, 600)]
    rows += [{"case": c, "feature_map": "dpfp-1", "n_keys": 200}
             for c in ("delta", "delta_read", "fwm", "fwm_read")]
    return rows + bench_pack.cases()


def update_rule(case: str) -> str:
    """A case's update rule: delta and fwm cases (Setting 2) name theirs, the others sum."""
    return case.split("_")[0] if case.startswith(("delta", "fwm")) else "sum"


def memory_conf(case: str) -> dict:
    """The memory's settings of a case, as ``conf/memory/<update_rule>.yaml`` gives them."""
    return loaders.load_yaml(files.read_text(CONF / "memory" / f"{update_rule(case)}.yaml"))


def baseline_eval_sequences(n_keys: int) -> int:
    """Sequences the baseline evaluation is timed on (they are independent, equal work)."""
    return EVAL_SEQUENCES if n_keys <= 100 else EVAL_BASELINE_SEQUENCES


def setup(row: dict, side: str, device: torch.device):
    """A callable doing one unit of the row's work on one side, and the model it uses."""
    name, params = MAPS[row["feature_map"]]
    S, mem = row["n_keys"], memory_conf(row["case"])
    torch.manual_seed(0)
    phi = build_feature_map(name, d_key=D_KEY, **params)
    model = RetrievalModel(S, phi, **mem).to(device)
    setting2 = mem["update_rule"] != "sum"
    task = RetrievalTask(S, 2 * S if setting2 else S, S, setting2, seed=0, device=device)
    if row["case"] == "eval":
        model.eval()
        b = task.eval_batch(EVAL_SEQUENCES, EVAL_QUERIES)
        n_seq = baseline_eval_sequences(S)

        @torch.no_grad()
        def evaluation():
            if side == "kernelzoo":  # one pass over all sequences and queries
                return retrieval_loss(model(b.keys, b.values, b.query), b.target, b.mask)
            for i in range(n_seq):  # per sequence, per batch of <= 32 queries, a copy per query
                for j in range(0, b.query.shape[1], EVAL_QUERY_BATCH):
                    q = slice(j, j + EVAL_QUERY_BATCH)
                    y = reference_eval_forward(model, b.keys[i:i + 1], b.values[i:i + 1],
                                               b.query[i:i + 1, q])
                    retrieval_loss(y, b.target[i:i + 1, q], b.mask[i:i + 1, q])
        return evaluation, model
    b = task.train_batch(BATCH)
    if row["case"].endswith("_read"):
        k, q, gates = model.keys_and_query(b.keys, b.values, b.query)
        fk, fq = (model.phi(x).detach().requires_grad_() for x in (k, q))
        v = torch.nn.functional.one_hot(b.values, S).to(fk.dtype)
        beta = gates["beta"].detach().requires_grad_()
        read = memory.read if side == "kernelzoo" else memory.read_reference
        kw = dict(mem, beta=beta)
        if side == "baseline":
            del kw["chunk_size"]  # the literal loop has no chunks
        return lambda: read(fk, v, fq, **kw).square().sum().backward(), model
    forward = model if side == "kernelzoo" else (lambda *a: reference_forward(model, *a))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, **(ADAM if device.type != "mps" else {}))

    def step():
        loss = retrieval_loss(forward(b.keys, b.values, b.query), b.target).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return step, model


def best_ms(fns: dict, device: torch.device, clock: str, budget_s: float,
            max_repeats: int = 200, slice_s: float = 0.2) -> dict:
    """Best time in ms of each callable in fns (side -> fn) after a warm-up call. The sides take
    turns, slice_s seconds each, until each has used budget_s (at least one timed call), so
    that both see the same machine load."""
    now = time.thread_time if clock == "cpu" else time.perf_counter
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def once(fn):
        sync()
        t = now()
        fn()
        sync()
        return now() - t

    times = {side: [] for side in fns}
    for fn in fns.values():
        once(fn)  # warm-up: the first call after other work can take twice as long
    while True:
        pending = [s for s in fns if times[s] == [] or
                   (sum(times[s]) < budget_s and len(times[s]) < max_repeats)]
        if not pending:
            return {side: 1e3 * min(t) for side, t in times.items()}
        for side in pending:
            spent = 0.0
            while spent < slice_s and len(times[side]) < max_repeats:
                times[side].append(once(fns[side]))
                spent += times[side][-1]


def machine_rates(device: torch.device, clock: str) -> tuple[float, float]:
    """Matmul rate (GFLOP/s, float32 n x n, n = 2048, 8192 on cuda) and memory bandwidth
    (GB/s, a 256 MB copy)."""
    n = 8192 if device.type == "cuda" else 2048
    a, b = (torch.randn(n, n, device=device) for _ in range(2))
    gflops = 2 * n**3 / best_ms({"mm": lambda: a @ b}, device, clock, 1.0)["mm"] / 1e6
    x = torch.empty(2**26, device=device).uniform_()
    y = torch.empty_like(x)
    gbs = 2 * x.numel() * 4 / best_ms({"copy": lambda: y.copy_(x)}, device, clock, 1.0)["copy"] / 1e6
    return gflops, gbs


def floor_ms(row: dict, model: RetrievalModel, gflops: float, gbs: float) -> float:
    """A lower bound for the kernelzoo side: the multiply-adds it must do at the measured matmul
    rate plus the bytes it must move at the measured bandwidth. Counted: the projections of
    the key table (and of the queries), FAVOR+'s projection of every key and query, the
    feature-space products phi(q).phi(k) (softmax: q.k); for the delta rule the Gram matrix
    K K^T, its gradient and the triangular solve of `rules.delta.read_direct`, and its
    L x L system moved ~6 times; for the fwm rule v_bar = W k and the update u k^T at every
    write (B L D d_v multiply-adds each), forward and twice that backward. Bytes of a training
    step: Adam (read p, g, m, v; write p, m, v, g) and the keys (B, L, d_key) written and read
    forwards and backwards. Not counted: elementwise work (DPFP's products, FAVOR+'s exp),
    Python and framework overhead."""
    S, d, case = row["n_keys"], D_KEY, row["case"]
    e, m = int(2 * S * 1.1), getattr(model.phi, "m", 0)
    D = d if math.isinf(model.phi.d_dot) else model.phi.d_dot
    if case == "eval":  # forward only: two tables, one Q x L x D product per sequence
        B, L, Q = EVAL_SEQUENCES, S, min(S, EVAL_QUERIES)
        flops = 4 * S * e * d + 2 * B * (L + Q) * d * m + 2 * B * L * Q * D
        return 1e3 * (flops / gflops + 2 * 4 * B * L * d / gbs) / 1e9
    rule = update_rule(case)
    B, L = BATCH, 2 * S if rule != "sum" else S
    if rule != "sum":
        flops, bytes_ = ((B * (4 * L * L * D + 3 * L * L), 6 * 4 * B * L * L)
                         if rule == "delta" else (3 * 2 * 2 * B * L * D * S, 0))
        if case.endswith("_read"):
            return 1e3 * (flops / gflops + bytes_ / gbs) / 1e9
    else:
        flops, bytes_ = 3 * 2 * B * L * D, 0
    flops += 3 * 2 * (S + B) * e * d + 4 * B * L * d * m  # forward and two gradients
    bytes_ += 32 * sum(p.numel() for p in model.parameters()) + 4 * 4 * B * L * d
    return 1e3 * (flops / gflops + bytes_ / gbs) / 1e9


def eval_flop_ratio(row: dict, d_dot) -> float:
    """Multiply-adds of the authors' evaluation over those of the one-pass one: per replicated
    sequence the one-hot projection and the state (softmax: scores and their sum over values),
    against the key and query tables and one Q x L x d_dot product per sequence. The ratio two
    implementations running at the same rate would reach."""
    S, d = row["n_keys"], D_KEY
    L, Q, e = S, min(S, EVAL_QUERIES), int(2 * S * 1.1)
    D = d if d_dot == "inf" else d_dot
    per_copy = L * (S + e) * d + (L * d + L * S if d_dot == "inf" else L * S * D + S * D)
    return EVAL_SEQUENCES * Q * per_copy / (2 * S * e * d + EVAL_SEQUENCES * L * Q * D)


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def _peak_rss_mb() -> float:
    """VmHWM; getrusage's ru_maxrss only as a fallback, as it keeps the parent's size across exec."""
    try:
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) for l in f if l.startswith("VmHWM")) / 1024
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def peak_mb_here(row: dict, side: str, device: torch.device) -> float:
    """Rise of peak memory during one unit of work, in this process (fresh from peak_mb)."""
    fn, _ = setup(row, side, device)
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        fn()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated(device) - before) / 2**20
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset the peak to the current size
    except OSError:
        pass
    before = _rss_mb()
    fn()
    return max(0.0, _peak_rss_mb() - before)  # the high-water mark cannot fall: noise


def peak_mb(row: dict, side: str, device: torch.device, threads: int) -> float:
    """peak_mb_here in a fresh subprocess (nan when it fails)."""
    cmd = [sys.executable, "-m", "kernelzoo.bench", "--peak-of", json.dumps([row, side]),
           "--device", str(device), "--threads", str(threads)]
    out = subprocess.run(cmd, capture_output=True, text=True)
    try:
        return float(out.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        print(f"peak memory of {row} {side} failed: {out.stderr[-500:]}", file=sys.stderr)
        return math.nan


def run_row(row: dict, device: torch.device, clock: str, rates, threads: int, memory_: bool,
            budget_s: float = 1.2, max_repeats: int = 200) -> dict:
    """One CSV row: both sides timed (and their peak memory measured when memory_), with
    denormal floats flushed as the trainer's default flushes them (``trainer.flush_denormal``
    auto): the rows of training steps as its steps, ``eval`` and ``*_read`` rows as the rest."""
    memory = memory_conf(row["case"])
    training = row["case"] != "eval" and not row["case"].endswith("_read")
    torch.set_flush_denormal(flushes_denormals("auto", memory["update_rule"],
                                               memory["normalisation"], training))
    try:
        if row["case"] == "packed":
            return bench_pack.run_row(row, device, clock, best_ms, budget_s)
        return _timed_row(row, device, clock, rates, threads, memory_, budget_s, max_repeats)
    finally:
        torch.set_flush_denormal(False)


def _timed_row(row: dict, device: torch.device, clock: str, rates, threads: int, memory_: bool,
               budget_s: float, max_repeats: int) -> dict:
    out = dict(row)
    fns, model = {}, None
    for side in ("baseline", "kernelzoo"):
        fns[side], model = setup(row, side, device)
    ms = best_ms(fns, device, clock, budget_s, max_repeats)
    if row["case"] == "eval":  # timed on baseline_eval_sequences, scaled to all of them
        ms["baseline"] *= EVAL_SEQUENCES / baseline_eval_sequences(row["n_keys"])
    del fns
    for side in ("baseline", "kernelzoo"):
        out[f"{side}_ms"] = ms[side]
        peak = math.nan
        if memory_:  # cuda: the allocator's own peak, in this process
            peak = (peak_mb_here(row, side, device) if device.type == "cuda"
                    else peak_mb(row, side, device, threads))
        out[f"{side}_peak_mb"] = peak
    d_dot = model.phi.d_dot
    out["d_dot"] = "inf" if math.isinf(d_dot) else d_dot
    out["ratio"] = out["baseline_ms"] / out["kernelzoo_ms"]
    out["floor_ms"] = floor_ms(row, model, *rates)
    out.update(pack=1, compile=False, compile_s=math.nan)  # one run, eager
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a subset in under a minute")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--clock", choices=("auto", "cpu", "wall"), default="auto")
    p.add_argument("--memory", choices=("largest", "all", "none"), default="largest")
    p.add_argument("--budget", type=float, default=1.2, help="seconds of repeats per side and row")
    p.add_argument("--out", default="results/bench", help="directory of bench[_quick].csv/.md")
    p.add_argument("--sweeps", default="results/reference",
                   help="results directory of the timed sweeps (the committed reference runs)")
    p.add_argument("--rebuild", action="store_true",
                   help="rewrite bench[_quick].md from its .csv (table, targets, notes) without "
                        "measuring; the machine lines of the old .md are kept (with --estimate: "
                        "recompute the estimates of estimate[_quick].csv)")
    p.add_argument("--estimate", action="store_true",
                   help="measure the memory estimate against runs' peaks instead (estimate.*)")
    p.add_argument("--peak-of", help=argparse.SUPPRESS)  # internal: one peak_mb subprocess
    args = p.parse_args(argv)
    if args.estimate:
        estimate.run_estimates(args.quick, Path(args.out), args.rebuild)
        return
    stem = Path(args.out) / ("bench_quick" if args.quick else "bench")
    if args.rebuild:
        rows = bench_report.read_csv(stem.with_suffix(".csv"))
        lines = (bench_report.targets(rows, eval_flop_ratio)
                 + bench_report.sweep_targets(Path(args.sweeps)))
        bench_report.rewrite_markdown(rows, stem.with_suffix(".md"), lines, eval_flop_ratio)
        print(f"wrote {stem}.md from {stem}.csv")
        return
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if args.peak_of:
        row, side = json.loads(args.peak_of)
        print(peak_mb_here(row, side, device))
        return
    clock = args.clock if args.clock != "auto" else (
        "cpu" if device.type == "cpu" and args.threads == 1 else "wall")
    start = time.perf_counter()
    rates = machine_rates(device, clock)
    selected = cases(args.quick)
    largest = {}
    for r in selected:
        largest[r["case"]] = max(largest.get(r["case"], 0), r["n_keys"])
    rows = []
    for r in selected:
        mem = args.memory == "all" or (args.memory == "largest" and r["n_keys"] == largest[r["case"]])
        rows.append(run_row(r, device, clock, rates, args.threads, mem, args.budget))
        print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                       for k, v in rows[-1].items()), flush=True)
    bench_report.write_csv(rows, stem.with_suffix(".csv"))
    lines = (bench_report.targets(rows, eval_flop_ratio)
             + bench_report.sweep_targets(Path(args.sweeps)))
    bench_report.write_markdown(rows, stem.with_suffix(".md"), device, clock, rates,
                                time.perf_counter() - start, lines, eval_flop_ratio)
    print("\n".join(lines))
    print(f"wrote {stem}.csv and {stem}.md")

