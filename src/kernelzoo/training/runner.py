"""The published training protocol (task-spec "Training") for one planned run.

``fit`` trains the model of a plan (``plan.Plan``) with Adam on fresh batches, evaluates every
``eval_every`` steps (``evaluate``), appends each evaluation to ``curve.csv``, and stops at the
first of: eval loss <= ``stop_loss`` (converged), more than ``patience`` evaluations without
improvement (plateau), ``max_steps`` (max_steps), a non-finite loss (diverged), and yields each
run's result as it stops. Every ``checkpoint_minutes`` it checkpoints the runs at an evaluation,
and a run claimed with a checkpoint continues from it (``checkpoint.py``). Warned by its
scheduler of the time limit (``interrupt.checkpoint_on_warning``), a job checkpoints its runs at
the next evaluation, says so in one line per run, and is requeued. Every file goes through the
run's ``RunDir``.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from dataclasses import dataclass
from typing import Iterator

import torch
from omegaconf import DictConfig
from tqdm import tqdm

from kernelzoo.core import diagnostics
from kernelzoo.records import summary, tracking
from kernelzoo.records.rundir import RunDir
from kernelzoo.training import checkpoint, interrupt
from kernelzoo.config import TrainerConf
from kernelzoo.training.devices import flushes_denormals, numerics
from kernelzoo.core.model import RetrievalModel, retrieval_loss
from kernelzoo.training.pack import Pack, compiles
from kernelzoo.training.plan import Plan
from kernelzoo.core.task import RetrievalTask


LOG = logging.getLogger("kernelzoo.train")  # the run's train.log (its Hydra job directory)
REDRAW_OFFSET = 3_000_017  # a random map's redraws: a stream of their own per run
PROBE_OFFSET = 2_000_003  # the diagnostics' sequences: a stream of their own per run


@torch.no_grad()
def evaluate(model: RetrievalModel, task: RetrievalTask, tr: TrainerConf) -> tuple[float, float]:
    """Eval loss and accuracy (task-spec "Data" and "Quirks"): one memory per sequence.

    A sequence's queries fall into chunks of ``eval_query_batch`` (all in one when None). The
    loss is the mean of per-chunk means (the authors' weighting), or the plain mean over queries
    when ``eval_query_batch`` is None. All queries are read in one pass, except for a random map
    with ``draws_per_chunk`` (redraw=every_call, eval_redraw=per_chunk), which gets a new
    projection per (sequence, chunk) as in the authors' one forward per chunk (``_per_chunk``).
    """
    model.eval()
    batch = task.eval_batch(tr.eval_sequences, tr.eval_max_queries)
    mask = batch.mask
    rank = (mask.cumsum(dim=1) - 1).clamp(min=0)  # a query's index among its sequence's real ones
    if model.phi.draws_per_chunk:
        y = _per_chunk(model, batch, rank, min(tr.eval_query_batch or mask.shape[1], mask.shape[1]))
    else:
        y = model(batch.keys, batch.values, batch.query)
    losses = retrieval_loss(y, batch.target, mask)
    correct = (y.argmax(-1) == batch.target) & mask
    accuracy = correct.sum() / mask.sum()
    if tr.eval_query_batch is None:
        loss = losses.sum() / mask.sum()
    else:
        chunk = rank // tr.eval_query_batch
        n_chunks = int(chunk.max()) + 1
        sums = losses.new_zeros(mask.shape[0], n_chunks).scatter_add(1, chunk, losses)
        counts = losses.new_zeros(mask.shape[0], n_chunks).scatter_add(1, chunk, mask.to(losses))
        loss = (sums[counts > 0] / counts[counts > 0]).mean()
    model.train()
    return loss.item(), accuracy.item()


def _per_chunk(model: RetrievalModel, batch, rank: torch.Tensor, size: int) -> torch.Tensor:
    """Outputs y (B, Q, S) with one projection per (sequence, chunk of ``size`` real queries).

    The numbers of the authors' loop of one forward per chunk, in one forward over the chunks
    in the loop's order, each with its own projection (``per_element_draws``). The real query
    of rank r of a sequence sits in slot r of the sequence's chunks (chunk r // size, place
    r % size); slots without a query ask key 0, and their outputs are dropped.
    """
    chunks = (batch.mask.sum(dim=1) + size - 1) // size  # per sequence
    n = int(chunks.sum())
    slot = (chunks.cumsum(0) - chunks).unsqueeze(1) * size + rank
    spare = torch.where(batch.mask, slot, n * size)  # padding queries: one spare slot, dropped
    query = batch.query.new_zeros(n * size + 1).scatter_(0, spare.flatten(), batch.query.flatten())
    sequence = torch.arange(len(chunks), device=chunks.device).repeat_interleave(chunks)
    with model.phi.per_element_draws(n):
        y = model(batch.keys[sequence], batch.values[sequence], query[:-1].view(n, size))
    return y.flatten(0, 1)[torch.where(batch.mask, slot, 0)]


@dataclass
class Member:
    """A claimed run as the loop needs it: its config, plan (``plan.Plan``), directory (its
    ``RunDir``, staged beside the finished run for a forced rerun), tracker, and the checkpoint
    it continues from (read by ``fit``)."""

    cfg: DictConfig
    plan: Plan
    run: RunDir
    tracker: tracking.Tracker | None = None
    checkpoint: dict | None = None  # until ``fit`` has restored it
    started: float = 0.0  # time.perf_counter() when this attempt began

    def __post_init__(self):
        saved = self.checkpoint or {"step": 0, "resumes": -1, "wall_seconds": 0.0}
        self.start_step = saved["step"]
        self.resumes = saved["resumes"] + 1  # continued from a checkpoint, this attempt included
        self.wall_before = saved["wall_seconds"]  # training before this attempt, to the checkpoint

    @property
    def rid(self) -> str:
        return self.plan.identity.run_id

    def wall(self) -> float:
        """Seconds of training, those before this attempt included (work redone since the
        checkpoint counts in this attempt only)."""
        return self.wall_before + time.perf_counter() - self.started


def build_model(plan: Plan, n_keys: int) -> RetrievalModel:
    """A fresh model of the planned run (its map, memory and n_keys), initialised from torch's
    global generator."""
    mem = plan.memory
    return RetrievalModel(n_keys, plan.phi, mem.update_rule, mem.normalisation, mem.eps,
                          mem.key_eps, mem.chunk_size)


def initial_model(plan: Plan, n_keys: int, seed: int, dtype: torch.dtype) -> RetrievalModel:
    """The run's model as it stands before its first step: ``build_model`` after
    ``torch.manual_seed(seed)``, on the plan's device in ``dtype``."""
    torch.manual_seed(seed)
    return build_model(plan, n_keys).to(device=plan.device, dtype=dtype)


