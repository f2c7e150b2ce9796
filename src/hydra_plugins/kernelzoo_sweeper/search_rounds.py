"""``search=bisect``: the grid sweeper's rounds of failure-point probes.

The grids' points without their n_keys are the *series* (configuration and seed); each series'
n_keys values give its range. Every round asks ``_search.search_views`` for each
unfinished series' next probes (until every view of capacity, loss, accuracy and keys
retrieved, is located), reads the probes the store already holds and launches all the others
together as one launcher batch, so rounds, not points, set the wall time. Each probe is an
ordinary run of the experiment: resumable, skipped on rerun, visible in wandb. A probe is read
back by the run id its point resolves to (the series' identity at that n_keys), else through
the store's index.

A search already in the store continues from its probes: before the first round, every probe
search.json records for a series is read back (final eval loss, accuracy, diverged) and folded
in, so a rerun, an interrupted search or one made by an older rule (the loss alone) trains only
the probes still missing; new rounds are numbered after the last one recorded.

Each series is planned from the check of its first grid point (``points.py``), so it is
composed exactly as its jobs will be. After every round it rewrites
``<results_dir>/<experiment>/search.json`` (atomic): per series its overrides, d_dot, range,
resolution, the probes in order with round and reason (the views that asked for it), the loss
view's verdict (``verdict``; the first view asked for when ``search.views`` leaves the loss out)
and every view's (``verdicts``; ``not_searched`` for a view ``search.views`` leaves out). The analysis reads it to say which
points were probed and why.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections import Counter
from dataclasses import asdict
from typing import TYPE_CHECKING

from omegaconf import OmegaConf

from kernelzoo import config
from kernelzoo.config import SearchConf
from kernelzoo.config.words import plural
from kernelzoo.records import files, history, store

from .packs import Point
from .points import fail, override_key, override_value

if TYPE_CHECKING:  # imported where used: Hydra's plugin scan runs this module on every start,
    # and the search (pandas, through the analysis' failure rule) or torch (a plan) are needed
    # only once a search runs
    from kernelzoo.training.plan import RunIdentity

    from ._search import Observation, Probe

NOT_SEARCHED = {"outcome": "not_searched"}  # the verdict of a view search.views leaves out


class Series:
    """One configuration and seed: its overrides (without n_keys), its spec, what it saw."""

    def __init__(self, overrides: tuple[str, ...], grid_keys: list[int]):
        from ._search import VIEWS

        self.overrides, self.grid_keys = overrides, grid_keys
        # until planned: the overrides that choose the configuration (not how the search runs)
        self.key = " ".join(sorted(o for o in overrides if not o.startswith("search")))
        self.spec = None
        self.d_dot = None
        self.plan = None  # the check of its first point: its Plan or Infeasible record
        self.identity = self.task = None  # the run identity of its first point, and its task
        self.observed: dict[int, Observation] = {}
        self.probes: list[dict] = []
        self.verdicts: dict[str, dict | None] = dict.fromkeys(VIEWS)
        self.verdict: dict | None = None  # the loss view's, or why the search stopped
        self.done = False
        self.outcome: str | None = None  # once done: the loss view's outcome, or why it stopped

    def point(self, n_keys: int) -> list[str]:
        return [*self.overrides, f"n_keys={n_keys}"]

    def identity_at(self, n_keys: int) -> RunIdentity:
        """The run identity of the series' point at ``n_keys`` (``kernelzoo.training.plan``'s)."""
        task = self.task
        seq_len, eval_seq_len = config.sequence_lengths(n_keys, task.replacement, task.seq_len,
                                                        task.eval_seq_len)
        return self.identity.at(n_keys, seq_len, eval_seq_len)

    def stop(self, outcome: str, reason: str | None = None) -> None:
        """End the search of this series: every view not located records why."""
        from ._search import VIEWS

        why = {"outcome": outcome, **({"reason": reason} if reason else {})}
        self.verdicts = {v: why if outcome == "infeasible" else (self.verdicts[v] or why)
                         for v in VIEWS}
        self.verdict, self.done, self.outcome = self.verdicts["loss"], True, outcome

    def record(self) -> dict:
        return {"overrides": list(self.overrides), "d_dot": self.d_dot,
                "spec": None if self.spec is None else asdict(self.spec),
                "probes": self.probes, "verdict": self.verdict, "verdicts": self.verdicts}


class SearchRounds:
    def __init__(self, sweeper):
        self.sweeper, self.config = sweeper, sweeper.config
        # checked with every point of the sweep (kernelzoo.config.SearchConf)
        self.conf = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(SearchConf),
                                                        self.config.search))
        self.exp_dir = store.experiment_dir(self.config.results_dir, self.config.experiment)
        self.series: list[Series] = []
        self.rounds = self.total = 0
        self.planned: dict[str, list[int]] = {}  # dry run: the new probes of each series

    def _series(self, points: list[list[str]]) -> list[Series]:
        groups: dict[tuple, list[int]] = {}
        for point in points:
            rest = tuple(o for o in point if override_key(o) != "n_keys")
            keys = groups.setdefault(rest, [])
            n_keys = override_value(point, "n_keys", None)
            if n_keys is not None:
                try:
                    keys.append(int(n_keys))
                except ValueError:
                    fail(f"n_keys={n_keys}: n_keys must be an integer in a search")
        return [Series(rest, sorted(set(keys))) for rest, keys in groups.items()]

    def _plan(self, series: Series) -> None:
        """The series' d_dot and spec, from the check of its first grid point."""
        from kernelzoo.training.plan import Infeasible

        from ._search import make_spec

        if not series.grid_keys and None in (self.conf.min_keys, self.conf.max_keys):
            fail(f"search=bisect needs a range of n_keys for {series.key or 'the sweep'}: give "
                 "n_keys values in the grid (e.g. n_keys=20,600) or search.min_keys/max_keys")
        first = series.point(series.grid_keys[0]) if series.grid_keys else list(series.overrides)
        p = series.plan = self.sweeper.plans[tuple(sorted(first))]
        if isinstance(p, Infeasible):  # no spec, one probe records it with why
            print(f"infeasible: {series.key}: {p.reason}")
            return
        identity = {k: v for k, v in p.identity.as_dict().items() if k != "n_keys"}
        identity["task"] = {k: v for k, v in identity["task"].items()
                            if k not in ("seq_len", "eval_seq_len")}  # these follow n_keys
        digest = hashlib.sha1(json.dumps(identity, sort_keys=True, default=str).encode())
        series.key = f"{identity['feature_map']}-seed{identity['seed']}-{digest.hexdigest()[:8]}"
        d_dot = identity["d_dot"]
        series.d_dot = d_dot
        series.identity, series.task = p.identity, p.task
        if series.grid_keys and series.identity_at(series.grid_keys[0]) != p.identity:
            series.identity = None  # not derivable here: read its probes through the index
        series.spec = make_spec(self.conf, d_dot, p.phi.d_key, series.grid_keys
                                or [self.conf.min_keys, self.conf.max_keys])

    def record(self) -> dict:
        """What sweep.json records of this invocation: probes asked for, rounds trained."""
        return {"points": self.total, "search": {"series": len(self.series),
                                                 "rounds": self.rounds}}

    def run(self, points: list[list[str]]) -> list:
        self.series = all_series = self._series(points)
        for series in all_series:
            self._plan(series)
        seeds = {o for s in all_series for o in s.overrides if override_key(o) == "seed"}
        configs = {tuple(o for o in s.overrides if override_key(o) != "seed") for s in all_series}
        print(f"sweep {self.config.experiment}: search=bisect over {len(all_series)} series "
              f"({plural(len(configs), 'configuration')}, {plural(max(len(seeds), 1), 'seed')})")
        last = self._resume(all_series)
        returns = []
        for round_no in range(last + 1, last + self.conf.max_rounds + 1):
            wanted = [(s, p) for s in all_series if not s.done for p in self._next(s)]
            if not wanted:
                break
            for s, p in wanted:
                s.probes.append({"n_keys": p.n_keys, "round": round_no, "why": p.why})
            todo = [(s, p) for s, p in wanted if not self._read(s, p.n_keys)]
            self.total += len(wanted)
            self.sweeper.outcomes["skipped"] += len(wanted) - len(todo)
            if not todo:
                continue
            self.rounds += 1
            print(f"round {round_no}: {'planning' if self.config.dry_run else 'launching'} "
                  f"{plural(len(todo), 'probe')} ({len(wanted) - len(todo)} read from the store)")
            todo.sort(key=lambda sp: -sp[1].n_keys)  # largest first: the slowest start first
            returns += self.sweeper.launch([Point.of(s.point(p.n_keys), s.plan, p.n_keys)
                                            for s, p in todo], label=f"round {round_no}")
            for s, p in todo:
                if self.config.dry_run:  # the probes are planned, nothing is trained
                    self.planned.setdefault(s.key, []).append(p.n_keys)
                elif not self._read(s, p.n_keys) and not s.done:
                    s.stop("lost", f"the probe at n_keys={p.n_keys} left no summary; rerun the "
                           "sweep to retry it")
            for key, ns in self.planned.items():
                s = next(s for s in all_series if s.key == key)
                if not s.done:
                    s.stop("dry_run", f"next: n_keys={', '.join(map(str, sorted(ns)))}")
            self._write(all_series)
        else:
            for s in all_series:
                if not s.done and self._next(s):
                    s.stop("unfinished", f"search.max_rounds={self.conf.max_rounds}")
        self._write(all_series)
        verdicts = Counter(s.outcome for s in all_series)
        print(f"search: {', '.join(f'{k} {v}' for k, v in sorted(verdicts.items()))}; "
              f"{plural(self.rounds, 'round')} launched, {plural(self.total, 'probe')}")
        if self.config.dry_run:
            new = sum(map(len, self.planned.values()))
            print(f"search (dry run): {plural(new, 'new probe')} asked for next, in "
                  f"{len(self.planned)} series" +
                  "".join(f"\n  {k}: n_keys={', '.join(map(str, sorted(ns)))}"
                          for k, ns in sorted(self.planned.items())))
        return returns

    def _resume(self, all_series: list[Series]) -> int:
        """Fold in the probes search.json records for each series and the store still holds
        (read back as any probe is): the search continues from all of them. Returns the last
        round recorded, after which this invocation's rounds are numbered."""
        try:
            record = history.read_search(self.exp_dir) or {}
        except store.StoreError:
            return 0  # _write sets the damaged record aside
        last = resumed = 0
        for series in all_series:
            old = record.get(series.key) or {}
            for p in old.get("probes", []) if series.spec is not None else []:
                n = p.get("n_keys") if isinstance(p, dict) else None
                if not isinstance(n, int) or n in series.observed or series.done:
                    continue
                series.probes.append({k: p[k] for k in ("n_keys", "round", "why") if k in p})
                if not self._read(series, n):
                    series.probes.pop()
                    continue
                resumed += 1
                if isinstance(p.get("round"), int):
                    last = max(last, p["round"])
        if resumed:
            print(f"search: {plural(resumed, 'probe')} of the search so far read back from the "
                  "store")
        self.total += resumed
        self.sweeper.outcomes["skipped"] += resumed
        return last

    def _next(self, series: Series) -> list[Probe]:
        from ._search import VIEWS, Probe, search_views

        if series.spec is None:  # infeasible: its one probe records why
            n = series.grid_keys[0] if series.grid_keys else self.conf.min_keys
            if series.probes:
                if not series.done:
                    series.stop("infeasible")
                return []
            return [Probe(n, "record why the configuration is infeasible")]
        views = search_views(series.spec, series.observed)
        series.verdicts = {v: NOT_SEARCHED for v in VIEWS} | {
            v: None if verdict is None else
            {k: x for k, x in asdict(verdict).items() if x is not None}
            for v, verdict in views.verdicts.items()}
        if views.located:  # the loss view's verdict, or the first view asked for
            series.verdict, series.done = series.verdicts[series.spec.views[0]], True
            series.outcome = series.verdict["outcome"]
        return list(views.probes)

    def _summary(self, series: Series, n_keys: int) -> dict | None:
        """The summary of the series' finished run at ``n_keys``, or None: by the run id its
        point resolves to, else through the store's index."""
        if series.identity is not None:
            from kernelzoo.training.plan import locate

            _, run = locate(self.config, series.identity_at(n_keys))
            if run.is_done():
                try:
                    return run.read_summary()
                except store.StoreError:
                    pass  # the index, or the job, says what is wrong with it
        return self.sweeper.indexed(series.point(n_keys))

    def _read(self, series: Series, n_keys: int) -> bool:
        """Fold a finished probe into its series; False if the store has no result for it."""
        from ._search import Observation

        summary = self._summary(series, n_keys)
        if summary is None:
            return False
        probe = next(p for p in series.probes if p["n_keys"] == n_keys)
        probe["run_id"] = summary["run_id"]
        if summary["status"] == "infeasible":
            series.stop("infeasible", summary["reason"])
            return True
        seen = Observation(summary.get("final_eval_loss"), summary.get("final_eval_accuracy"),
                           summary["status"] == "diverged")
        probe["fails"] = seen.loss_fails(self.conf.threshold)
        probe["accuracy_fails"] = seen.accuracy_fails(self.conf.accuracy_threshold)
        probe["keys_retrieved"] = seen.keys_retrieved(n_keys)
        series.observed[n_keys] = seen
        return True

    def _write(self, all_series: list[Series]) -> None:
        if self.config.dry_run:
            return
        path = history.search_file(self.exp_dir)
        with files.lock(str(path) + ".lock"):  # keep the series of another sweep on this store
            try:
                series = history.read_search(self.exp_dir) or {}
            except store.StoreError as err:
                print(history.set_aside(path, err), file=sys.stderr)
                series = {}
            series = merged(series, {s.key: s.record() for s in all_series})
            files.atomic_write_text(path, json.dumps({"series": series}, indent=1) + "\n")


