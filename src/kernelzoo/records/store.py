"""The local results store: one directory per run, independent of wandb.

Layout: ``<results_dir>/<experiment>/runs/<run_id>/``, one directory per run, written by
``rundir.RunDir`` alone (its files and their order are described there); this module names the
places (``run_id``, ``run_dir``, the point index), reads what a run left (``is_done``,
``read_summary``, ``read_config``) and guards the store: a run directory, ``runs/`` or the
experiment directory that is a link is refused before anything is written or deleted
(``guard``), and deletion removes a link, never what it points to (``remove``). Everything is
plain text (YAML, CSV, JSON) but the checkpoint, which torch reads with ``weights_only``:
reading results never executes code.

Every file is written and read through ``files.py``: whole, or reported as damaged.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
from pathlib import Path

import yaml

from kernelzoo.config import CONF, EXPERIMENTS, is_name
from kernelzoo.records import summary as summary_schema
from kernelzoo.records.files import StoreError, atomic_write_text, one_line, read_bytes, read_text
from kernelzoo.records.loaders import load_json, load_yaml

CURVE_COLUMNS = ("step", "train_loss", "eval_loss", "eval_accuracy")


def _short(value) -> str:
    if isinstance(value, bool):
        return "T" if value else "F"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def run_id(identity: dict, params_in_name: dict) -> str:
    """Readable, deterministic id, e.g. ``dpfp-nu2-dkey64-S260-sum-seed1-3fa9c1d2``.

    ``identity`` is everything that defines the experiment (not logging or launcher settings);
    its hash makes the id unique. ``params_in_name`` are the feature-map parameters shown. A
    stall check (``identity["stall_check_of"]``, absent otherwise) ends in ``-check-<hash>``.
    """
    blob = json.dumps(identity, sort_keys=True, default=str)
    digest = hashlib.sha1(blob.encode()).hexdigest()[:8]
    params = "".join(f"-{k}{_short(v)}" for k, v in params_in_name.items())
    name = (f"{identity['feature_map']}{params}-dkey{identity['d_key']}-S{identity['n_keys']}"
            f"-{identity['memory']['update_rule']}-seed{identity['seed']}"
            f"{'-check' if identity.get('stall_check_of') else ''}-{digest}")
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


@functools.lru_cache(maxsize=None)
def _conf_digest(experiment_file: str | None = None) -> str:
    """Digest of the config groups' files (conf/, the experiments aside), the packaged
    experiment a point names (``experiment_file``, its YAML's name) and the version: a change
    to any of them invalidates the point index below; another experiment's file does not."""
    from kernelzoo import __version__

    h = hashlib.sha1(__version__.encode())
    files = [f for f in sorted(CONF.rglob("*.yaml")) if EXPERIMENTS.name not in
             f.relative_to(CONF).parts]
    if experiment_file and (EXPERIMENTS / experiment_file).is_file():
        files.append(EXPERIMENTS / experiment_file)
    for f in files:
        h.update(str(f.relative_to(CONF.parent if f.is_relative_to(CONF) else
                                   EXPERIMENTS.parent)).encode())
        h.update(read_bytes(f))
    return h.hexdigest()


# where and how a point runs, not what it is (training.plan's NOT_IN_IDENTITY among them):
# left out of its index key, so a store moved, copied or merged, or a sweep run with another
# launcher, knows what is done
PLACE = ("results_dir", "hydra.", "launcher", "logger", "dry_run", "force", "resume",
         "trainer.threads", "trainer.progress", "trainer.device", "trainer.pack",
         "trainer.compile", "trainer.checkpoint_minutes", "trainer.flush_denormal")


def _point_file(results_dir, experiment: str, overrides: list[str]) -> Path:
    keys = {o: o.lstrip("+~").partition("=")[0] for o in overrides}
    what = sorted(o for o, k in keys.items() if not k.startswith(PLACE))
    named = next((o.partition("=")[2] + ".yaml" for o, k in keys.items() if k == "experiments"),
                 None)
    key = hashlib.sha1(json.dumps([_conf_digest(named), what]).encode()).hexdigest()
    return experiment_dir(results_dir, experiment) / "index" / key[:16]


def index_point(results_dir, experiment: str, overrides: list[str], rid: str) -> None:
    """Remember which run a sweep point (its command-line overrides) resolved to."""
    atomic_write_text(_point_file(results_dir, experiment, overrides), rid + "\n")


def point_summary(results_dir, experiment: str, overrides: list[str]) -> dict | None:
    """The summary of the finished run this exact point names under the current configs, or
    None (not in the index, not finished, or an unreadable summary: the point's own job
    reports that). A damaged index entry raises StoreError naming it.

    Lets a rerun of a finished sweep skip its points in milliseconds instead of composing each
    config, and lets a search read its probes back; a point not in the index simply goes
    through the normal path (and its job rewrites the entry).
    """
    file = _point_file(results_dir, experiment, overrides)
    try:
        rid = read_text(file).strip()
    except FileNotFoundError:
        return None
    except OSError as err:
        raise StoreError(f"{file}: not a readable index entry ({err.strerror})") from None
    if not is_name(rid):
        raise StoreError(f"{file}: not an index entry (a run id is one path component)")
    try:
        summary = read_summary(run_dir(results_dir, experiment, rid))
    except StoreError:
        return None
    wrong = [f"{key} {summary[key]}, not the point's {value}"
             for key, value in _point_values(overrides).items() if str(summary[key]) != value]
    if summary["run_id"] != rid or summary["experiment"] != experiment or wrong:
        raise StoreError(f"{file}: names run {rid}, which is not this point's ("
                         + ("; ".join(wrong) or "another experiment's or run's summary") + ")")
    return summary


def _point_values(overrides: list[str]) -> dict[str, str]:
    """The values of a point's overrides that its run's summary records as given: n_keys, seed
    and d_key, but not d_key beside a d_dot (a map may set its d_key from d_dot: Taylor's d_dot
    66 is d_key 11)."""
    values = dict(o.lstrip("+").split("=", 1) for o in overrides if "=" in o)
    keys = ("n_keys", "seed") + (() if "d_dot" in values else ("d_key",))
    return {key: values[key] for key in keys if key in values}


def experiment_dir(results_dir: str | Path, experiment: str) -> Path:
    return Path(results_dir) / experiment


def run_dir(results_dir: str | Path, experiment: str, rid: str) -> Path:
    return experiment_dir(results_dir, experiment) / "runs" / rid


def guard(results_dir: str | Path, path: Path) -> Path:
    """``path`` (the experiment directory, ``runs/``, a run directory: anything below
    ``results_dir``) when nothing from ``results_dir`` down to it is a symbolic link, something
    other than a directory, or leads out of ``results_dir``; StoreError naming the first that
    is. Checked before a
    run's directory is written or cleared, so the store never deletes or writes through a
    link (``results_dir`` itself may be one)."""
    root = Path(results_dir)
    here = root
    for part in Path(path).relative_to(root).parts:
        here = here / part
        if here.is_symlink():
            raise StoreError(f"{here}: a symbolic link in the store; kernelzoo follows no link "
                             f"out of {root}: replace it with a directory or use another "
                             "results_dir")
        if here.exists() and not here.is_dir():
            raise StoreError(f"{here}: not a directory, where the store keeps one; valid: "
                             "rename or remove it")
    real = Path(os.path.realpath(path))
    if os.path.lexists(path) and not real.is_relative_to(os.path.realpath(root)):
        raise StoreError(f"{path}: leads out of {root} (to {real}); valid: a directory inside "
                         "results_dir")
    return Path(path)


def make_dir(results_dir: str | Path, path: Path) -> Path:
    """Create the directory ``path`` as new, ``guard``-ing what leads to it from ``results_dir``:
    the sweep's own directory, whose name (time and pid) another user of a shared store can
    foresee. Anything already there under its name, a planted link above all, is refused
    (StoreError) rather than written into; OSError when it cannot be made. A ``path`` outside
    ``results_dir`` (a ``hydra.sweep.dir`` of the user's choosing) may exist, but not as a
    link."""
    path = Path(path)
    below = Path(os.path.abspath(path)).is_relative_to(os.path.abspath(results_dir))
    if below:
        guard(results_dir, path.parent)
    path.parent.mkdir(parents=True, exist_ok=True)
    if below:  # the parents made just now, or found: still no link among them
        guard(results_dir, path.parent)
    try:
        os.mkdir(path)
    except FileExistsError:
        if not below and path.is_dir() and not path.is_symlink():
            return path
        what = "a symbolic link" if path.is_symlink() else "something"
        raise StoreError(f"{path}: {what} already there, where this sweep makes its own new "
                         "directory; kernelzoo writes into no directory it did not make: run "
                         "again, which names a new one (remove this one only when no sweep "
                         "writes there)") from None
    return path


def guard_experiment(results_dir: str | Path, experiment: str) -> None:
    """``guard`` of the experiment's directories: ``runs/``, ``index/`` and Hydra's ``hydra/``."""
    for part in ("runs", "index", "hydra"):
        guard(results_dir, experiment_dir(results_dir, experiment) / part)


def read_summary(path: Path) -> dict:
    """Read and check one ``summary.json`` (``summary.problem``: its fields and their types);
    raise StoreError naming the file and what is wrong if it is bad."""
    file = path / "summary.json" if path.is_dir() else path
    try:
        summary = load_json(read_text(file))
    except (OSError, ValueError) as err:
        raise StoreError(f"{file}: not a readable summary ({err})") from None
    if not isinstance(summary, dict):
        raise StoreError(f"{file}: not a readable summary (expected a JSON object)")
    problem = summary_schema.problem(summary)
    if problem:
        raise StoreError(f"{file}: {problem}")
    return summary


def read_config(path: Path) -> dict:
    """The run's ``config.yaml``; {} when it is missing; StoreError naming it when it is no
    regular file, not UTF-8, not a YAML mapping or beyond the limits of ``loaders.py`` (a
    YAML bomb, deep nesting, a non-finite number)."""
    file = path / "config.yaml"
    try:
        value = load_yaml(read_text(file))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, yaml.YAMLError) as err:
        raise StoreError(f"{file}: not a readable config ({one_line(err).splitlines()[0]})") \
            from None
    if value is not None and not isinstance(value, dict):
        raise StoreError(f"{file}: not a config (a YAML mapping)")
    return value or {}


def config_value(cfg: dict, key: str):
    """A dotted ``key`` (``"trainer.stop_loss"``) of a config read by ``read_config``; None when
    it is missing."""
    for part in key.split("."):
        cfg = cfg.get(part) if isinstance(cfg, dict) else None
    return cfg


def read_config_value(path: Path, key: str):
    """A dotted ``key`` of the run's ``config.yaml``; None when the file or the key is missing
    or the file is damaged (``read_config`` names it)."""
    try:
        return config_value(read_config(path), key)
    except StoreError:
        return None


def is_done(path: Path) -> bool:
    """True when the run at ``path`` has its summary (a regular file: a FIFO is no result)."""
    return (path / "summary.json").is_file()


def remove(path: Path) -> None:
    """Delete ``path``: a directory with everything in it, anything else (a link, even to a
    directory) as the one entry it is; never across a link."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif os.path.lexists(path):
        path.unlink()
