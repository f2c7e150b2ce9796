"""Weights & Biases glue, kept apart from training and analysis.

Mode: ``WANDB_MODE`` when set; otherwise ``online`` when the user is logged in (an API key in
``WANDB_API_KEY`` or in ``~/.netrc`` for the wandb host), else ``offline``. Never hard-coded.
Offline files go under ``<results_dir>/wandb`` and ``make sync`` uploads them (``SYNC``: in a
checkout; installed with pip, ``wandb sync`` does).

Without network, online runs would each wait for wandb's timeout. So before going online a
process checks that the server (or the proxy to it) answers a TCP connection within a few
seconds; the first failure warns once and leaves a marker, ``<results_dir>/wandb/unreachable``,
that sends every later run of the sweep (other workers included) and the analysis offline for
``OFFLINE_FOR`` seconds. A sweep checks afresh when it starts (``check_server``). A run that
still cannot start wandb warns and goes on untracked: the local results store is the source of
truth, wandb only a view of it. So does a run whose wandb fails later (its service killed, its
directory full): every call into wandb is contained (``Tracker``), one warning per process.
``<results_dir>/wandb`` is guarded like the store's runs/ (``guard_wandb``). An analysis'
dashboard is ``kernelzoo.report.dashboard``.
"""

from __future__ import annotations

import contextlib
import logging
import netrc
import os
import socket
import sys
import threading
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

from kernelzoo.config import CONF
from kernelzoo.records import files
from kernelzoo.records.files import StoreError
from kernelzoo.records.store import guard

# how offline runs are uploaded, as this installation can: make in a checkout, else wandb's own
SYNC = "`make sync`" if (CONF.parent / "Makefile").is_file() else \
    "`wandb sync <results_dir>/wandb/offline-run-*`"

PROJECT = "kernelzoo"
CONNECT_TIMEOUT = 3.0  # seconds for the server to answer
OFFLINE_FOR = 30 * 60  # seconds a failure keeps this results directory's runs offline


def server_url() -> str:
    return os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")


def logged_in() -> bool:
    """True when an API key is available without asking the network."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(server_url()).hostname
    path = os.environ.get("NETRC", str(Path.home() / ".netrc"))
    try:
        return netrc.netrc(path).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def guard_wandb(results_dir: str | Path) -> Path:
    """``<results_dir>/wandb``, where wandb writes its offline runs and debug logs, guarded like
    the store's runs/ (``store.guard``): StoreError where it, or anything on the way, is a link
    or not a directory."""
    return guard(results_dir, Path(results_dir) / "wandb")


def marker(results_dir: str | Path) -> Path:
    return Path(results_dir) / "wandb" / "unreachable"


def _unreachable_since(results_dir: str | Path) -> str | None:
    """When a recent failure to reach the server was recorded for ``results_dir``, or None."""
    try:
        age = time.time() - marker(results_dir).stat().st_mtime
    except OSError:
        return None
    return time.strftime("%H:%M", time.localtime(time.time() - age)) if age < OFFLINE_FOR else None


def _chosen_mode() -> tuple[str, str]:
    """(mode, why) as the environment and the login choose it."""
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"], "WANDB_MODE is set"
    if not logged_in():
        return "offline", f"not logged in to wandb (run `wandb login`, then {SYNC})"
    return "online", "logged in to wandb"


def resolve_mode(results_dir: str | Path | None = None) -> tuple[str, str]:
    """(mode, why): the wandb mode this process will use and the reason, for one log line:
    the chosen one, but offline while a recent failure to reach the server is recorded."""
    mode, why = _chosen_mode()
    since = _unreachable_since(results_dir) if results_dir is not None else None
    if mode == "online" and since:
        return "offline", (f"the wandb server was unreachable at {since}; {SYNC} uploads "
                           f"later, or remove {marker(results_dir)} to retry at once")
    return mode, why


def unreachable(url: str, timeout: float = CONNECT_TIMEOUT) -> str | None:
    """Why the server at ``url`` (through the proxy the environment names for it, if any)
    does not accept a connection within ``timeout`` seconds, name lookup included; None if it
    does."""
    target = urlparse(url)
    proxy = urllib.request.getproxies().get(target.scheme)
    if proxy and not urllib.request.proxy_bypass(target.hostname or ""):
        target = urlparse(proxy if "//" in proxy else f"http://{proxy}")
    port = target.port or (443 if target.scheme == "https" else 80)
    outcome: list[str | None] = []

    def connect():
        try:
            socket.create_connection((target.hostname, port), timeout=timeout).close()
            outcome.append(None)
        except OSError as err:
            outcome.append(err.strerror or str(err) or type(err).__name__)

    worker = threading.Thread(target=connect, daemon=True)  # name lookup ignores timeouts
    worker.start()
    worker.join(timeout)
    return outcome[0] if outcome else f"no answer in {timeout:g} s"


def _go_offline(results_dir: str | Path, problem: str) -> None:
    """Record the failure for the rest of the sweep, with the one warning it costs."""
    with contextlib.suppress(OSError, StoreError):  # no record: each run checks for itself
        guard_wandb(results_dir).mkdir(parents=True, exist_ok=True)
        files.atomic_write_text(marker(results_dir), f"{server_url()}: {problem}\n")
    print(f"warning: wandb server {server_url()} unreachable ({problem}); this run and the "
          f"rest of the sweep log offline to {Path(results_dir) / 'wandb'} for "
          f"{OFFLINE_FOR // 60} min ({SYNC} uploads them)", file=sys.stderr)


def check_server(results_dir: str | Path) -> None:
    """At the start of a sweep that would go online: reach the server once, afresh; on failure
    warn once and send the sweep's runs offline, on success clear an old failure."""
    if _chosen_mode()[0] != "online":
        return
    guard_wandb(results_dir)
    problem = unreachable(server_url())
    if problem:
        _go_offline(results_dir, problem)
    else:
        marker(results_dir).unlink(missing_ok=True)


