"""``stall_check=true``: after a sweep's own runs, retrain each stalled run with a longer stopping
rule, to see whether its never-learned keys can be learned.

A stall (``kernelzoo.analysis.stalls``) is a run that ended by the plateau rule or the step cap
with 1 to 3 keys never learned while its configuration holds that many keys or more in some run. That
makes it look like an optimisation stall rather than a capacity limit, but it does not show it:
the run did end failing. So the analysis counts every run as it ended, and a stall may move a
number only where a check shows that the keys can be learned.

The check, and why this one. Each stalled run is trained again with exactly its own overrides,
plus ``trainer.patience`` x 3, ``trainer.max_steps`` x 2 and ``stall_check_of=<its run_id>``.
The same seed gives the same initialisation and the same training and evaluation streams, and
neither setting changes anything but when the loop stops (``runner.py``; a larger patience never
stops a run earlier), so the check replays the stalled run's trajectory up to the step where that
run stopped (its last evaluation at a multiple of ``eval_every``: a step cap off that grid ends a
run with one evaluation the check does not make) and then keeps training from there. That is
"continue the stalled run from its final state", which the store cannot do directly (a run's
checkpoint is deleted when it ends); the replay costs the stalled run's steps again, and is exact
for a run trained alone (bit for bit: the same curve.csv rows), while a run trained in a pack beside
others (``pack.py``) is replayed to float32 rounding. The question it
answers is the one a stall raises about that very run: was the stopping rule too early? A check
whose own final eval loss and accuracy pass says yes; one that still fails says that more
patience does not recover those keys.

A check is an ordinary run of the experiment (``runs/<run_id>/``, resumable, skipped on rerun,
in wandb with the tag ``stall_check``); ``stall_check_of`` is part of its identity, so its run
id (``...-seed1-check-<hash>``) is not the stalled run's, and its summary.json records it
(null for every other run). Checks are never checked themselves and never count in the stall
rule. Only the runs of the sweep's own points (a grid's points, a search's probes) are checked,
each at most once: the store's checks (``stall_check_of``) say which have one already, so a
rerun of a finished sweep launches nothing. All checks of a sweep go to the launcher as one batch.
"""

import math
from dataclasses import dataclass, field
from pathlib import Path

from kernelzoo.records import store
from kernelzoo.config.words import plural

from .points import check_points, override_key

PATIENCE_FACTOR = 3
MAX_STEPS_FACTOR = 2
SET_BY_CHECK = ("trainer.patience", "trainer.max_steps", "stall_check_of")
HOW = ("dry_run", "force", "resume")  # how a point runs, not what it is: the index's lookup


@dataclass
class Check:
    """The check of one stalled run: the stalled run's id, the check's overrides, its line."""

    of: str
    point: list[str]
    line: str


@dataclass
class Found:
    """What ``find`` found: the checks to launch and the counts sweep.json records."""

    checks: list[Check] = field(default_factory=list)
    stalled: int = 0          # stalled runs among the sweep's points
    checked_before: int = 0   # ... of which the store already holds a check
    elsewhere: int = 0        # stalled runs of the store that are not the sweep's points
    unchecked: list[str] = field(default_factory=list)  # stalled, but no check can be made

    def record(self) -> dict:
        return {"stalled": self.stalled, "checked_before": self.checked_before,
                "launched": len(self.checks), "not_in_sweep": self.elsewhere,
                "uncheckable": len(self.unchecked)}


def check_point(point: list[str], patience: int, max_steps: int, of: str) -> list[str]:
    """The overrides of the check of the run of ``point`` (which ran with ``patience`` and
    ``max_steps``): the point's own, with the longer stopping rule and ``stall_check_of``."""
    return [*(o for o in point if override_key(o) not in SET_BY_CHECK),
            f"trainer.patience={PATIENCE_FACTOR * patience}",
            f"trainer.max_steps={MAX_STEPS_FACTOR * max_steps}", f"stall_check_of={of}"]


