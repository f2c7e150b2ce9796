"""One job of a sweep, or one run: its runs planned once, claimed, trained as one pack, stored.

A job is a point and the ``pack_members`` the sweeper packed beside it (``members``). Each run
is planned (``plan.resolve``), then skipped (finished, claimed by another worker, a dry run),
recorded ``infeasible`` with its reason (a d_dot its map cannot reach), or claimed: its
directory (``RunDir``) is made ready, continuing from its checkpoint when it has a usable one.
The claimed runs train together (``runner.fit``); each run's summary is written the moment it
stops (``RunDir.finish``, which swaps a forced rerun in), its tracker closed and one line said.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from pathlib import Path

import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, open_dict
from threadpoolctl import threadpool_limits

from kernelzoo import config
from kernelzoo.config import UsageError
from kernelzoo.config.words import plural
from kernelzoo.records import files, progress, store, tracking
from kernelzoo.records.rundir import RunDir
from kernelzoo.training import checkpoint
from kernelzoo.training.devices import check_memory
from kernelzoo.training.packing import step_cost
from kernelzoo.training.plan import Infeasible, Plan, locate, resolve
from kernelzoo.training.runner import Member, build_model, fit

LOG = logging.getLogger("kernelzoo.train")  # a run's log file (train.log in its Hydra job directory)


def members(cfg: DictConfig) -> list[DictConfig]:
    """The runs of this job: the point itself, then one per ``pack_members`` entry [n_keys,
    seed] (the sweeper packs points that differ only there: ``pack.py``)."""
    out = []
    for n_keys, seed in [(cfg.n_keys, cfg.seed), *cfg.pack_members]:
        member = cfg.copy()
        with open_dict(member):
            member.n_keys, member.seed, member.pack_members = n_keys, seed, []
        out.append(member)
    return out


def run(cfg: DictConfig, echo=print, point: list[str] | None = None
        ) -> list[tuple[str, dict | None]]:
    """Plan, skip or claim, train (together, as one pack), store the job's runs: (run_id,
    summary or None when skipped) for each, each summary written the moment its run stops and,
    in a sweep (``point``: the job's overrides), its point indexed then (``index_run``): a sweep
    stopped while a pack trains knows the pack's runs that had stopped. In a pack, a member that
    cannot be claimed (a damaged summary, a full disk) is (None, {"status": "failed"}) and the
    others go on; a run alone raises."""
    outcomes: dict[int, tuple[str | None, dict | None]] = {}
    runs = members(cfg)

    def stopped(i: int, outcome: tuple[str | None, dict | None]) -> None:
        outcomes[i] = outcome
        if point is not None and outcome[0] is not None:
            index_run(cfg, runs[i], outcome[0], point)
    with contextlib.ExitStack() as claims:
        todo = []
        for i, c in enumerate(runs):
            try:
                got = _claim(c, claims, echo)
            except (UsageError, OSError) as err:  # e.g. a damaged summary: its pack goes on
                if len(runs) == 1:
                    raise
                print(f"failed: {files.one_line(err)}", file=sys.stderr)
                got = None, {"status": "failed"}
            if isinstance(got, tuple):
                stopped(i, got)
            else:
                todo.append((i, got))
        if todo:
            for m, summary in train_claimed([m for _, m in todo], echo):
                stopped([i for i, t in todo if t is m][0], (m.rid, summary))
    return [outcomes[i] for i in sorted(outcomes)]


def _claim(cfg: DictConfig, claims: contextlib.ExitStack, echo):
    """A Member ready to train (claimed, its directory ready), or (run_id, summary or None)
    when there is nothing to train."""
    p = resolve(cfg)
    if isinstance(p, Infeasible):
        return record_infeasible(cfg, p, echo)
    rid, run = locate(cfg, p.identity)
    inside(cfg, run.home)
    if cfg.dry_run:
        saved = None if run.is_done() or not cfg.resume else read_checkpoint(run, p)[0]
        d_dot = p.identity.d_dot if p.identity.d_dot is not None else "unbounded"
        echo(f"plan {rid}: d_dot {d_dot}, " + (
            "done" if run.is_done() else
            f"to train from its checkpoint at step {saved['step']}" if saved else "to train"))
        return rid, None
    config.writable(run.home)
    if run.is_done() and not cfg.force:
        try:
            summary = run.read_summary()
        except store.StoreError as err:
            raise UsageError(f"{err}; remove it or rerun with force=true") from None
        echo(f"skip {rid}: already finished ({summary['status']}); force=true reruns it")
        return rid, None
    if not claims.enter_context(run.claim()):
        echo(f"skip {rid}: another worker is running it")
        return rid, None
    saved = None
    if not run.is_done():
        saved, why = read_checkpoint(run, p) if cfg.resume else (None, None)
        line = None
        if why:
            line = f"restart {rid} from step 0: {why}"
        elif saved:
            line = (f"resume {rid}: from its checkpoint at step {saved['step']} "
                    f"({saved['wall_seconds'] / 60:.1f} min of training)")
        if line:  # to the console and the job's train.log
            echo(line)
            LOG.info(line)
        run.reset(keep_progress=saved is not None)
    elif cfg.force:  # the finished result stays in place until the new one is complete
        run.stage()
    else:
        echo(f"skip {rid}: finished by another worker")
        return rid, None
    run.write_config(OmegaConf.to_yaml(cfg, resolve=True))
    return Member(cfg, p, run, checkpoint=saved)


def read_checkpoint(run: RunDir, p: Plan) -> tuple[dict | None, str | None]:
    """``checkpoint.read`` of the planned run ``p``."""
    return checkpoint.read(run, p, lambda: build_model(p, p.config.n_keys))


def train_claimed(todo: list[Member], echo):
    """Train the claimed runs as one pack; yield (member, summary) as each stops: its summary
    is written (and a forced rerun swapped in) at that moment. A pack whose estimated memory
    exceeds the device's is refused first (UsageError), as ``plan`` refuses a run."""
    tr, device = todo[0].plan.trainer, todo[0].plan.device
    if len(todo) > 1:  # each run was checked alone (plan); together they hold more
        p = todo[0].plan
        check_memory(p.phi, p.memory, tr, p.task, device,
                     [(m.plan.config.n_keys, m.plan.seq_len, m.plan.eval_seq_len) for m in todo])
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    pack = f", a pack of {len(todo)}" if len(todo) > 1 else ""
    # the console hears of a pack's first run, train.log of each; wandb's line is the sweep's
    quiet = HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN
    for i, m in enumerate(todo):
        header = (f"run {m.rid}: {device}, {plural(tr.threads, 'thread')} of "
                  f"{plural(cores, 'core')}{pack}" + (f" (with {plural(len(todo) - 1, 'other')}"
                                                      ": train.log)" if pack and not i else ""))
        if not i:
            echo(header)
        LOG.info(header)
        m.tracker = _tracker(m, LOG.info if i or quiet else echo)
    try:
        with threadpool_limits(limits=tr.threads):  # torch's OpenMP pool and any BLAS alike
            torch.set_num_threads(tr.threads)
            for m, fields in fit(todo):
                yield m, _finish(m, fields, echo)
    finally:
        torch.set_flush_denormal(False)  # the process default again (fit flushes as set)
        for m in todo:
            if m.tracker is not None:  # stopped before its end: no summary
                m.tracker.finish(1)


def _finish(m: Member, fields: dict, echo) -> dict:
    """Store the stopped run ``m``'s summary, close its tracker, say one line."""
    summary = m.plan.identity.summary(m.cfg.experiment, **fields,
                                      wall_seconds=round(m.wall(), 3), resumes=m.resumes)
    m.run.finish(summary)
    m.tracker.summary({**{k: v for k, v in summary.items() if not isinstance(v, dict)},
                       "configuration": tracking.configuration_key(summary, m.cfg.trainer.lr)})
    m.tracker.finish(0)
    m.tracker = None
    loss = summary["final_eval_loss"]
    line = (f"done {m.rid}: {summary['status']} after {summary['steps']} steps, eval loss "
            f"{'-' if loss is None else f'{loss:.4g}'} ({summary['wall_seconds']:.1f} s)"
            + (f" [{summary['reason']}]" if summary["reason"] else ""))
    echo(line)
    LOG.info(line)
    if not (HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN):
        echo(f"stored in {m.run.home} (summary.json, curve.csv; results_dir= and experiment= "
             "choose another store)")  # a run alone: where it went, which no sweep line says
    return summary


def _tracker(m: Member, echo) -> tracking.Tracker:
    identity, cfg = m.plan.identity, m.cfg
    wandb_config = {**OmegaConf.to_container(cfg, resolve=True), "run_id": m.rid,
                    "d_dot": identity.d_dot, "predicted_capacity": identity.d_dot,
                    "feature_map_params": identity.feature_map_params}
    return tracking.start(cfg.logger.name == "wandb", cfg.results_dir,
                          project=cfg.logger.project, entity=cfg.logger.entity,
                          group=cfg.experiment, name=m.rid, config=wandb_config,
                          tags=[identity.feature_map, identity.memory["update_rule"]]
                          + (["stall_check"] if identity.stall_check_of else []),
                          echo=echo)


def inside(cfg: DictConfig, path: Path) -> None:
    """UsageError naming the link when ``path`` (a run's directory), or a directory above it in
    the store, is a symbolic link or leads out of results_dir (``store.guard``)."""
    try:
        store.guard(cfg.results_dir, path)
    except store.StoreError as err:
        raise UsageError(str(err)) from None


def record_infeasible(cfg: DictConfig, p: Infeasible, echo):
    """Store the infeasible record of the point ``p`` with its reason: (run_id, summary)."""
    rid, run = locate(cfg, p.identity)
    inside(cfg, run.home)
    if cfg.dry_run:
        echo(f"infeasible {rid}: {p.reason}")
        return rid, None
    config.writable(run.home)
    if run.is_done() and not cfg.force:
        echo(f"skip {rid}: already recorded infeasible")
        return rid, None
    summary = p.identity.summary(cfg.experiment, status="infeasible", reason=p.reason)
    with run.claim() as claimed:
        if claimed and (cfg.force or not run.is_done()):
            run.write_summary(summary)
    echo(f"infeasible {rid}: {p.reason}")
    return rid, summary


def index_run(cfg: DictConfig, member: DictConfig, rid: str, point: list[str]) -> None:
    """In a sweep, remember the run a job's point (the pack ``member``'s) resolved to
    (``store.index_point``)."""
    try:
        store.index_point(cfg.results_dir, cfg.experiment, member_point(point, member), rid)
    except OSError as err:  # only a rerun's shortcut is lost: it composes the point again
        print(f"warning: {files.one_line(err)}; the point is not indexed", file=sys.stderr)


def count_progress(cfg: DictConfig, sweep_dir: str) -> None:
    """At a job's end, print the sweep's progress line once, the job's runs counted."""
    line = None
    for c in members(cfg):
        line = progress.finished(sweep_dir, step_cost(c.n_keys)) or line
    if line:
        print(line)


def member_point(point: list[str], member: DictConfig) -> list[str]:
    """The sweep point (its overrides) of a pack member: the leader's, with the member's n_keys
    and seed (the only values a pack's members differ in)."""
    values = {"n_keys": member.n_keys, "seed": member.seed}
    key = lambda o: o.split("=", 1)[0]  # noqa: E731
    return [f"{key(o)}={values[key(o)]}" if key(o) in values else o for o in point]

