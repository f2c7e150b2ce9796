"""The published training protocol (task-spec "Training") for one planned run.

``fit`` trains the model of a plan (``train.plan``) with Adam on fresh batches, evaluates every
``eval_every`` steps (``evaluate``), appends each evaluation to ``curve.csv``, and stops at the
first of: eval loss <= ``stop_loss`` (converged), more than ``patience`` evaluations without
improvement (plateau), ``max_steps`` (max_steps), a non-finite loss (diverged).
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time

import torch
from omegaconf import DictConfig
from tqdm import tqdm

from . import diagnostics, files, store, tracking
from .config import TrainerConf
from .model import RetrievalModel, retrieval_loss
from .task import RetrievalTask


LOG = logging.getLogger("kernelzoo.train")  # the run's train.log (its Hydra job directory)


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


def fit(cfg: DictConfig, p: dict, rid: str, path, tracker: tracking.Tracker) -> dict:
    """The published training protocol; returns the summary fields it determines."""
    tr, mem, device = p["trainer"], p["memory"], p["device"]
    dtype = getattr(torch, tr.dtype)
    torch.manual_seed(cfg.seed)
    phi = p["phi"]
    model = RetrievalModel(cfg.n_keys, phi, mem.update_rule, mem.normalisation, mem.eps,
                           mem.key_eps, mem.chunk_size).to(device=device, dtype=dtype)
    task = RetrievalTask(cfg.n_keys, p["seq_len"], p["eval_seq_len"], p["task"].replacement,
                         cfg.seed, device)
    # the diagnostics' sequences come from a stream of their own: training data stays the same
    probe = RetrievalTask(cfg.n_keys, p["seq_len"], p["eval_seq_len"], p["task"].replacement,
                          cfg.seed + 2_000_003, device).eval_batch(tr.eval_sequences,
                                                                   tr.eval_max_queries)
    initial = diagnostics.feature_ranks_of(model, probe)
    opt = torch.optim.Adam(model.parameters(), lr=tr.lr,
                           fused=device.type in ("cpu", "cuda"))  # one kernel for all params
    window = torch.zeros(tr.eval_every, device=device, dtype=dtype)
    curve = store.CurveWriter(path)
    show = sys.stderr.isatty() if tr.progress == "auto" else tr.progress == "true"
    bar = tqdm(total=tr.max_steps, desc=rid[:40], disable=not show, leave=False, unit="step")
    best, since_best, status, reason = math.inf, 0, "max_steps", None
    eval_loss = accuracy = math.nan
    step, t_window = 0, time.perf_counter()
    try:
        while step < tr.max_steps:
            step += 1
            batch = task.train_batch(tr.batch_size)
            y = model(batch.keys, batch.values, batch.query)
            loss = retrieval_loss(y, batch.target).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            window[(step - 1) % tr.eval_every] = loss.detach()
            if step % tr.eval_every and step < tr.max_steps:
                continue
            n = (step - 1) % tr.eval_every + 1
            losses = window[:n].tolist()  # one device sync per evaluation, not per step
            bad = [i for i, v in enumerate(losses) if not math.isfinite(v)]
            if bad:
                status, reason = "diverged", f"non-finite train loss at step {step - n + bad[0] + 1}"
                step = step - n + bad[0] + 1
                break
            train_loss = sum(losses) / n
            eval_loss, accuracy = evaluate(model, task, tr)
            rate = n / (time.perf_counter() - t_window)
            curve.write(step, train_loss, eval_loss, accuracy)
            LOG.info("step %d: train loss %.4g, eval loss %.4g, eval accuracy %.4f (%.0f steps/s)",
                     step, train_loss, eval_loss, accuracy, rate)
            tracker.log({"train/loss": train_loss, "eval/loss": eval_loss,
                         "eval/accuracy": accuracy, "perf/steps_per_second": rate}, step=step)
            bar.update(n)
            bar.set_postfix(eval_loss=f"{eval_loss:.4g}")
            if not math.isfinite(eval_loss):
                status, reason = "diverged", f"non-finite eval loss at step {step}"
                break
            if eval_loss < best:
                best, since_best = eval_loss, 0
            else:
                since_best += 1
            if eval_loss <= tr.stop_loss:
                status = "converged"
                break
            if since_best > tr.patience:
                status = "plateau"
                reason = f"no improvement on {best:.4g} for {since_best} evaluations"
                break
            t_window = time.perf_counter()
    finally:
        bar.close()
        curve.close()
    found = dict.fromkeys(diagnostics.FIELDS)
    if status != "diverged":  # why it fails, measured from the trained model (diagnostics.py)
        found, details = diagnostics.measure(model, probe, initial)
        files.atomic_write_text(path / "diagnostics.json", json.dumps(details, indent=1) + "\n")
    return {"status": status, "reason": reason, "steps": step,
            "final_eval_loss": eval_loss if status != "diverged" else None,
            "best_eval_loss": best if math.isfinite(best) else None,
            "final_eval_accuracy": accuracy if status != "diverged" else None,
            "device": str(device), **found}
