"""Train one configuration: ``python -m kernelzoo.train [overrides]`` (a Hydra app over conf/).

One run is one point of a sweep: config → task + model → training with the published protocol
(task-spec "Training") → results store (+ wandb). The run's directory is
``<results_dir>/<experiment>/runs/<run_id>/``; a finished run is skipped unless ``force=true``.
Bad configs fail before anything trains: one short message and exit code 2 (in a sweep the
point is recorded as ``infeasible`` with that message instead, and the sweep goes on).
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from threadpoolctl import threadpool_limits
from tqdm import tqdm

from . import __version__, diagnostics, progress, store, tracking
from .feature_maps import ConfigError, InfeasibleError, build_feature_map, resolve_params
from .memory import NORMALISATIONS, UPDATE_RULES
from .model import RetrievalModel, retrieval_loss
from .task import RetrievalTask


@dataclass
class TaskConf:
    name: str = "capacity"
    replacement: bool = False
    seq_len: int | None = None
    eval_seq_len: int | None = None


@dataclass
class MemoryConf:
    update_rule: str = "sum"
    normalisation: str = "attention"
    eps: float = 1e-6
    key_eps: float = 0.0
    chunk_size: int = 64


@dataclass
class TrainerConf:
    lr: float = 1e-3
    batch_size: int = 32
    max_steps: int = 100_000
    eval_every: int = 100
    eval_sequences: int = 20
    eval_max_queries: int = 200
    eval_query_batch: int | None = 32
    stop_loss: float = 1e-3
    patience: int = 10
    device: str = "auto"
    dtype: str = "float32"
    threads: int = 1  # torch (and BLAS) threads per run: runs are small, workers give parallelism
    progress: str = "auto"


@dataclass
class LoggerConf:
    name: str = "wandb"
    project: str = "kernelzoo"
    entity: str | None = None


TOP_LEVEL = {"feature_map", "memory", "task", "trainer", "logger", "search", "n_keys", "d_key",
             "d_dot", "seed", "results_dir", "experiment", "force", "dry_run"}
SCHEMAS = {"task": TaskConf, "memory": MemoryConf, "trainer": TrainerConf, "logger": LoggerConf}
NOT_IN_IDENTITY = {"trainer": ("device", "threads", "progress")}  # how, not what, is computed


if not OmegaConf.has_resolver("pid"):  # keeps simultaneous sweeps apart; cached: one per sweep
    OmegaConf.register_new_resolver("pid", os.getpid, use_cache=True)


LOG = logging.getLogger(__name__)  # a run's log file (train.log in its Hydra job directory)


class UsageError(Exception):
    """A config value the suite rejects; the message names it and what would be valid."""


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise UsageError(message)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UsageError(f"trainer.device={name!r} is not a device; valid: auto, cpu, cuda, "
                         "cuda:N, mps") from None
    _check(device.type in ("cpu", "cuda", "mps"),
           f"trainer.device={name!r} is not supported; valid: auto, cpu, cuda, cuda:N, mps")
    if device.type == "cuda":
        n = torch.cuda.device_count()
        _check(n > 0, f"trainer.device={name!r} but no CUDA device is available here; "
                      "use trainer.device=auto or cpu")
        _check((device.index or 0) < n, f"trainer.device={name!r} but only {n} CUDA device(s)")
    if device.type == "mps":
        _check(torch.backends.mps.is_available(),
               f"trainer.device={name!r} but MPS is not available here; use auto or cpu")
    return device


def plan(cfg: DictConfig) -> dict:
    """Validate ``cfg`` and resolve everything a run needs; raise UsageError/InfeasibleError."""
    parts = {}
    for group, schema in SCHEMAS.items():
        try:
            parts[group] = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema),
                                                               cfg[group]))
        except OmegaConfBaseException as err:
            raise UsageError(f"{group}: {str(err).splitlines()[0]}") from None
    unknown = sorted(set(cfg) - TOP_LEVEL)
    _check(not unknown, f"unknown option {', '.join(unknown)}; valid: {', '.join(sorted(TOP_LEVEL))}")
    _check(isinstance(cfg.seed, int) and not isinstance(cfg.seed, bool),
           f"seed={cfg.seed!r} is invalid: it must be an integer")
    task, mem, tr = parts["task"], parts["memory"], parts["trainer"]
    S, d_key = cfg.n_keys, cfg.d_key
    _check(isinstance(S, int) and S >= 1, f"n_keys={S} is invalid: it must be an integer >= 1")
    _check(isinstance(d_key, int) and d_key >= 1, f"d_key={d_key} is invalid: it must be >= 1")
    _check(task.name in ("capacity", "update"),
           f"task.name={task.name!r} is unknown; valid: capacity, update")
    seq_len = task.seq_len or (2 * S if task.replacement else S)
    eval_seq_len = task.eval_seq_len or S
    if not task.replacement:
        _check(seq_len == S and eval_seq_len == S,
               f"task.seq_len={seq_len} with n_keys={S}: Setting 1 (no replacement) stores "
               f"every key once, so seq_len must equal n_keys")
    _check(seq_len >= 1 and eval_seq_len >= 1, f"task.seq_len={seq_len} must be >= 1")
    _check(mem.update_rule in UPDATE_RULES,
           f"memory.update_rule={mem.update_rule!r} is unknown; valid: {', '.join(UPDATE_RULES)}")
    _check(mem.normalisation in NORMALISATIONS, f"memory.normalisation={mem.normalisation!r} "
           f"is unknown; valid: {', '.join(NORMALISATIONS)}")
    _check(mem.chunk_size >= 1, f"memory.chunk_size={mem.chunk_size} must be >= 1")
    for key in ("lr", "stop_loss"):
        _check(getattr(tr, key) > 0, f"trainer.{key}={getattr(tr, key)} must be > 0")
    for key in ("batch_size", "max_steps", "eval_every", "eval_sequences", "eval_max_queries",
                "threads"):
        _check(getattr(tr, key) >= 1, f"trainer.{key}={getattr(tr, key)} must be >= 1")
    _check(tr.dtype in ("float32", "float64"),
           f"trainer.dtype={tr.dtype!r} is unknown; valid: float32, float64")
    tr.progress = str(tr.progress).lower()
    _check(tr.progress in ("auto", "true", "false"),
           f"trainer.progress={tr.progress!r}; valid: auto, true, false")
    _check(cfg.logger.name in ("wandb", "none"),
           f"logger.name={cfg.logger.name!r} is unknown; valid: wandb, none")
    device = resolve_device(tr.device)

    fm = OmegaConf.to_container(cfg.feature_map, resolve=True)
    name = fm.pop("name")
    d_dot = cfg.d_dot
    torch.manual_seed(cfg.seed)  # a random map draws its first projection here
    try:
        if d_dot is not None:
            kwargs = resolve_params(name, d_key=d_key, d_dot=d_dot, **fm)
        else:
            kwargs = {"d_key": d_key, **fm}
        phi = build_feature_map(name, **kwargs)
    except ConfigError as err:
        raise UsageError(str(err)) from None
    _check(not (phi.is_softmax and mem.update_rule != "sum"),
           f"feature_map=softmax with memory.update_rule={mem.update_rule}: softmax attention "
           "has no fast-weight state; use memory=sum")
    identity = {
        "feature_map": name, "feature_map_params": phi.params, "d_key": phi.d_key,
        "d_dot": None if math.isinf(phi.d_dot) else phi.d_dot, "n_keys": S, "seed": cfg.seed,
        "task": {**vars(task), "seq_len": seq_len, "eval_seq_len": eval_seq_len},
        "memory": vars(mem),
        "trainer": {k: v for k, v in vars(tr).items() if k not in NOT_IN_IDENTITY["trainer"]},
    }
    return {"identity": identity, "phi": phi, "task": task, "memory": mem, "trainer": tr,
            "device": device, "seq_len": seq_len, "eval_seq_len": eval_seq_len}


def _name_params(feature_map: str, params: dict) -> dict:
    """The feature-map parameters worth showing in a run id."""
    shown = {"dpfp": ("nu",), "favor": ("m", "variant"), "trig": ("m",), "t2r": ("m",),
             "polysketch": ("r", "degree")}.get(feature_map, ())
    return {k: params[k] for k in shown if params.get(k) is not None}


def locate(cfg: DictConfig, identity: dict) -> tuple[str, Path]:
    """The run id of ``identity`` and its directory in the store."""
    params = _name_params(identity["feature_map"], identity["feature_map_params"])
    rid = store.run_id(identity, params)
    return rid, store.run_dir(cfg.results_dir, cfg.experiment, rid)


def raw_identity(cfg: DictConfig) -> dict:
    """Identity of a point that could not be planned (for its infeasible record)."""
    fm = OmegaConf.to_container(cfg.feature_map, resolve=True)
    name = fm.pop("name", "?")
    return {"feature_map": name, "feature_map_params": fm, "d_key": cfg.d_key,
            "d_dot": cfg.d_dot, "n_keys": cfg.n_keys, "seed": cfg.seed,
            "task": OmegaConf.to_container(cfg.task, resolve=True),
            "memory": OmegaConf.to_container(cfg.memory, resolve=True)}


def base_summary(cfg: DictConfig, identity: dict, rid: str) -> dict:
    d_dot = identity["d_dot"]
    return {
        "run_id": rid, "experiment": cfg.experiment, "task": identity["task"].get("name"),
        "feature_map": identity["feature_map"],
        "feature_map_params": identity["feature_map_params"], "d_key": identity["d_key"],
        "d_dot": d_dot, "predicted_capacity": d_dot, "n_keys": identity["n_keys"],
        "seq_len": identity["task"].get("seq_len"),
        "update_rule": identity["memory"].get("update_rule"),
        "normalisation": identity["memory"].get("normalisation"), "seed": identity["seed"],
        "status": None, "reason": None, "steps": 0, "final_eval_loss": None,
        "best_eval_loss": None, "final_eval_accuracy": None, "wall_seconds": 0.0,
        "device": None, "kernelzoo_version": __version__,
    }


@torch.no_grad()
def evaluate(model: RetrievalModel, task: RetrievalTask, tr: TrainerConf) -> tuple[float, float]:
    """Eval loss and accuracy: one memory per sequence, all its queries read in one pass.

    The loss is the mean of per-batch means over query batches of ``eval_query_batch`` (the
    authors' weighting), or the plain mean over queries when that is None.
    """
    model.eval()
    batch = task.eval_batch(tr.eval_sequences, tr.eval_max_queries)
    y = model(batch.keys, batch.values, batch.query)
    losses = retrieval_loss(y, batch.target, batch.mask)
    mask = batch.mask
    correct = (y.argmax(-1) == batch.target) & mask
    accuracy = correct.sum() / mask.sum()
    if tr.eval_query_batch is None:
        loss = losses.sum() / mask.sum()
    else:
        chunk = (mask.cumsum(dim=1) - 1).clamp(min=0) // tr.eval_query_batch
        n_chunks = int(chunk.max()) + 1
        sums = losses.new_zeros(mask.shape[0], n_chunks).scatter_add(1, chunk, losses)
        counts = losses.new_zeros(mask.shape[0], n_chunks).scatter_add(1, chunk, mask.to(losses))
        loss = (sums[counts > 0] / counts[counts > 0]).mean()
    model.train()
    return loss.item(), accuracy.item()


def fit(cfg: DictConfig, p: dict, rid: str, path, tracker: tracking.Tracker, echo) -> dict:
    """The published training protocol; returns the summary fields it determines."""
    tr, mem, device = p["trainer"], p["memory"], p["device"]
    dtype = getattr(torch, tr.dtype)
    torch.manual_seed(cfg.seed)
    phi = p["phi"]
    model = RetrievalModel(cfg.n_keys, phi, mem.update_rule, mem.normalisation, mem.eps,
                           mem.key_eps, mem.chunk_size).to(device=device, dtype=dtype)
    task = RetrievalTask(cfg.n_keys, p["seq_len"], p["eval_seq_len"], p["task"].replacement,
                         cfg.seed, device)
    # the diagnostics' sequences come from a stream of their own: training data stays the same
    probe = RetrievalTask(cfg.n_keys, p["seq_len"], p["eval_seq_len"], p["task"].replacement,
                          cfg.seed + 2_000_003, device).eval_batch(tr.eval_sequences,
                                                                   tr.eval_max_queries)
    initial = diagnostics.feature_ranks_of(model, probe)
    opt = torch.optim.Adam(model.parameters(), lr=tr.lr,
                           fused=device.type in ("cpu", "cuda"))  # one kernel for all params
    window = torch.zeros(tr.eval_every, device=device, dtype=dtype)
    curve = store.CurveWriter(path)
    show = sys.stderr.isatty() if tr.progress == "auto" else tr.progress == "true"
    bar = tqdm(total=tr.max_steps, desc=rid[:40], disable=not show, leave=False, unit="step")
    best, since_best, status, reason = math.inf, 0, "max_steps", None
    eval_loss = accuracy = math.nan
    step, t_window = 0, time.perf_counter()
    try:
        while step < tr.max_steps:
            step += 1
            batch = task.train_batch(tr.batch_size)
            y = model(batch.keys, batch.values, batch.query)
            loss = retrieval_loss(y, batch.target).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            window[(step - 1) % tr.eval_every] = loss.detach()
            if step % tr.eval_every and step < tr.max_steps:
                continue
            n = (step - 1) % tr.eval_every + 1
            losses = window[:n].tolist()  # one device sync per evaluation, not per step
            bad = [i for i, v in enumerate(losses) if not math.isfinite(v)]
            if bad:
                status, reason = "diverged", f"non-finite train loss at step {step - n + bad[0] + 1}"
                step = step - n + bad[0] + 1
                break
            train_loss = sum(losses) / n
            eval_loss, accuracy = evaluate(model, task, tr)
            rate = n / (time.perf_counter() - t_window)
            curve.write(step, train_loss, eval_loss, accuracy)
            LOG.info("step %d: train loss %.4g, eval loss %.4g, eval accuracy %.4f (%.0f steps/s)",
                     step, train_loss, eval_loss, accuracy, rate)
            tracker.log({"train/loss": train_loss, "eval/loss": eval_loss,
                         "eval/accuracy": accuracy, "perf/steps_per_second": rate}, step=step)
            bar.update(n)
            bar.set_postfix(eval_loss=f"{eval_loss:.4g}")
            if not math.isfinite(eval_loss):
                status, reason = "diverged", f"non-finite eval loss at step {step}"
                break
            if eval_loss < best:
                best, since_best = eval_loss, 0
            else:
                since_best += 1
            if eval_loss <= tr.stop_loss:
                status = "converged"
                break
            if since_best > tr.patience:
                status = "plateau"
                reason = f"no improvement on {best:.4g} for {since_best} evaluations"
                break
            t_window = time.perf_counter()
    finally:
        bar.close()
        curve.close()
    found = dict.fromkeys(diagnostics.FIELDS)
    if status != "diverged":  # why it fails, measured from the trained model (diagnostics.py)
        found, details = diagnostics.measure(model, probe, initial)
        store.atomic_write_text(path / "diagnostics.json", json.dumps(details, indent=1) + "\n")
    return {"status": status, "reason": reason, "steps": step,
            "final_eval_loss": eval_loss if status != "diverged" else None,
            "best_eval_loss": best if math.isfinite(best) else None,
            "final_eval_accuracy": accuracy if status != "diverged" else None,
            "device": str(device), **found}


def run(cfg: DictConfig, echo=print) -> tuple[str, dict | None]:
    """Plan, skip or claim, train, store one run: (run_id, summary or None when skipped)."""
    in_sweep = HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN
    try:
        p = plan(cfg)
    except UsageError as err:
        if not in_sweep:
            raise
        return record_infeasible(cfg, raw_identity(cfg), str(err), echo)
    except InfeasibleError as err:
        return record_infeasible(cfg, raw_identity(cfg), str(err), echo)
    identity = p["identity"]
    rid, path = locate(cfg, identity)
    if cfg.dry_run:
        echo(f"plan {rid}: d_dot {identity['d_dot']}, "
             f"{'done' if store.is_done(path) else 'to train'}")
        return rid, None
    writable(path)
    if store.is_done(path) and not cfg.force:
        try:
            summary = store.read_summary(path)
        except store.StoreError as err:
            raise UsageError(f"{err}; remove it or rerun with force=true") from None
        echo(f"skip {rid}: already finished ({summary['status']}); force=true reruns it")
        return rid, None
    with store.Claim(path) as claimed:
        if not claimed:
            echo(f"skip {rid}: another worker is running it")
            return rid, None
        if store.is_done(path) and not cfg.force:  # finished by another worker meanwhile
            echo(f"skip {rid}: finished by another worker")
            return rid, None
        store.reset(path)
        return rid, train_claimed(cfg, p, identity, rid, path, echo)


def train_claimed(cfg, p, identity, rid, path, echo) -> dict:
    summary = base_summary(cfg, identity, rid)
    store.atomic_write_text(path / "config.yaml", OmegaConf.to_yaml(cfg, resolve=True))
    tr = p["trainer"]
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    header = f"run {rid}: {p['device']}, {tr.threads} thread(s) of {cores} core(s)"
    echo(header)
    LOG.info(header)
    wandb_config = {**OmegaConf.to_container(cfg, resolve=True), "run_id": rid,
                    "d_dot": summary["d_dot"], "predicted_capacity": summary["predicted_capacity"],
                    "feature_map_params": identity["feature_map_params"]}
    tracker = tracking.start(cfg.logger.name == "wandb", cfg.results_dir,
                             project=cfg.logger.project, entity=cfg.logger.entity,
                             group=cfg.experiment, name=rid, config=wandb_config,
                             tags=[identity["feature_map"], identity["memory"]["update_rule"]],
                             echo=echo)
    start, exit_code = time.perf_counter(), 1
    try:
        with threadpool_limits(limits=tr.threads):  # torch's OpenMP pool and any BLAS alike
            torch.set_num_threads(tr.threads)
            summary.update(fit(cfg, p, rid, path, tracker, echo))
        summary["wall_seconds"] = round(time.perf_counter() - start, 3)
        store.write_summary(path, summary)
        tracker.summary({k: v for k, v in summary.items() if not isinstance(v, dict)})
        exit_code = 0
    finally:
        tracker.finish(exit_code)
    loss = summary["final_eval_loss"]
    line = (f"done {rid}: {summary['status']} after {summary['steps']} steps, eval loss "
            f"{'-' if loss is None else f'{loss:.4g}'} ({summary['wall_seconds']:.1f} s)"
            + (f" [{summary['reason']}]" if summary["reason"] else ""))
    echo(line)
    LOG.info(line)
    return summary


def record_infeasible(cfg: DictConfig, identity: dict, reason: str, echo):
    rid, path = locate(cfg, identity)
    if cfg.dry_run:
        echo(f"infeasible {rid}: {reason}")
        return rid, None
    writable(path)
    if store.is_done(path) and not cfg.force:
        echo(f"skip {rid}: already recorded infeasible")
        return rid, None
    summary = base_summary(cfg, identity, rid)
    summary.update(status="infeasible", reason=reason)
    with store.Claim(path) as claimed:
        if claimed and (cfg.force or not store.is_done(path)):
            store.write_summary(path, summary)
    echo(f"infeasible {rid}: {reason}")
    return rid, summary


def writable(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".write-test"
        probe.touch()
        probe.unlink()
    except OSError as err:
        raise UsageError(f"results_dir: cannot write {path} ({err.strerror}); "
                         "choose a writable results_dir=...") from None


CONF = str(Path(__file__).resolve().parents[2] / "conf")  # the repo's conf/


GROUPS = ("feature_map", "memory", "task", "trainer", "logger", "launcher", "search")


def config_dirs(argv: list[str]) -> list[Path]:
    """conf/ and the directories a user adds with ``hydra.searchpath=[file://DIR,...]``."""
    dirs = [Path(CONF)]
    for arg in argv:
        key, _, value = arg.partition("=")
        if key == "hydra.searchpath":
            dirs += [Path(v.strip()[len("file://"):]) for v in value.strip("[]").split(",")
                     if v.strip().startswith("file://")]
    return dirs


def check_choices(argv: list[str]) -> None:
    """Unknown config-group options get one line (Hydra's own message lists its search path)."""
    for arg in argv:
        key, _, value = arg.lstrip("+~").partition("=")
        if key not in GROUPS or not value:
            continue
        valid = sorted({p.stem for d in config_dirs(argv) for p in (d / key).glob("*.yaml")})
        for choice in value.strip("[]").split(","):
            if choice and choice not in valid:
                print(f"error: {key}={choice} is unknown; valid: {', '.join(valid)}",
                      file=sys.stderr)
                sys.exit(2)


def check_results_dir(argv: list[str]) -> None:
    """An unwritable results_dir fails with one line before Hydra makes its log directory."""
    given = [a.split("=", 1)[1] for a in argv if a.lstrip("+").startswith("results_dir=")]
    try:
        writable(Path(given[-1] if given else "results"))
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)


def main() -> None:
    """Console entry point (``kernelzoo-train``); also what ``kernelzoo.sweep`` starts."""
    check_choices(sys.argv[1:])
    check_results_dir(sys.argv[1:])
    _app()


@hydra.main(config_path=CONF, config_name="config", version_base="1.3")
def _app(cfg: DictConfig) -> str | None:
    """Entry point; returns the run's status (None when skipped) for the sweep's totals."""
    in_sweep = HydraConfig.get().mode == RunMode.MULTIRUN
    try:
        rid, summary = run(cfg)
    except UsageError as err:
        print(f"{'failed' if in_sweep else 'error'}: {err}", file=sys.stderr)
        if in_sweep:  # e.g. a corrupted summary: the other points still run
            return "failed"
        sys.exit(2)
    except Exception as err:
        if not in_sweep:
            raise
        # one broken point must not end a sweep: no summary is written, so a rerun retries it
        logging.getLogger(__name__).exception("run failed")
        print(f"failed: {type(err).__name__}: {err} (traceback in "
              f"{HydraConfig.get().runtime.output_dir})", file=sys.stderr)
        return "failed"
    if in_sweep and not cfg.dry_run:
        store.index_point(cfg.results_dir, cfg.experiment, HydraConfig.get().overrides.task, rid)
        line = progress.finished(HydraConfig.get().sweep.dir)
        if line:
            print(line)
    return summary["status"] if summary else None


if __name__ == "__main__":
    # run the importable module's app, not __main__'s: process-pool launchers (joblib) pickle
    # the task function by reference and their workers import it as kernelzoo.train
    from kernelzoo.train import main as importable_main

    importable_main()