STOPPED = ("lost", "dry_run", "unfinished")  # a series stopped before a view was located


def is_located(verdict) -> bool:
    """A view's verdict that locates it (fails_at, never_fails, peaks, infeasible ...): not
    one of STOPPED, not "not_searched" (the view was not asked for), not absent."""
    return isinstance(verdict, dict) and verdict.get("outcome") not in (
        None, NOT_SEARCHED["outcome"], *STOPPED)


def merged(stored: dict, ours: dict) -> dict:
    """The search record ``stored`` with this sweep's series ``ours`` written in, view by view
    (the analysis' views only): this sweep's located verdicts, and for a view it did not locate
    (not asked for: a loss-only rerun; or "lost": its probe trained by another sweep) the one
    ``stored`` located. So a rerun never erases a located view, and what ``stored`` says of a
    view this sweep locates (or of no view at all) does not survive it."""
    from ._search import VIEWS

    out = dict(stored)
    for key, record in ours.items():
        old = stored.get(key) if isinstance(stored.get(key), dict) else {}
        before = old.get("verdicts") if isinstance(old.get("verdicts"), dict) else {}
        mine = record["verdicts"]
        verdicts = {v: mine.get(v) if is_located(mine.get(v)) or not is_located(before.get(v))
                    else before[v] for v in VIEWS}
        verdict = record["verdict"] if is_located(record["verdict"]) or not is_located(
            old.get("verdict")) else old["verdict"]
        out[key] = {**record, "verdicts": verdicts, "verdict": verdict}
    return out
