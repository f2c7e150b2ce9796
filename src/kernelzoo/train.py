"""Train one configuration: ``python -m kernelzoo.train [overrides]`` (a Hydra app over conf/).

One run is one point of a sweep: config → plan (checked config, device, feature map, memory
estimate) → training with the published protocol (``runner.py``) → results store (+ wandb).
The run's directory is ``<results_dir>/<experiment>/runs/<run_id>/``; a finished run is skipped
unless ``force=true``, which trains the new run beside it and swaps it in when complete.
A bad value fails before Hydra creates anything (``precheck``): one line, exit code 2; in a
sweep the sweeper checks every point before the first trains. A point that cannot be built (a
d_dot its map cannot reach) is recorded ``infeasible`` with the reason instead, exit code 0.
SIGTERM, SIGINT or SIGHUP stops a run or a sweep with one line (``interrupt.py``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from pathlib import Path

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, open_dict
from threadpoolctl import threadpool_limits

from kernelzoo import config
from kernelzoo.records import files, interrupt, progress, store, tracking
from kernelzoo.training import checkpoint
from kernelzoo.config import UsageError
from kernelzoo.config.hydra_internals import args_parser
from kernelzoo.training.devices import check_memory
from kernelzoo.training.pack import step_cost
from kernelzoo.training.plan import Infeasible, Plan, locate, resolve, summary_of
from kernelzoo.training.runner import Member, build_model, fit
from kernelzoo.config.words import plural

if not OmegaConf.has_resolver("pid"):  # keeps simultaneous sweeps apart; cached: one per sweep
    OmegaConf.register_new_resolver("pid", os.getpid, use_cache=True)


LOG = logging.getLogger(__name__)  # a run's log file (train.log in its Hydra job directory)


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


def run(cfg: DictConfig, echo=print) -> list[tuple[str, dict | None]]:
    """Plan, skip or claim, train (together, as one pack), store the job's runs: (run_id,
    summary or None when skipped) for each, each summary written the moment its run stops. In
    a pack, a member that cannot be claimed (a damaged summary, a full disk) is (None,
    {"status": "failed"}) and the others go on; a run alone raises."""
    outcomes: dict[int, tuple[str | None, dict | None]] = {}
    runs = members(cfg)
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
                outcomes[i] = got
            else:
                todo.append((i, got))
        if todo:
            for i, rid, summary in train_claimed([m for _, m in todo], echo):
                outcomes[[j for j, m in todo if m.rid == rid][0]] = (rid, summary)
    return [outcomes[i] for i in sorted(outcomes)]


def _claim(cfg: DictConfig, claims: contextlib.ExitStack, echo):
    """A Member ready to train (claimed, its directory ready), or (run_id, summary or None)
    when there is nothing to train."""
    p = resolve(cfg)
    if isinstance(p, Infeasible):
        return record_infeasible(cfg, p.identity, p.reason, echo)
    rid, path = locate(cfg, p.identity)
    inside(cfg, path)
    if cfg.dry_run:
        saved = None if store.is_done(path) or not cfg.resume else \
            read_checkpoint(path, p, cfg)[0]
        echo(f"plan {rid}: d_dot {p.identity['d_dot']}, " + (
            "done" if store.is_done(path) else
            f"to train from its checkpoint at step {saved['step']}" if saved else "to train"))
        return rid, None
    config.writable(path)
    if store.is_done(path) and not cfg.force:
        try:
            summary = store.read_summary(path)
        except store.StoreError as err:
            raise UsageError(f"{err}; remove it or rerun with force=true") from None
        echo(f"skip {rid}: already finished ({summary['status']}); force=true reruns it")
        return rid, None
    if not claims.enter_context(store.Claim(path)):
        echo(f"skip {rid}: another worker is running it")
        return rid, None
    saved = None
    if not store.is_done(path):
        saved, why = read_checkpoint(path, p, cfg) if cfg.resume else (None, None)
        line = None
        if why:
            line = f"restart {rid} from step 0: {why}"
        elif saved:
            line = (f"resume {rid}: from its checkpoint at step {saved['step']} "
                    f"({saved['wall_seconds'] / 60:.1f} min of training)")
        if line:  # to the console and the job's train.log
            echo(line)
            LOG.info(line)
        store.reset(path, keep=("curve.csv", checkpoint.NAME) if saved else ())
        where = path
    elif cfg.force:  # the finished result stays in place until the new one is complete
        where = store.staging(path)
    else:
        echo(f"skip {rid}: finished by another worker")
        return rid, None
    files.atomic_write_text(where / "config.yaml", OmegaConf.to_yaml(cfg, resolve=True))
    return Member(cfg, p, rid, where, path, checkpoint=saved)


def read_checkpoint(path: Path, p: Plan, cfg: DictConfig) -> tuple[dict | None, str | None]:
    """``checkpoint.read`` of the planned run ``p`` at ``path``."""
    return checkpoint.read(path, p, lambda: build_model(p, cfg.n_keys))


def train_claimed(todo: list[Member], echo):
    """Train the claimed runs as one pack; yield (position, run_id, summary) as each stops:
    its summary is written (and a forced rerun swapped in) at that moment. A pack whose
    estimated memory exceeds the device's is refused first (UsageError), as ``plan`` refuses a
    run."""
    tr, device = todo[0].plan.trainer, todo[0].plan.device
    if len(todo) > 1:  # each run was checked alone (plan); together they hold more
        p = todo[0].plan
        check_memory(p.phi, p.memory, tr, p.task, device,
                     [(m.plan.config.n_keys, m.plan.seq_len, m.plan.eval_seq_len) for m in todo])
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    pack = f", a pack of {len(todo)}" if len(todo) > 1 else ""
    finished: list[tuple[int, str, dict]] = []
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

    def done(m: Member, fields: dict) -> None:
        summary = summary_of(m.cfg.experiment, m.plan.identity, m.rid, **fields,
                             wall_seconds=round(m.wall(), 3), resumes=m.resumes)
        store.write_summary(m.path, summary)
        checkpoint.remove(m.path)
        if m.path != m.home:
            store.swap_in(m.path, m.home)
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
        finished.append((todo.index(m), m.rid, summary))

    try:
        with threadpool_limits(limits=tr.threads):  # torch's OpenMP pool and any BLAS alike
            torch.set_num_threads(tr.threads)
            fit(todo, done)
    finally:
        torch.set_flush_denormal(False)  # the process default again (fit flushes as set)
        for m in todo:
            if m.tracker is not None:  # stopped before its end: no summary
                m.tracker.finish(1)
    return finished


def _tracker(m: Member, echo) -> tracking.Tracker:
    identity, cfg = m.plan.identity, m.cfg
    wandb_config = {**OmegaConf.to_container(cfg, resolve=True), "run_id": m.rid,
                    "d_dot": identity["d_dot"], "predicted_capacity": identity["d_dot"],
                    "feature_map_params": identity["feature_map_params"]}
    return tracking.start(cfg.logger.name == "wandb", cfg.results_dir,
                          project=cfg.logger.project, entity=cfg.logger.entity,
                          group=cfg.experiment, name=m.rid, config=wandb_config,
                          tags=[identity["feature_map"], identity["memory"]["update_rule"]]
                          + (["stall_check"] if identity.get("stall_check_of") else []),
                          echo=echo)


def inside(cfg: DictConfig, path: Path) -> None:
    """UsageError naming the link when the run directory ``path``, or a directory above it in
    the store, is a symbolic link or leads out of results_dir (``store.guard``)."""
    try:
        store.guard(cfg.results_dir, path)
    except store.StoreError as err:
        raise UsageError(str(err)) from None


def record_infeasible(cfg: DictConfig, identity: dict, reason: str, echo):
    rid, path = locate(cfg, identity)
    inside(cfg, path)
    if cfg.dry_run:
        echo(f"infeasible {rid}: {reason}")
        return rid, None
    config.writable(path)
    if store.is_done(path) and not cfg.force:
        echo(f"skip {rid}: already recorded infeasible")
        return rid, None
    summary = summary_of(cfg.experiment, identity, rid, status="infeasible", reason=reason)
    with store.Claim(path) as claimed:
        if claimed and (cfg.force or not store.is_done(path)):
            store.write_summary(path, summary)
    echo(f"infeasible {rid}: {reason}")
    return rid, summary


def precheck(argv: list[str]) -> None:
    """Compose and check the command line's config as Hydra will, before Hydra creates any
    directory; a bad value exits 2 with one line. A single run is planned too (device, feature
    map, memory estimate), then its results_dir is created and proved writable; a sweep's
    points are each checked by the sweeper. Hydra's own requests (--help, --cfg, --info, another config
    directory) are left to Hydra."""
    args = args_parser().parse_args(argv)
    if any((args.help, args.hydra_help, args.cfg, args.info, args.shell_completion,
            args.experimental_rerun, args.config_path, args.config_dir)):
        return
    try:
        cfg = config.compose(args.config_name or "config", args.overrides, args.multirun)
        config.check_chdir(cfg)
        config.check_store_place(cfg)
        if not args.multirun:
            if cfg.stall_check and cfg.hydra.mode != RunMode.MULTIRUN:
                raise UsageError("stall_check=true: a single run has no sweep whose stalled runs "
                                 "it could check; valid: in a sweep, python -m kernelzoo.sweep "
                                 "<experiment> stall_check=true")
            with config.as_job(cfg) as job:
                resolve(job)  # an infeasible point: the run records it, with its reason
                config.writable(job.results_dir)
                inside(job, store.experiment_dir(job.results_dir, job.experiment) / "hydra")
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)


def main() -> None:
    """Console entry point (``kernelzoo-train``); also what ``kernelzoo.sweep`` starts."""
    interrupt.survive_closed_output()
    sys.argv[1:] = config.expand_home(sys.argv[1:])  # before Hydra reads them too
    with interrupt.handled():
        try:
            precheck(sys.argv[1:])
            _app()
        except interrupt.Interrupted as stop:
            print(f"interrupted: {stop}", file=sys.stderr)
            sys.exit(stop.exit_code)


@hydra.main(config_path=str(config.CONF), config_name="config", version_base="1.3")
def _app(cfg: DictConfig) -> list[str | None]:
    """Entry point; returns the status of each of the job's runs (None when skipped) for the
    sweep's totals."""
    in_sweep = HydraConfig.get().mode == RunMode.MULTIRUN
    if in_sweep:
        interrupt.die_with_sweep()
        interrupt.survive_closed_output()  # a worker's output goes to the sweep's reader too
        interrupt.checkpoint_on_warning()  # a submitit job: checkpoint, then be requeued
    try:
        outcomes = run(cfg)
    except (UsageError, OSError) as err:  # e.g. a damaged summary, a full disk
        print(f"{'failed' if in_sweep else 'error'}: {files.one_line(err)}", file=sys.stderr)
        if in_sweep:  # the other points still run
            return ["failed"] * len(members(cfg))
        sys.exit(2 if isinstance(err, UsageError) else 1)
    except Exception as err:
        if not in_sweep:
            raise
        # one broken point must not end a sweep: no summary is written, so a rerun retries it
        logging.getLogger(__name__).exception("run failed")
        print(f"failed: {type(err).__name__}: {err} (traceback in "
              f"{HydraConfig.get().runtime.output_dir})", file=sys.stderr)
        return ["failed"] * len(members(cfg))
    if in_sweep and not cfg.dry_run:
        point = [o for o in config.task_overrides() if not o.startswith("pack_members=")]
        line = None  # one progress line per job: its runs counted
        for c, (rid, _) in zip(members(cfg), outcomes):
            try:
                if rid is not None:  # None: a pack member that failed, said above
                    store.index_point(cfg.results_dir, cfg.experiment, member_point(point, c),
                                      rid)
            except OSError as err:  # only a rerun's shortcut is lost: it composes the point again
                print(f"warning: {files.one_line(err)}; the point is not indexed", file=sys.stderr)
            line = progress.finished(HydraConfig.get().sweep.dir, step_cost(c.n_keys)) or line
        if line:
            print(line)
    return [summary["status"] if summary else None for _, summary in outcomes]


def member_point(point: list[str], member: DictConfig) -> list[str]:
    """The sweep point (its overrides) of a pack member: the leader's, with the member's n_keys
    and seed (the only values a pack's members differ in)."""
    values = {"n_keys": member.n_keys, "seed": member.seed}
    key = lambda o: o.split("=", 1)[0]  # noqa: E731
    return [f"{key(o)}={values[key(o)]}" if key(o) in values else o for o in point]


if __name__ == "__main__":
    # run the importable module's app, not __main__'s: process-pool launchers (joblib) pickle
    # the task function by reference and their workers import it as kernelzoo.train
    from kernelzoo.train import main as importable_main

    importable_main()