def where(results_dir: str | Path, project: str = PROJECT) -> str:
    """One line for a sweep: where its runs log (each run's own line goes to its train.log)."""
    mode, why = resolve_mode(results_dir)
    to = {"offline": str(Path(results_dir) / "wandb"), "online": f"project {project}"}
    return f"wandb: {mode} ({why})" + (f" -> {to[mode]}" if mode in to else "")


def configuration_key(summary: dict, lr=None) -> str:
    """A run's configuration as one summary value to group and filter runs by on wandb: its map
    and parameters, d_key, d_dot, update rule and learning rate ("dpfp nu=1 d_key=16 d_dot=32
    sum lr=0.001"); the seed and n_keys are left out, so a configuration's runs share it."""
    params = ",".join(f"{k}={v}" for k, v in sorted((summary.get("feature_map_params") or {})
                                                    .items()))
    parts = [summary.get("feature_map"), params, f"d_key={summary.get('d_key')}",
             f"d_dot={summary.get('d_dot')}", summary.get("update_rule"),
             None if lr is None else f"lr={lr:g}"]
    return " ".join(str(p) for p in parts if p)


_WARNED: list[str] = []  # a process warns of wandb's failure once, however many runs it holds


def _warn(what: str, err: BaseException) -> None:
    if _WARNED:
        return
    first = str(err).strip().splitlines()[0] if str(err).strip() else ""
    _WARNED.append(what)
    print(f"warning: wandb {what} ({type(err).__name__}: {first}); the run goes on untracked, "
          "results are in the local store", file=sys.stderr)


class Tracker:
    """One wandb run; every method is a no-op when tracking is off or wandb failed to start.
    A call into wandb that fails (its service killed, its directory full) costs one warning
    line and turns the tracker off: the run trains on and writes its summary."""

    def __init__(self, run=None):
        self.run = run

    def _call(self, what: str, call) -> None:
        if self.run is None:
            return
        try:
            call(self.run)
        except Exception as err:  # wandb must never cost a run
            self.run = None
            _warn(f"failed to {what}", err)
            with contextlib.suppress(Exception):  # its service is gone or broken: let it go,
                import wandb  # and its exit hook with it (a traceback at exit otherwise)

                wandb.teardown(exit_code=1)

    def log(self, metrics: dict, step: int | None = None) -> None:
        self._call("log", lambda run: run.log(metrics, step=step))

    def summary(self, values: dict) -> None:
        self._call("write the summary", lambda run: run.summary.update(values))

    def finish(self, exit_code: int = 0) -> None:
        self._call("finish", lambda run: run.finish(exit_code=exit_code))
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
    try:  # wandb writes under <results_dir>/wandb: never through a link planted there
        files_dir = guard_wandb(results_dir)
    except StoreError as err:
        _warn("could not start", err)
        return Tracker()
    mode, why = resolve_mode(results_dir)
    if mode == "disabled":
        echo(f"wandb: disabled ({why})")
        return Tracker()
    if mode == "online":
        problem = unreachable(server_url())
        if problem:
            _go_offline(results_dir, problem)
            mode, why = resolve_mode(results_dir)
    wandb_dir = Path(results_dir).resolve()
    try:
        files_dir.mkdir(parents=True, exist_ok=True)
        guard_wandb(results_dir)  # made just now: still no link
        logging.raiseExceptions = False  # wandb's log handlers on a full disk: no tracebacks
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
            reinit="create_new",  # a pack trains (and logs) several runs at once
            settings=wandb.Settings(silent=True, console="off",
                                    init_timeout=float(os.environ.get("WANDB_INIT_TIMEOUT", 30))),
        )
    except Exception as err:  # wandb must never cost a run: the local store is complete anyway
        _warn("could not start", err)
        return Tracker()
    where = run.dir if mode == "offline" else getattr(run, "url", None) or run.dir
    echo(f"wandb: {mode} ({why}) -> {where}")
    return Tracker(run)
