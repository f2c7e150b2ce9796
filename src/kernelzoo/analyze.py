"""Capacity analysis of one experiment: failure points, tables, figures, report, dashboard.

    python -m kernelzoo.analyze experiment=<name> [results_dir=results] [threshold=0.01]
                                [accuracy_threshold=0.99] [logger=wandb|none] [figures=false]

Checks the command line against ``kernelzoo.config.AnalyzeConfig``, reads the store once
(``analysis.pipeline.analyse``: the summaries, configs and records of
``<results_dir>/<experiment>/``; never the trainer or the model), writes runs.parquet,
capacity.csv, scaling.csv, factorial.csv, the figures and report.md beside them
(``report.outputs``) and logs the dashboard (``report.dashboard``). The rules are in
docs/analysis.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from kernelzoo import config
from kernelzoo.analysis.pipeline import analyse
from kernelzoo.config.hydra_internals import args_parser
from kernelzoo.training import interrupt
from kernelzoo.records import analysed
from kernelzoo.records.files import one_line
from kernelzoo.records.store import experiment_dir
from kernelzoo.report import dashboard, outputs
from kernelzoo.config.words import plural


def analyze(cfg: DictConfig) -> None:
    """Analyse the experiment's store, write its outputs and log its dashboard."""
    exp_dir = experiment_dir(cfg.results_dir, cfg.experiment)
    reference = experiment_dir(cfg.get("reference_dir") or exp_dir.parent, cfg.experiment)
    a = analyse(exp_dir, cfg.experiment, cfg.threshold, cfg.accuracy_threshold,
                None if reference.resolve() == exp_dir.resolve() else reference / "capacity.csv")
    for line in a.set_aside:
        print(f"warning: {line}", file=sys.stderr)
    for line in a.damaged:
        print(f"warning: skipped damaged file: {line}", file=sys.stderr)
    if a.runs.empty:
        print(f"nothing to analyse in {exp_dir / 'runs'}: {plural(len(a.missing), 'run')} without "
              f"summary, {len(a.damaged)} damaged", file=sys.stderr)
        return
    report, figures = outputs.write(a, figures=cfg.get("figures", True))
    extra = list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []
    analysed.mark(exp_dir, analysed.arguments(cfg.experiment, str(cfg.results_dir),
                                              cfg.logger.get("name"), extra))
    print(f"analysed {plural(len(a.runs), 'run')} of {cfg.experiment} -> {report}")
    if cfg.logger.get("name") != "none":
        dashboard.log_dashboard(cfg, dashboard.dashboard_tables(a.runs, a.capacity,
                                                                list(a.families)), figures)


def _experiments(results_dir: str) -> str:
    root = Path(results_dir)
    if not root.is_dir():
        return f"results_dir {root} does not exist"
    names = sorted(p.name for p in root.iterdir() if (p / "runs").is_dir())
    return f"experiments in {root}: {', '.join(names) or 'none'}"


def validate(cfg: DictConfig) -> str | None:
    """The first problem with ``cfg`` (composed, without its hydra node) as one line, or None."""
    if OmegaConf.is_missing(cfg, "experiment"):
        return f"experiment=<name> is required ({_experiments(cfg.results_dir)})"
    try:
        config.check(cfg, config.AnalyzeConfig)
    except config.UsageError as err:
        return str(err)
    runs_dir = experiment_dir(cfg.results_dir, cfg.experiment) / "runs"
    if not runs_dir.is_dir():
        return (f"unknown experiment {cfg.experiment!r}: no {runs_dir} "
                f"({_experiments(cfg.results_dir)})")
    return None


@hydra.main(config_path=str(config.CONF), config_name="analyze", version_base="1.3")
def _hydra_main(cfg: DictConfig) -> None:
    try:
        analyze(cfg)
    except OSError as err:  # a full disk: the outputs written so far are whole, the rest old
        print(f"kernelzoo-analyze: error: {one_line(err)}; the outputs written before it are "
              f"newer than report.md ({outputs.INCOMPLETE} says so): run it again once that is "
              "mended", file=sys.stderr)
        sys.exit(1)


def main() -> None:
    """Console entry point: the command line is composed and checked as Hydra will run it, so
    a bad value is one line and exit code 2 before anything is read or written."""
    sys.argv[1:] = config.expand_home(sys.argv[1:])  # before Hydra reads them too
    args = args_parser().parse_args(sys.argv[1:])
    if args.help:  # what the analysis takes and writes, not Hydra's listing of train's groups
        title, usage = __doc__.split("\n\n")[:2]
        print(f"usage:\n{usage}\n\n{title} Writes runs.parquet, capacity.csv, scaling.csv, the "
              "figures and report.md into <results_dir>/<experiment>/.\n"
              f"{_experiments(config.compose('analyze', []).results_dir)}")
        sys.exit(0)
    if not any((args.help, args.hydra_help, args.cfg, args.info, args.shell_completion,
                args.config_path, args.config_dir)):
        try:
            with config.as_job(config.compose("analyze", args.overrides)) as job:
                error = validate(job)
        except config.UsageError as err:
            error = str(err)
        if error:
            print(f"kernelzoo-analyze: error: {error}", file=sys.stderr)
            sys.exit(2)
    with interrupt.handled():  # a file being written is removed, the others stay whole
        try:
            _hydra_main()
        except interrupt.Interrupted as stop:
            print(f"kernelzoo-analyze: stopped by {stop.name}; every output written is whole "
                  "(the old file or the new), and a rerun writes them all", file=sys.stderr)
            sys.exit(stop.exit_code)


if __name__ == "__main__":
    main()