def probe_batch(plan: Plan, n_keys: int, seed: int):
    """The evaluation batch the diagnostics measure on: a stream of its own (seed +
    PROBE_OFFSET), so the training data stays the same."""
    tr = plan.trainer
    return RetrievalTask(n_keys, plan.seq_len, plan.eval_seq_len, plan.task.replacement,
                         seed + PROBE_OFFSET, plan.device).eval_batch(tr.eval_sequences,
                                                                      tr.eval_max_queries)


class _Run:
    """One run's own state in the loop: model, data stream, curve, stopping rule."""

    def __init__(self, m: Member, dtype: torch.dtype):
        self.m, p = m, m.plan
        tr, device, n_keys, seed = p.trainer, p.device, m.cfg.n_keys, m.cfg.seed
        self.model = initial_model(p, n_keys, seed, dtype)
        if hasattr(p.phi, "use_generator"):  # its redraws: its own stream, alone or packed
            p.phi.use_generator(torch.Generator(device).manual_seed(seed + REDRAW_OFFSET))
        self.task = RetrievalTask(n_keys, p.seq_len, p.eval_seq_len, p.task.replacement, seed,
                                  device)
        self.probe = probe_batch(p, n_keys, seed)
        self.initial = diagnostics.feature_ranks_of(self.model, self.probe)
        self.best, self.since_best, self.status, self.reason = math.inf, 0, "max_steps", None
        self.eval_loss = self.accuracy = math.nan
        self.steps = self.evaluated = m.start_step
        if m.checkpoint:
            self._restore(m.checkpoint)
        self.curve = m.run.curve(after=m.start_step if m.checkpoint else None)
        show = sys.stderr.isatty() if tr.progress == "auto" else tr.progress == "true"
        # a bar only when shown: tqdm's lock is a multiprocessing semaphore, which a sweep
        # worker stopped by SIGKILL would leak (the resource tracker then warns at exit)
        self.bar = tqdm(total=tr.max_steps, initial=self.steps, desc=m.rid[:40], leave=False,
                        unit="step") if show else None

    def state(self) -> dict:
        """The run's checkpoint but its Adam state (``checkpoint.py``), at an evaluation."""
        return {"identity": checkpoint.key(self.m.plan.identity),
                "device": str(self.m.plan.device),
                "step": self.steps, "wall_seconds": self.m.wall(), "resumes": self.m.resumes,
                "model": self.model.state_dict(),
                "task": [self.task.generator.get_state(), self.task.eval_generator.get_state()],
                "loop": {"best": self.best, "since_best": self.since_best,
                         "eval_loss": self.eval_loss, "accuracy": self.accuracy}}

    def _restore(self, saved: dict) -> None:
        self.model.load_state_dict(saved["model"])
        self.task.generator.set_state(saved["task"][0].cpu())
        self.task.eval_generator.set_state(saved["task"][1].cpu())
        loop = saved["loop"]
        self.best, self.since_best = loop["best"], loop["since_best"]
        self.eval_loss, self.accuracy = loop["eval_loss"], loop["accuracy"]

    def check(self, losses: list[float], step: int, seconds: float) -> bool:
        """The protocol at an evaluation after the training losses ``losses`` of the last steps
        up to ``step``: True when the run stops here (status and reason set)."""
        tr, n = self.m.plan.trainer, len(losses)
        self.steps = step
        bad = [i for i, v in enumerate(losses) if not math.isfinite(v)]
        if bad:
            self.steps = step - n + bad[0] + 1
            self.status, self.reason = "diverged", f"non-finite train loss at step {self.steps}"
            return True
        train_loss = sum(losses) / n
        self.eval_loss, self.accuracy = evaluate(self.model, self.task, tr)
        self.evaluated = step
        rate = n / seconds
        self.curve.write(step, train_loss, self.eval_loss, self.accuracy)
        LOG.info("%sstep %d: train loss %.4g, eval loss %.4g, eval accuracy %.4f (%.0f steps/s)",
                 self.prefix, step, train_loss, self.eval_loss, self.accuracy, rate)
        self.m.tracker.log({"train/loss": train_loss, "eval/loss": self.eval_loss,
                            "eval/accuracy": self.accuracy, "perf/steps_per_second": rate},
                           step=step)
        if self.bar is not None:
            self.bar.update(n)
            self.bar.set_postfix(eval_loss=f"{self.eval_loss:.4g}")
        if not math.isfinite(self.eval_loss):
            self.status, self.reason = "diverged", f"non-finite eval loss at step {step}"
            return True
        if self.eval_loss < self.best:
            self.best, self.since_best = self.eval_loss, 0
        else:
            self.since_best += 1
        if self.eval_loss <= tr.stop_loss:
            self.status = "converged"
            return True
        if self.since_best > tr.patience:
            self.status = "plateau"
            self.reason = f"no improvement on {self.best:.4g} for {self.since_best} evaluations"
            return True
        return False

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        self.curve.close()

    def result(self) -> dict:
        """Close the run's files; the summary fields the loop determines, diagnostics included."""
        self.close()
        ok = self.status != "diverged"
        found = dict.fromkeys(summary.DIAGNOSTICS)
        if not ok:
            self.reason += "; " + diagnostics.divergence(self.model, self.probe, self.evaluated)
        else:  # why it fails, measured from the trained model (diagnostics.py)
            found, details = diagnostics.measure(self.model, self.probe, self.initial)
            self.m.run.write_diagnostics(details)
        return {"status": self.status, "reason": self.reason, "steps": self.steps,
                "final_eval_loss": self.eval_loss if ok else None,
                "best_eval_loss": self.best if math.isfinite(self.best) else None,
                "final_eval_accuracy": self.accuracy if ok else None,
                "device": str(self.m.plan.device), **found}