def _setting(run_dir: Path, key: str) -> int | None:
    value = store.read_config_value(run_dir, key)  # a check of a negative patience would
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 \
        else None  # be a bad value, ending the whole sweep


def find(exp_dir: Path, points: dict[str, list[str]], threshold: float) -> Found:
    """The checks of the stalled runs of ``points`` ({run_id: the sweep point that made it}),
    by the stall rule at ``threshold`` over the store's runs but its checks."""
    from kernelzoo.analysis.runs import load_runs
    from kernelzoo.analysis.stalls import stalled

    found = Found()
    runs_dir = Path(exp_dir) / "runs"
    if not runs_dir.is_dir():
        return found
    runs = load_runs(Path(exp_dir))[0]
    if runs.empty:
        return found
    of = runs["stall_check_of"]
    checked = set(of.dropna())
    ordinary = runs[of.isna()]
    flags = stalled(ordinary, threshold)
    for row in sorted(ordinary[flags].itertuples(), key=lambda r: r.run_id):
        if row.run_id not in points:
            found.elsewhere += 1
            continue
        found.stalled += 1
        if row.run_id in checked:
            found.checked_before += 1
            continue
        patience, max_steps = (_setting(runs_dir / row.run_dir, k)
                               for k in ("trainer.patience", "trainer.max_steps"))
        if patience is None or max_steps is None:
            found.unchecked.append(f"{row.run_id}: its config.yaml gives no trainer.patience "
                                   "and trainer.max_steps (integers >= 1)")
            continue
        dead = int(row.dead_keys) if not math.isnan(row.dead_keys) else 0
        point = check_point(points[row.run_id], patience, max_steps, row.run_id)
        line = (f"stall check of {row.run_id} ({row.status} at step {row.steps}, "
                f"{plural(dead, 'key')} of {row.n_keys} never learned): "
                f"trainer.patience={PATIENCE_FACTOR * patience} "
                f"trainer.max_steps={MAX_STEPS_FACTOR * max_steps}")
        found.checks.append(Check(row.run_id, point, line))
    return found


def run(sweeper, points: list[list[str]], known: dict[str, list[str]] | None = None) -> list:
    """Find, print and launch (one batch) the checks of the stalled runs of ``points``; the
    counts are left in ``sweeper.stall_checks`` for sweep.json. ``known`` ({run_id: point}) are
    the points whose run the caller already knows (a search's probes record their run ids); the
    others are found through the store's index, which a committed store does not carry."""
    cfg = sweeper.config
    by_run: dict[str, list[str]] = dict(known or {})
    for point in points:
        summary = sweeper.indexed(point)
        if summary is None and any(override_key(o) in HOW for o in point):
            summary = sweeper.indexed([o for o in point if override_key(o) not in HOW])
        if summary is not None and summary.get("stall_check_of") is None:
            by_run.setdefault(summary["run_id"], point)
    found = find(store.experiment_dir(cfg.results_dir, cfg.experiment), by_run,
                 cfg.search.threshold)
    sweeper.stall_checks = found.record()
    doing = "planning" if cfg.dry_run else "launching"
    print(f"stall_check: {plural(found.stalled, 'stalled run')} among the sweep's runs "
          f"(tau {cfg.search.threshold:g}), {found.checked_before} checked before"
          + (f", {len(found.unchecked)} uncheckable" if found.unchecked else "")
          + (f"; {doing} {plural(len(found.checks), 'check')}" if found.checks
             else "; nothing to launch")
          + (f" ({plural(found.elsewhere, 'more stalled run')} of the store, not this sweep's, "
             "left unchecked)" if found.elsewhere else ""))
    for line in found.unchecked:
        print(f"stall check impossible: {line}")
    for check in found.checks:
        print(check.line)
    if not found.checks:
        return []
    todo = [check.point for check in found.checks]
    sweeper.plans.update(check_points(sweeper, todo))  # a bad value: one line, exit 2
    return sweeper.launch(sweeper.checked(todo), label="stall checks")
