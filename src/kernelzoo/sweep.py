"""Run a named sweep, then analyse it: ``python -m kernelzoo.sweep <experiment> [overrides]``
(``kernelzoo-sweep``, ``make sweep``).

A thin front door over the Hydra app of ``kernelzoo.train``: it checks that
``experiments/<experiment>.yaml`` exists (listing the valid names if not), starts
``kernelzoo.train --multirun +experiments=<experiment> [overrides]``, and once the sweep has
ended, analyses the experiment that ran (``kernelzoo.analyze``): the name the composed config
gives it, so an ``experiment=<another name>`` among the overrides is the one analysed. A dry run,
or ``--no-analysis``, analyses nothing. Rerunning a sweep trains only what is missing.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass

from kernelzoo import config
from kernelzoo.config import EXPERIMENTS

NO_ANALYSIS = "--no-analysis"
SHOWS = ("--cfg", "-c", "--info", "-i", "--help", "-h", "--hydra-help")


def available() -> list[str]:
    return sorted(p.stem for p in EXPERIMENTS.glob("*.yaml"))


@dataclass(frozen=True)
class Ran:
    """What the sweep's config says of the experiment it writes: its name, its store, whether
    it trains, and the tracking the analysis should use."""

    experiment: str
    results_dir: str
    dry_run: bool
    logger: list[str]  # the logger overrides for the analysis: logger=<name>, logger.<key>=...


def composed(overrides: list[str]) -> Ran:
    """The sweep's config as Hydra composes it (UsageError with one line when it cannot)."""
    with config.as_job(config.compose("config", overrides, multirun=True)) as job:
        logger = [f"logger={job.logger.name}"] + [
            o for o in overrides if o.lstrip("+~").startswith("logger.")]
        return Ran(str(job.experiment), str(job.results_dir), bool(job.dry_run), logger)


def analyse(ran: Ran) -> int:
    """``python -m kernelzoo.analyze`` on the experiment that ran; its exit code."""
    return subprocess.call([sys.executable, "-m", "kernelzoo.analyze",
                            f"experiment={ran.experiment}", f"results_dir={ran.results_dir}",
                            *ran.logger])


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    usage = (f"usage: kernelzoo-sweep <experiment> [overrides] [{NO_ANALYSIS}]  "
             "(python -m kernelzoo.sweep)\n"
             f"experiments: {', '.join(available())}\n"
             "overrides: Hydra syntax, e.g. seed=1,2,3 launcher=local search=bisect "
             "grids=[0] dry_run=true experiment=<another name for the store>; --cfg job shows "
             "a point's config; `python -m kernelzoo.train --help` lists every config group\n"
             f"afterwards the experiment is analysed (report.md); {NO_ANALYSIS} skips that")
    if argv[:1] in (["-h"], ["--help"]):
        print(usage)
        sys.exit(0)
    if not argv or argv[0].startswith("-") or "=" in argv[0]:
        print(usage, file=sys.stderr)
        sys.exit(2)
    name, overrides = argv[0], [a for a in argv[1:] if a != NO_ANALYSIS]
    if name not in available():
        print(f"error: unknown experiment {name!r}; valid: {', '.join(available())}",
              file=sys.stderr)
        sys.exit(2)
    from kernelzoo import train

    # Hydra takes one mode: --cfg, --info or --help shows the experiment's config (its point
    # values as the experiment sets them), without a sweep
    shows = any(a in SHOWS or a.startswith(("--cfg=", "--info=")) for a in overrides)
    hydra_args = [f"+experiments={name}", *overrides]
    ran = None
    if not shows and NO_ANALYSIS not in argv:
        try:
            ran = composed(hydra_args)
        except config.UsageError as err:
            print(f"error: {err}", file=sys.stderr)
            sys.exit(2)
    sys.argv = [sys.argv[0], *([] if shows else ["--multirun"]), *hydra_args]
    train.main()
    if ran is not None and not ran.dry_run:
        sys.exit(analyse(ran))


if __name__ == "__main__":
    main()
