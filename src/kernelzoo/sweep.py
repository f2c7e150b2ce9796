"""Run a named sweep, then analyse it: ``python -m kernelzoo.sweep <experiment> [overrides]``
(``kernelzoo-sweep``, ``make sweep``).

A thin front door over the Hydra app of ``kernelzoo.train``: it finds
``<experiment>.yaml`` among the packaged experiments (``experiments/``) or in the user's folder
(``experiments_dir=<folder>``; by default ``./experiments/`` of the working directory, when it
is not the packaged one), listing the valid names if neither has it, starts
``kernelzoo.train --multirun +experiments=<experiment> [overrides]`` (a user's experiment: its
folder's parent on Hydra's search path, so config groups beside the folder, e.g. a
``feature_map/`` of the user's maps, are found too), and once the sweep has
ended, analyses the experiment that ran (``kernelzoo.analyze``): the name the composed config
gives it, so an ``experiment=<another name>`` among the overrides is the one analysed, unless no
run changed since its last analysis. A dry run, or ``--no-analysis``, analyses nothing. Rerunning a sweep trains only what is missing.

A sweep may also be defined by overrides alone, ``kernelzoo-sweep experiment=<name> <overrides>``
(``ask``): no experiment file, the published protocol (``trainer=paper``) unless the overrides
choose another (``trainer=quick``: quick's shortened one), under the name the user gives.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser

from kernelzoo import config
from kernelzoo.config import EXPERIMENTS
from kernelzoo.records import analysed

NO_ANALYSIS = "--no-analysis"
SHOWS = ("--cfg", "-c", "--info", "-i", "--help", "-h", "--hydra-help")


FOLDER_KEY = "experiments_dir"  # a front-door override: the user's folder of experiments
GROUP = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


def available() -> list[str]:
    """The packaged experiments."""
    return sorted(p.stem for p in EXPERIMENTS.glob("*.yaml"))


def user_folder(overrides: list[str]) -> tuple[Path | None, list[str]]:
    """The user's folder of experiments (``experiments_dir=``, else ``./experiments`` when it
    exists and is not the packaged folder) and the overrides without ``experiments_dir``;
    UsageError when the folder named is none."""
    given = [o for o in overrides if o.partition("=")[0] == FOLDER_KEY]
    rest = [o for o in overrides if o not in given]
    if given:
        folder = Path(given[-1].partition("=")[2]).expanduser()
        if not folder.is_dir():
            raise config.UsageError(f"{given[-1]} is no folder; valid: the folder of your "
                                    "experiment YAMLs")
    else:
        folder = Path("experiments")
        if not folder.is_dir():
            return None, rest
    folder = folder.resolve()
    return (None if folder == EXPERIMENTS.resolve() else folder), rest


def user_experiments(folder: Path | None) -> dict[str, Path]:
    return {} if folder is None else {p.stem: p for p in sorted(folder.glob("*.yaml"))}


def read_experiment(path: Path) -> dict:
    """The experiment YAML at ``path``, read as every store file is (``files.read_text``: a
    regular file of bounded size, never a FIFO or a link) and parsed within
    ``loaders.load_yaml``'s limits (no tags, no alias bomb); UsageError naming the file and
    what is wrong, before Hydra reads it."""
    import yaml

    from kernelzoo.records import files, loaders

    try:
        value = loaders.load_yaml(files.read_text(path))
    except (OSError, files.StoreError, loaders.LimitError, yaml.YAMLError) as err:
        why = files.one_line(err).splitlines()[0].removeprefix(f"{path}: ")
        raise config.UsageError(f"{path}: cannot be read as an experiment ({why}); valid: a "
                                "YAML file of a mapping, e.g. a copy of a packaged experiment"
                                ) from None
    if not isinstance(value, dict):
        raise config.UsageError(f"{path}: not a mapping of settings; valid: a YAML file of a "
                                "mapping, e.g. a copy of a packaged experiment")
    return value


def store_name(overrides: list[str]) -> str | None:
    """The store name the overrides give (the last ``experiment=``, ``+experiment=`` or
    ``++experiment=``), None without one."""
    names = [o.partition("=")[2] for o in overrides if o.partition("=")[0].lstrip("+")
             == "experiment"]
    return names[-1] if names else None


def not_anothers(store: str, name: str, folder: Path | None, where: str) -> None:
    """UsageError when the store ``store`` that sweep ``name`` would write is another
    experiment's (packaged, or one of the user's): its runs would mix into that store and its
    report be rewritten for the mixture."""
    if store != name and store in {*available(), *user_experiments(folder)}:
        raise config.UsageError(
            f"{where} names experiment {store!r}, whose store this sweep would mix into; valid: "
            f"kernelzoo-sweep {store} to run it, or a new name for this sweep's store")


def choose(name: str, folder: Path | None, overrides: list[str]) -> list[str]:
    """The Hydra arguments that run experiment ``name``: ``+experiments=<name>`` for a
    packaged one; for one of the user's folder, that folder's parent added to Hydra's search
    path, the folder as the config group, and ``experiment=<name>`` unless its YAML names the
    store itself. UsageError naming what would be valid otherwise."""
    mine = user_experiments(folder)
    if store_name(overrides) is not None:
        not_anothers(store_name(overrides), name, folder, f"experiment={store_name(overrides)}")
    if name in mine and name in available():
        if read_experiment(mine[name]) != read_experiment(EXPERIMENTS / f"{name}.yaml"):
            raise config.UsageError(
                f"experiment {name!r} is both in {folder} and packaged with kernelzoo; valid: "
                f"another name for {mine[name]}")
        del mine[name]
    if name in available():
        return [f"+experiments={name}", *overrides]
    if name not in mine:
        where = f"; yours in {folder}: {', '.join(mine) or 'none'}" if folder else \
            f" (yours: in ./experiments/ or {FOLDER_KEY}=<folder>)"
        raise config.UsageError(f"unknown experiment {name!r}; valid: {', '.join(available())}"
                                + where)
    group = folder.name
    taken = {p.name for p in config.CONF.iterdir() if p.is_dir()} - {"experiments"}
    if not GROUP.fullmatch(group) or group in taken:
        raise config.UsageError(
            f"{FOLDER_KEY}={folder}: Hydra reads the folder's name, {group!r}, as a config "
            "group; valid: a folder named experiments, or letters, digits, _ and - other than "
            + ", ".join(sorted(taken)))
    searchpath = [f"file://{folder.parent}"]
    for o in [o for o in overrides if o.lstrip("+").partition("=")[0] == "hydra.searchpath"]:
        value = OverridesParser.create().parse_override(o).value()
        searchpath = [*(value if isinstance(value, list) else [value]), *searchpath]
        overrides = [x for x in overrides if x != o]
    own = read_experiment(mine[name])
    named = "experiment" in own
    if named:
        not_anothers(str(own["experiment"]), name, folder,
                     f"{mine[name]} (experiment: {own['experiment']})")
    return ["hydra.searchpath=[" + ",".join(f"'{p}'" for p in searchpath) + "]",
            f"+{group}={name}", *([] if named else [f"experiment={name}"]), *overrides]


def ask(folder: Path | None, overrides: list[str]) -> list[str]:
    """The Hydra arguments of a sweep defined by ``overrides`` alone: they must name it
    (``experiment=<name>``, not an experiment's own name, whose store it would mix into); its
    protocol is the published one (``trainer=paper``) unless they choose another."""
    names = [store_name(overrides)] if store_name(overrides) is not None else []
    if not names:
        raise config.UsageError(
            "a sweep of overrides alone needs a name for its store; valid: experiment=<name>, "
            "e.g. kernelzoo-sweep experiment=my_question feature_map=elu d_key=16 n_keys=4,64 "
            "search=bisect")
    if names[-1] in {*available(), *user_experiments(folder)}:
        raise config.UsageError(
            f"experiment={names[-1]} names an experiment of its own, whose store this sweep "
            f"would mix into; valid: kernelzoo-sweep {names[-1]} [overrides] to run it, or "
            "another name")
    return overrides


def on_path(folders: list[Path]) -> None:
    """Put ``folders`` (the working directory, the user's experiments folder's parent) on the
    import path of this process and of every process it starts (PYTHONPATH): a map of the
    user's own named by ``feature_map._target_`` is a .py file there, imported by each worker
    that builds it (``catalog.load_target``), with no package to install."""
    for folder in reversed([str(f) for f in folders]):
        if folder not in sys.path:
            sys.path.insert(0, folder)
    known = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [*(str(f) for f in folders if str(f) not in known), *filter(None, known)])


def one_point(arguments: list[str]) -> tuple[list[str], list[str]]:
    """``arguments`` with each swept override (``seed=1,2``, ``n_keys=range(4,10)``) at its first
    value, and those values as "seed=1": ``--cfg`` shows one point's config, where Hydra answered
    a swept axis with "add --multirun". An interval sweep has no first value: left as it is."""
    parser, out, chosen = OverridesParser.create(), [], []
    for a in arguments:
        try:
            [o] = parser.parse_overrides([a])
            first = next(iter(o.sweep_string_iterator())) if o.is_sweep_override() else None
        except Exception:  # noqa: BLE001 - not an override, or no first value: Hydra says
            first = None
        if first is None:
            out.append(a)
        else:
            out.append(f"{o.get_key_element()}={first}")
            chosen.append(out[-1])
    return out, chosen


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
    """``python -m kernelzoo.analyze`` on the experiment that ran, unless no run changed since
    its last analysis with these arguments, the sweep's or ``make plots``' (``records.analysed``,
    which the analysis marks: a rerun that trained nothing costs nothing); its exit code."""
    arguments = [f"experiment={ran.experiment}", f"results_dir={ran.results_dir}", *ran.logger]
    exp_dir = Path(ran.results_dir) / ran.experiment
    stamp = analysed.arguments(ran.experiment, ran.results_dir,
                               ran.logger[0].partition("=")[2], ran.logger[1:])
    if analysed.up_to_date(exp_dir, stamp):
        print(f"the analysis of {exp_dir} is up to date: no run changed since (make plots "
              "re-analyses)")
        return 0
    return subprocess.call([sys.executable, "-m", "kernelzoo.analyze", *arguments])


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    usage = (f"usage: kernelzoo-sweep <experiment> [overrides] [{NO_ANALYSIS}]  "
             "(python -m kernelzoo.sweep)\n"
             f"       kernelzoo-sweep experiment=<your name> <overrides> [{NO_ANALYSIS}]  (a "
             "sweep of overrides alone, with the published protocol unless trainer=... says "
             "otherwise)\n"
             f"experiments: {', '.join(available())}; yours: a YAML in ./experiments/ or in "
             f"{FOLDER_KEY}=<folder>\n"
             "overrides: Hydra syntax, e.g. seed=1,2,3 launcher=local search=bisect "
             "grids=[0] dry_run=true experiment=<another name for the store>; --cfg job shows "
             "a point's config; `python -m kernelzoo.train --help` lists every config group\n"
             f"afterwards the experiment is analysed (report.md); {NO_ANALYSIS} skips that")
    if argv[:1] in (["-h"], ["--help"]):
        print(usage)
        sys.exit(0)
    if not argv or argv[0].startswith("-"):
        print(usage, file=sys.stderr)
        sys.exit(2)
    adhoc = "=" in argv[0]  # overrides alone: a sweep of the user's own, named by experiment=
    name, overrides = ("", argv) if adhoc else (argv[0], argv[1:])
    overrides = [a for a in overrides if a != NO_ANALYSIS]
    # Hydra takes one mode: --cfg, --info or --help shows the experiment's config (its point
    # values as the experiment sets them), without a sweep
    shows = any(a in SHOWS or a.startswith(("--cfg=", "--info=")) for a in overrides)
    ran = None
    try:
        folder, overrides = user_folder(overrides)
        hydra_args = ask(folder, overrides) if adhoc else choose(name, folder, overrides)
        if not shows and NO_ANALYSIS not in argv:
            ran = composed(hydra_args)
    except config.UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    from kernelzoo import train

    on_path([Path.cwd(), *([folder.parent] if folder else [])])
    if shows:
        hydra_args, chosen = one_point(hydra_args)
        if chosen:
            print(f"showing the point {' '.join(chosen)}, the first of each swept axis "
                  "(dry_run=true lists every point)", file=sys.stderr)
    sys.argv = [sys.argv[0], *([] if shows else ["--multirun"]), *hydra_args]
    train.main()
    if ran is not None and not ran.dry_run:
        sys.exit(analyse(ran))


if __name__ == "__main__":
    main()