def fit(members: list[Member]) -> Iterator[tuple[Member, dict]]:
    """The published protocol for a pack of runs (one run is a pack of one): each run draws
    its own batches, is evaluated and stopped on its own, and leaves the pack when it stops,
    yielding (member, its summary fields) at that moment; training goes on when the caller asks
    for the next. Members share everything but seed and n_keys (``pack.py``). Runs that
    continue checkpoints of different steps train as packs of one step each, one after the
    other: stacked parameters share Adam's step."""
    for start in sorted({m.start_step for m in members}):
        yield from _fit([m for m in members if m.start_step == start])


def _fit(members: list[Member]) -> Iterator[tuple[Member, dict]]:
    tr, mem = members[0].plan.trainer, members[0].plan.memory
    dtype = getattr(torch, tr.dtype)
    # denormal floats flushed in the training steps and elsewhere as trainer.flush_denormal says
    # (x86 and ARM CPUs; elsewhere a no-op); the caller restores the default
    flush = {training: flushes_denormals(tr.flush_denormal.lower(), mem.update_rule,
                                         mem.normalisation, training) for training in (True, False)}
    torch.set_flush_denormal(flush[False])
    for m in members:
        m.started = time.perf_counter()
    runs = [_Run(m, dtype) for m in members]
    for run in runs:
        run.prefix = f"{run.m.rid}: " if len(runs) > 1 else ""
    pack = Pack([run.model for run in runs])
    device = members[0].plan.device
    if compiles(tr.compile.lower(), device):
        pack.compile()
    opt = torch.optim.Adam(pack.parameters(), lr=tr.lr,
                           fused=device.type in ("cpu", "cuda"))  # one kernel for all params
    step = members[0].start_step
    if step:
        pack.load_adam_state(opt, [m.checkpoint["adam"] for m in members])
    for m in members:
        m.checkpoint = None  # restored: its memory is free
    window = torch.zeros(len(runs), tr.eval_every, device=device, dtype=dtype)
    numbers = numerics(device, len(runs), flush[True], pack.compiled is not None)
    t_window = saved = time.perf_counter()
    torch.set_flush_denormal(flush[True])
    try:
        while runs and step < tr.max_steps:
            step += 1
            losses = pack.losses([run.task.train_batch(tr.batch_size) for run in runs])
            opt.zero_grad(set_to_none=True)
            losses.sum().backward()  # a sum: each run's gradient is its own loss's
            opt.step()
            window[:, (step - 1) % tr.eval_every] = losses.detach()
            if step % tr.eval_every and step < tr.max_steps:
                continue
            torch.set_flush_denormal(flush[False])
            n = (step - 1) % tr.eval_every + 1
            seconds = time.perf_counter() - t_window
            rows = window[:len(runs), :n].tolist()  # one device sync per evaluation
            leaving = []
            for i, run in enumerate(runs):
                if all(map(math.isfinite, rows[i])):  # a diverged run's model keeps its last
                    pack.sync(i)                       # finite weights (diagnostics.divergence)
                if run.check(rows[i], step, seconds) or step >= tr.max_steps:
                    leaving.append(i)
            for i in leaving:
                yield runs[i].m, {**runs[i].result(), "numerics": numbers}
            if leaving:
                opt = pack.drop(leaving, opt)
                runs = [run for i, run in enumerate(runs) if i not in leaving]
                window = window[[i for i in range(window.shape[0]) if i not in leaving]]
            if tr.checkpoint_minutes is not None and \
                    time.perf_counter() - saved >= 60 * tr.checkpoint_minutes or \
                    interrupt.warned():
                for i, run in enumerate(runs):
                    checkpoint.write(run.m.run, {**run.state(), "adam": pack.adam_state(i, opt)})
                saved = time.perf_counter()
            if interrupt.warned():  # the scheduler's time limit (or a preemption) is near
                for run in runs:
                    line = (f"timed out {run.m.rid}: checkpointed at step {step}; the requeued "
                            "job continues from there")
                    print(line, flush=True)
                    LOG.info(line)
                interrupt.requeue()
            torch.set_flush_denormal(flush[True])
            t_window = time.perf_counter()
    finally:
        for run in runs:  # interrupted: close what is open, write no summary
            run.close()
