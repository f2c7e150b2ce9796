"""Train one configuration: ``python -m kernelzoo.train [overrides]`` (a Hydra app over conf/).

One run is one point of a sweep: config → plan (checked config, device, feature map, memory
estimate) → training with the published protocol → results store (+ wandb), all of it the job's
(``training/job.py``). The run's directory is ``<results_dir>/<experiment>/runs/<run_id>/``; a
finished run is skipped unless ``force=true``, which trains the new run beside it and swaps it in
when complete. A bad value fails before Hydra creates anything (``precheck``): one line, exit
code 2; in a sweep the sweeper checks every point before the first trains. A point that cannot
be built (a d_dot its map cannot reach) is recorded ``infeasible`` with the reason instead, exit
code 0. SIGTERM, SIGINT or SIGHUP stops a run or a sweep with one line (``interrupt.py``).
"""

from __future__ import annotations

import logging
import os
import secrets
import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from kernelzoo import config
from kernelzoo.config import UsageError
from kernelzoo.config.hydra_internals import args_parser
from kernelzoo.records import files, store
from kernelzoo.training import interrupt

# the job (training/job.py, which loads torch) is imported where a run starts: a sweep's own
# process plans and trains nothing when every point is done

# keeps simultaneous sweeps apart, in other PID namespaces too (a container's pids repeat the
# host's): the pid and a random token; cached, one per sweep
if not OmegaConf.has_resolver("pid"):
    OmegaConf.register_new_resolver("pid", lambda: f"{os.getpid()}-{secrets.token_hex(3)}",
                                    use_cache=True)


def precheck(argv: list[str]) -> None:
    """Compose and check the command line's config as Hydra will, before Hydra creates any
    directory; a bad value exits 2 with one line. A single run is planned too (device, feature
    map, memory estimate), then its results_dir is created and proved writable; a sweep's
    points are each checked by the sweeper. Hydra's own requests (--help, --cfg, --info, another
    config directory) are left to Hydra."""
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
            from kernelzoo.training import loading

            loading.load()
            from kernelzoo.training import job
            from kernelzoo.training.plan import resolve

            with config.as_job(cfg) as one:
                resolve(one)  # an infeasible point: the run records it, with its reason
                config.writable(one.results_dir)
                job.inside(one, store.experiment_dir(one.results_dir, one.experiment) / "hydra")
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    except OmegaConfBaseException as err:  # a value read here first: ${oc.env:UNSET}
        print(f"error: {config.describe(err, args.overrides)}", file=sys.stderr)
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
    from kernelzoo.training import job

    in_sweep = HydraConfig.get().mode == RunMode.MULTIRUN
    if in_sweep:
        interrupt.die_with_sweep()
        interrupt.survive_closed_output()  # a worker's output goes to the sweep's reader too
        interrupt.checkpoint_on_warning()  # a submitit job: checkpoint, then be requeued
    point = [o for o in config.task_overrides() if not o.startswith("pack_members=")] \
        if in_sweep and not cfg.dry_run else None
    try:
        outcomes = job.run(cfg, point=point)
    except (UsageError, OSError) as err:  # e.g. a damaged summary, a full disk
        print(f"{'failed' if in_sweep else 'error'}: {files.one_line(err)}", file=sys.stderr)
        if in_sweep:  # the other points still run
            return ["failed"] * len(job.members(cfg))
        sys.exit(2 if isinstance(err, UsageError) else 1)
    except Exception as err:
        if not in_sweep:
            raise
        # one broken point must not end a sweep: no summary is written, so a rerun retries it
        logging.getLogger(__name__).exception("run failed")
        print(f"failed: {type(err).__name__}: {err} (traceback in "
              f"{HydraConfig.get().runtime.output_dir})", file=sys.stderr)
        return ["failed"] * len(job.members(cfg))
    if point is not None:
        job.count_progress(cfg, HydraConfig.get().sweep.dir)
    return [summary["status"] if summary else None for _, summary in outcomes]


if __name__ == "__main__":
    # run the importable module's app, not __main__'s: process-pool launchers (joblib) pickle
    # the task function by reference and their workers import it as kernelzoo.train
    from kernelzoo.train import main as importable_main

    importable_main()
