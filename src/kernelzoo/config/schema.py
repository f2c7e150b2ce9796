"""The typed schema of every config group, and the door every command line goes through.

``conf/config.yaml`` (training) and ``conf/analyze.yaml`` (analysis) start from ``Config`` and
``AnalyzeConfig``, structured configs registered in Hydra's ConfigStore, so Hydra enforces each
key's type as it composes (``n_keys=true`` is not an int, ``trainer.lrr`` is no key). What a type
cannot say, each field says itself: the values it accepts (``valid``, repeated in every message)
and a test of one value (``ok``). ``check`` applies those tests and the rules that relate fields;
``compose`` runs Hydra's composition for a command line and turns any failure into one line
(UsageError), before Hydra creates a directory. Feature-map parameters are checked by the maps'
constructors (``feature_maps.py``): the schema only says that ``feature_map`` names a map.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import re
import tempfile
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Callable

from hydra import initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException, MissingConfigException, OverrideParseException
from hydra.types import RunMode
from omegaconf import MISSING, DictConfig, OmegaConf, open_dict
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

CONF = Path(importlib.util.find_spec("kernelzoo.conf").submodule_search_locations[0])  # conf/
EXPERIMENTS = CONF / "experiments"  # the named sweeps: the repo's experiments/, linked into conf/
# the update rules: the modules of kernelzoo.core.rules (one file each; its registry, which this
# layer cannot import, holds the same names: tests/test_rules.py)
RULES_DIR = Path(importlib.util.find_spec("kernelzoo.core.rules").submodule_search_locations[0])
UPDATE_RULES = tuple(sorted(p.stem for p in RULES_DIR.glob("*.py")
                            if p.stem not in ("__init__", "base")))
VIEWS = ("loss", "accuracy", "keys_retrieved")  # of capacity (analysis.capacity), as searched
NORMALISATIONS = ("attention", "sum", "none")
SEED_MAX = 2**63 - 1  # torch generators take 64 bits; the evaluation stream adds an offset
N_KEYS_MAX = 2**20  # the most keys a task is built with: one sequence of a batch holds them all
NAME = re.compile(r"[A-Za-z0-9_.-]{1,100}")
DEVICE = re.compile(r"auto|cpu|mps|cuda(:\d+)?")


class UsageError(Exception):
    """A config value the suite rejects; the message names it and what would be valid."""


@dataclass(frozen=True)
class Rule:
    """The values a field accepts: ``valid`` says which, ``ok`` tests one (never None)."""

    valid: str
    ok: Callable[[Any], bool]


def rule(default, valid: str, ok: Callable[[Any], bool]):
    """A schema field with its default and its Rule."""
    kind = {"default_factory": lambda: list(default)} if isinstance(default, list) else \
        {"default": default}
    return field(**kind, metadata={"rule": Rule(valid, ok)})


def count(default, low: int = 1):
    return rule(default, f"an integer >= {low}", lambda v: v >= low)


def positive(default):
    return rule(default, "a finite number > 0", lambda v: math.isfinite(v) and v > 0)


def fraction(default):
    return rule(default, "a number in (0, 1)", lambda v: 0 < v < 1)


def one_of(default, *choices: str):
    return rule(default, ", ".join(choices), lambda v: v in choices)


def switch(note: str = ""):
    """auto, true or false (any case: YAML's booleans arrive as "True"/"False"), default auto."""
    return rule("auto", "auto, true, false" + note,
                lambda v: v.lower() in ("auto", "true", "false"))


def is_name(value: str) -> bool:
    """One safe path component: letters, digits, '-', '_', '.'; not '.' or '..'; <= 100 chars."""
    return bool(NAME.fullmatch(value)) and value not in (".", "..")


def name(default):
    return rule(default, "one path component of at most 100 letters, digits, '-', '_' or '.' "
                         "(not '.' or '..')", is_name)


@dataclass
class TaskConf:
    name: str = one_of("capacity", "capacity", "update")
    replacement: bool = False
    seq_len: int | None = count(None)
    eval_seq_len: int | None = count(None)


def sequence_lengths(n_keys: int, replacement: bool, seq_len: int | None = None,
                     eval_seq_len: int | None = None) -> tuple[int, int]:
    """(training, evaluation) sequence lengths of a task; null takes the task spec's: S keys in
    Setting 1, 2S in Setting 2 for training, and S for evaluation (the authors' quirk)."""
    return seq_len or (2 * n_keys if replacement else n_keys), eval_seq_len or n_keys


@dataclass
class MemoryConf:
    update_rule: str = one_of("sum", *UPDATE_RULES)
    normalisation: str = one_of("attention", *NORMALISATIONS)
    eps: float = positive(1e-6)
    key_eps: float = rule(0.0, "a finite number >= 0", lambda v: math.isfinite(v) and v >= 0)
    chunk_size: int = count(64)


@dataclass
class TrainerConf:
    lr: float = positive(1e-3)
    batch_size: int = count(32)
    max_steps: int = count(100_000)
    eval_every: int = count(100)
    eval_sequences: int = count(20)
    eval_max_queries: int = count(200)
    eval_query_batch: int | None = count(32)
    stop_loss: float = positive(1e-3)
    patience: int = count(10, low=0)
    device: str = rule("auto", "auto, cpu, cuda, cuda:N, mps", lambda v: bool(DEVICE.fullmatch(v)))
    dtype: str = one_of("float32", "float32", "float64")
    threads: int = count(1)  # torch and BLAS threads per run: runs are small, workers give parallelism
    progress: str = switch()
    pack: str = rule("auto", "auto or an integer >= 1 (most runs trained together, pack.py)",
                     lambda v: v == "auto" or (v.isdigit() and int(v) >= 1))
    compile: str = switch()
    checkpoint_minutes: float | None = rule(10.0, "a number of minutes >= 0 (0: at every "
                                            "evaluation), or null (never)",
                                            lambda v: math.isfinite(v) and v >= 0)
    flush_denormal: str = switch(" (auto: the fwm rule, and the sum rule's training steps)")


@dataclass
class LoggerConf:
    name: str = one_of("wandb", "wandb", "none")
    project: str = rule("kernelzoo", "a wandb project name", bool)
    entity: str | None = None


@dataclass
class SearchConf:
    """``conf/search/<name>.yaml``. ``grid`` trains every grid point; ``bisect`` searches each
    configuration's failure point, with the grid's n_keys giving the range [min, max]."""

    name: str = one_of("grid", "grid", "bisect")
    multiples: list[float] = rule([0.5, 1.0, 1.25], "a non-empty list of numbers > 0",
                                  lambda v: len(v) > 0 and all(math.isfinite(m) and m > 0
                                                               for m in v))
    start: int | None = count(None)       # unbounded d_dot: first n_keys of the doubling (None: d_key)
    min_keys: int | None = count(None)    # None: the smallest n_keys of the configuration's grid
    max_keys: int | None = count(None)    # None: the largest n_keys of the grid, at least 4 d_dot
    resolution: float | None = rule(None, "a number of keys >= 1",  # None: max(2, 0.05 d_dot)
                                    lambda v: math.isfinite(v) and v >= 1)
    threshold: float = fraction(0.01)     # tau of the analysis (conf/analyze.yaml)
    accuracy_threshold: float = rule(0.99, "a number in (0, 1]",  # the accuracy view's
                                     lambda v: 0 < v <= 1)  # (the analysis' accuracy criterion)
    max_rounds: int = count(40)
    views: list[str] = rule(list(VIEWS), f"a non-empty list of {', '.join(VIEWS)}, e.g. "
                            "search.views=[loss]", lambda v: 0 < len(v) and set(v) <= set(VIEWS))


@dataclass
class Config:
    """``conf/config.yaml``: one run, or one point of a sweep."""

    feature_map: dict[str, Any] = field(default_factory=dict)
    memory: MemoryConf = field(default_factory=MemoryConf)
    task: TaskConf = field(default_factory=TaskConf)
    trainer: TrainerConf = field(default_factory=TrainerConf)
    logger: LoggerConf = field(default_factory=LoggerConf)
    search: SearchConf = field(default_factory=SearchConf)
    n_keys: int = rule(20, f"an integer from 1 to {N_KEYS_MAX}", lambda v: 1 <= v <= N_KEYS_MAX)
    d_key: int = count(64)
    d_dot: int | None = count(None)
    seed: int = rule(1, f"an integer from 0 to {SEED_MAX}", lambda v: 0 <= v <= SEED_MAX)
    results_dir: str = rule("results/local", "a directory path", bool)
    experiment: str = name("adhoc")
    force: bool = False
    resume: bool = True
    dry_run: bool = False
    grids: list[int] | None = rule(None, "a list of the experiment's grid indices from 0, e.g. "
                                   "grids=[0,2]", lambda v: all(i >= 0 for i in v))
    pack_members: list[list[int]] = field(default_factory=list)  # set by the sweeper: the
    # [n_keys, seed] of the runs trained in this job beside this point (pack.py)
    stall_check: bool = False  # a sweep: afterwards, retrain each stalled run longer (README)
    stall_check_of: str | None = name(None)  # set by the sweeper on such a check: the run_id
    # of the stalled run it retrains; part of the run's identity when set


@dataclass
class AnalyzeConfig:
    """``conf/analyze.yaml``; ``logger`` is the shared ``conf/logger`` group."""

    experiment: str = name(MISSING)
    results_dir: str = rule("results/local", "a directory path", bool)
    reference_dir: str = rule("results/reference", "a directory path", bool)
    threshold: float = fraction(0.01)
    accuracy_threshold: float = fraction(0.99)
    figures: bool = True
    logger: LoggerConf = field(default_factory=LoggerConf)


ConfigStore.instance().store(name="config_schema", node=Config)
ConfigStore.instance().store(name="analyze_schema", node=AnalyzeConfig)


def show(value) -> str:
    """A value as it is typed on a command line."""
    if isinstance(value, bool):
        return str(value).lower()
    return "null" if value is None else str(value)


def _rule_of(schema, key: str) -> tuple[Rule | None, list[str]]:
    """The Rule of the dotted ``key`` in ``schema`` and the keys valid beside it."""
    *parents, last = key.split(".")
    for part in parents:
        sub = next((f for f in fields(schema) if f.name == part), None)
        if sub is None or not is_dataclass(sub.default_factory):
            return None, []  # a free mapping (feature_map): its keys are the map's
        schema = sub.default_factory
    known = {f.name: f for f in fields(schema)}
    found = known.get(last)
    return (found.metadata.get("rule") if found else None), list(known)


def _given(key: str, value, overrides) -> str:
    """``key=value`` as the user typed it, if an override set it, else as ``show`` writes it."""
    typed = next((o.lstrip("+~") for o in reversed(list(overrides))
                  if o.lstrip("+~").partition("=")[0] == key), None)
    return typed or (key if value is None else f"{key}={show(value)}")


def describe(err: Exception, overrides=(), schema=Config) -> str:
    """One line for a failed composition or schema merge (Hydra's or OmegaConf's error)."""
    if isinstance(err, MissingConfigException) and err.options is not None:
        group, _, choice = str(err.missing_cfg_file).rpartition("/")
        return f"{group}={choice} is unknown; valid: {', '.join(err.options)}"
    if isinstance(err, OverrideParseException):
        reason = next((line.strip() for line in str(err.message).splitlines() if line.strip()
                       and not line.startswith(("Error parsing override", "See https"))), "")
        return (f"{err.override} cannot be parsed ({reason}); valid: key=value in Hydra's "
                "override grammar, unusual values quoted (key='...')")
    cause = err.__cause__ if isinstance(err.__cause__, OmegaConfBaseException) else err
    key = getattr(cause, "full_key", None)
    if not key:
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        if lines and lines[0].startswith("Ambiguous value"):
            return f"{lines[0]}: to sweep over it, add --multirun (or use kernelzoo.sweep)"
        return "; ".join(lines[:2]) or type(err).__name__
    given = _given(key, getattr(cause, "value", None), overrides)
    found, siblings = _rule_of(schema, key)
    if isinstance(cause, (ConfigKeyError, ConfigAttributeError)) and found is None:
        where = key.rpartition(".")[0] or "the config"
        valid = ", ".join(siblings) if siblings else f"the keys of that {where} option"
        return f"{given}: {where} has no key {key.rpartition('.')[2]!r}; valid: {valid}"
    reason = str(cause.msg if hasattr(cause, "msg") else cause).splitlines()[0]
    return f"{given} is invalid ({reason})" + (f"; valid: {found.valid}" if found else "")


def _walk(obj, prefix: str = ""):
    """(dotted key, value, Rule) of every field of a checked config object, depth first."""
    for f in fields(obj):
        value = getattr(obj, f.name)
        if is_dataclass(value):
            yield from _walk(value, f"{prefix}{f.name}.")
        elif "rule" in f.metadata:
            yield f"{prefix}{f.name}", value, f.metadata["rule"]


def task_overrides() -> list[str]:
    """The job's command-line overrides as typed: strings, an interpolation in one
    (``${oc.env:NAME}``) unresolved; [] outside a Hydra job."""
    if not HydraConfig.initialized():
        return []
    return OmegaConf.to_container(HydraConfig.get().overrides.task, resolve=False)


def check(cfg: DictConfig, schema=Config):
    """``cfg`` (composed over ``schema``, without its hydra node) as a checked ``schema``
    object: keys, ranges, choices and the rules between fields (Hydra checked the types as it
    composed); UsageError with one line otherwise."""
    if OmegaConf.get_type(cfg) is not schema:
        raise TypeError(f"a config composed over {schema.__name__} is needed "
                        "(its YAML lists the schema first in its defaults)")
    overrides = task_overrides()
    try:
        _known_keys(cfg, schema, "", overrides)
        obj = OmegaConf.to_object(cfg)  # resolves interpolations, typed as their fields
    except OmegaConfBaseException as err:
        raise UsageError(describe(err, overrides, schema)) from None
    for key, value, found in _walk(obj):
        if value is not None and not found.ok(value):
            raise UsageError(f"{_given(key, value, overrides)} is invalid; valid: {found.valid}")
    if isinstance(obj, Config):
        _related(obj)
    return obj


def _known_keys(node: DictConfig, schema, prefix: str, overrides) -> None:
    """UsageError for a key the schema lacks (Hydra lets ``+key=value`` add one)."""
    known = {f.name: f for f in fields(schema)}
    for key in node.keys():
        if key not in known:
            where = prefix.rstrip(".") or "the config"
            raise UsageError(f"{_given(prefix + key, None, overrides)}: {where} has no key "
                             f"{key!r}; valid: {', '.join(known)}")
        if is_dataclass(known[key].default_factory):
            _known_keys(node[key], known[key].default_factory, f"{prefix}{key}.", overrides)


def _related(c: Config) -> None:
    """The rules between fields that need no feature map (``training.plan`` checks the others)."""
    if not c.task.replacement:
        for key in ("seq_len", "eval_seq_len"):
            value = getattr(c.task, key)
            if value is not None and value != c.n_keys:
                raise UsageError(f"task.{key}={value} with n_keys={c.n_keys}: Setting 1 (no "
                                 f"replacement) stores every key once; valid: task.{key}=null "
                                 f"or {c.n_keys}")
    s = c.search
    if s.min_keys is not None and s.max_keys is not None and s.min_keys > s.max_keys:
        raise UsageError(f"search.min_keys={s.min_keys} is above search.max_keys={s.max_keys}; "
                         "valid: min_keys <= max_keys")


def writable(path: str | Path) -> None:
    """Create the directory ``path`` (results_dir, a run's directory) if need be and prove that
    it can be written; UsageError naming it otherwise. Called once every value is checked, so
    that a rejected command line creates nothing."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):  # a probe of its own: sweeps may start together
            pass
    except OSError as err:
        raise UsageError(f"cannot write {path} ({err.strerror}); valid: a writable "
                         "results_dir=...") from None


def expand_home(overrides: list[str]) -> list[str]:
    """The command line's overrides with a ``~`` that begins results_dir's value (quoted, as
    Hydra's grammar asks: ``results_dir='~/x'``) expanded to the home directory, as a shell
    would have; left as typed, it made a directory literally named ``~``."""
    found = re.compile(r"^(\+{0,2}results_dir=)(['\"]?)(~[^/'\"]*)(.*)$")
    return [found.sub(lambda m: m.group(1) + m.group(2) + os.path.expanduser(m.group(3))
                      + m.group(4), o) for o in overrides]


def check_store_place(cfg: DictConfig) -> None:
    """UsageError when the experiment's directory under results_dir falls inside the package's
    own config tree (``results_dir=. experiment=conf``) or the package itself: runs would be
    written among the shipped configs and read by every later composition, or a ``conf/``
    made in the package would hide them."""
    where = Path(os.path.abspath(os.path.join(str(cfg.results_dir), str(cfg.experiment))))
    package = Path(__file__).parents[1]  # kernelzoo/: a conf/ made there would hide the shipped one
    for tree in (CONF, EXPERIMENTS, package):  # experiments/ is linked into conf/
        conf = Path(os.path.realpath(tree))
        if where.is_relative_to(conf) or Path(os.path.realpath(where)).is_relative_to(conf):
            raise UsageError(f"results_dir={cfg.results_dir} with experiment={cfg.experiment} "
                             f"would write runs into {conf}, the package's own files; valid: "
                             "a results_dir outside it (the default results/local)")


def check_chdir(cfg: DictConfig) -> None:
    """UsageError when ``hydra.job.chdir=true`` would move a relative results_dir into each
    job's own directory (every run its own store)."""
    if OmegaConf.select(cfg, "hydra.job.chdir") and \
            not Path(str(OmegaConf.select(cfg, "results_dir", default="."))).is_absolute():
        raise UsageError(f"hydra.job.chdir=true with the relative results_dir="
                         f"{cfg.results_dir} would give every job a store of its own in its "
                         "directory; valid: an absolute results_dir, or hydra.job.chdir=false")


def compose(config_name: str, overrides: list[str], multirun: bool = False) -> DictConfig:
    """The config Hydra composes for this command line (hydra node included); UsageError with
    one line when it cannot. In a multirun the sweep's axes are left out, as Hydra does: each
    point is composed and checked by the sweeper."""
    schema = AnalyzeConfig if config_name == "analyze" else Config
    try:
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            return GlobalHydra.instance().config_loader().load_configuration(
                config_name, overrides, run_mode=RunMode.MULTIRUN if multirun else RunMode.RUN)
    except (HydraException, OmegaConfBaseException) as err:
        raise UsageError(describe(err, overrides, schema)) from None


@contextlib.contextmanager
def as_job(cfg: DictConfig):
    """``cfg`` as its job sees it: without the hydra node, with ``${hydra:...}`` resolving
    against that node (as Hydra sets it up for a job), restored afterwards."""
    hydra_config = HydraConfig.instance()
    saved = hydra_config.cfg
    hydra_config.set_config(cfg)
    try:
        job = cfg.copy()
        with open_dict(job):
            del job["hydra"]
        yield job
    finally:
        hydra_config.cfg = saved
