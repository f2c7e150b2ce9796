"""Weights & Biases glue, kept apart from training and analysis.

Mode: ``WANDB_MODE`` when set; otherwise ``online`` when the user is logged in (an API key in
``WANDB_API_KEY`` or in ``~/.netrc`` for the wandb host), else ``offline``. Never hard-coded.
Offline files go under ``<results_dir>/wandb`` and ``make sync`` uploads them. A run that
cannot reach wandb (no network, bad login) warns once and goes on untracked: the local results
store is the source of truth, wandb only a view of it.
"""

from __future__ import annotations

import netrc
import os
import sys
from pathlib import Path
from urllib.parse import urlparse

PROJECT = "kernelzoo"


def logged_in() -> bool:
    """True when an API key is available without asking the network."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    path = os.environ.get("NETRC", str(Path.home() / ".netrc"))
    try:
        return netrc.netrc(path).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def resolve_mode() -> tuple[str, str]:
    """(mode, why): the wandb mode this process will use and the reason, for one log line."""
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"], "WANDB_MODE is set"
    if logged_in():
        return "online", "logged in to wandb"
    return "offline", "not logged in to wandb (run `wandb login`, then `make sync`)"


class Tracker:
    """One wandb run; every method is a no-op when tracking is off or wandb failed to start."""

    def __init__(self, run=None):
        self.run = run

    def log(self, metrics: dict, step: int | None = None) -> None:
        if self.run is not None:
            self.run.log(metrics, step=step)

    def summary(self, values: dict) -> None:
        if self.run is not None:
            self.run.summary.update(values)

    def finish(self, exit_code: int = 0) -> None:
        if self.run is not None:
            self.run.finish(exit_code=exit_code)
            self.run = None


def start(
    enabled: bool,
    results_dir: str | Path,
    *,
    project: str = PROJECT,
    entity: str | None = None,
    group: str,
    name: str,
    config: dict,
    tags: list[str] | None = None,
    job_type: str = "train",
    echo=print,
) -> Tracker:
    """Start a wandb run (or a disabled tracker) and say in one line where it goes."""
    if not enabled:
        return Tracker()
    mode, why = resolve_mode()
    if mode == "disabled":
        echo(f"wandb: disabled ({why})")
        return Tracker()
    wandb_dir = Path(results_dir).resolve()
    wandb_dir.mkdir(parents=True, exist_ok=True)
    try:
        import wandb

        run = wandb.init(
            project=project,
            entity=entity,
            group=group,
            name=name,
            id=None,
            config=config,
            tags=tags,
            job_type=job_type,
            dir=str(wandb_dir),
            mode=mode,
            reinit="finish_previous",
            settings=wandb.Settings(silent=True, console="off",
                                    init_timeout=float(os.environ.get("WANDB_INIT_TIMEOUT", 30))),
        )
    except Exception as err:  # wandb must never cost a run: the local store is complete anyway
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        print(f"warning: wandb could not start ({type(err).__name__}: {first}); "
              "the run goes on, results are in the local store", file=sys.stderr)
        return Tracker()
    where = run.dir if mode == "offline" else getattr(run, "url", None) or run.dir
    echo(f"wandb: {mode} ({why}) -> {where}")
    return Tracker(run)
