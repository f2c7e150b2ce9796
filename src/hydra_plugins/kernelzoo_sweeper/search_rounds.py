"""``search=bisect``: the grid sweeper's rounds of failure-point probes.

The grids' points without their n_keys are the *series* (configuration and seed); each series'
n_keys values give its range. Every round asks ``kernelzoo.search.next_probes`` for each
unfinished series' next probes, reads the probes the store already holds (a rerun or an
interrupted search replays them without training) and launches all the others together as one
launcher batch, so rounds, not points, set the wall time. Each probe is an ordinary run of the
experiment: resumable, skipped on rerun, visible in wandb.

Each series is planned from the check of its first grid point (``points.py``), so it is
composed exactly as its jobs will be. After every round it rewrites
``<results_dir>/<experiment>/search.json`` (atomic): per series its overrides, d_dot, range,
resolution, the probes in order with round and reason, and the verdict. The analysis reads it
to say which points were probed and why.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from collections import Counter
from dataclasses import asdict

from filelock import FileLock
from omegaconf import OmegaConf

from kernelzoo import files, store
from kernelzoo.config import SearchConf
from kernelzoo.search import Probe, Verdict, failing, make_spec, next_probes
from kernelzoo.words import plural

from .points import fail, override_key, override_value


class Series:
    """One configuration and seed: its overrides (without n_keys), its spec, what it saw."""

    def __init__(self, overrides: tuple[str, ...], grid_keys: list[int]):
        self.overrides, self.grid_keys = overrides, grid_keys
        # until planned: the overrides that choose the configuration (not how the search runs)
        self.key = " ".join(sorted(o for o in overrides if not o.startswith("search")))
        self.spec = None
        self.d_dot = None
        self.observed: dict[int, bool] = {}
        self.losses: dict[int, float] = {}
        self.probes: list[dict] = []
        self.verdict: dict | None = None

    def point(self, n_keys: int) -> list[str]:
        return [*self.overrides, f"n_keys={n_keys}"]

    def record(self) -> dict:
        return {"overrides": list(self.overrides), "d_dot": self.d_dot,
                "spec": None if self.spec is None else asdict(self.spec),
                "probes": self.probes, "verdict": self.verdict}


class SearchRounds:
    def __init__(self, sweeper):
        self.sweeper, self.config = sweeper, sweeper.config
        # checked with every point of the sweep (kernelzoo.config.SearchConf)
        self.conf = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(SearchConf),
                                                        self.config.search))
        self.exp_dir = store.experiment_dir(self.config.results_dir, self.config.experiment)
        self.series: list[Series] = []
        self.rounds = self.total = 0

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
        if not series.grid_keys and None in (self.conf.min_keys, self.conf.max_keys):
            fail(f"search=bisect needs a range of n_keys for {series.key or 'the sweep'}: give "
                 "n_keys values in the grid (e.g. n_keys=20,600) or search.min_keys/max_keys")
        first = series.point(series.grid_keys[0]) if series.grid_keys else list(series.overrides)
        p = self.sweeper.plans[tuple(sorted(first))]
        if isinstance(p, Exception):  # infeasible: no spec, one probe records it with why
            print(f"infeasible: {series.key}: {p}")
            return
        identity = {k: v for k, v in p["identity"].items() if k != "n_keys"}
        identity["task"] = {k: v for k, v in identity["task"].items()
                            if k not in ("seq_len", "eval_seq_len")}  # these follow n_keys
        digest = hashlib.sha1(json.dumps(identity, sort_keys=True, default=str).encode())
        series.key = f"{identity['feature_map']}-seed{identity['seed']}-{digest.hexdigest()[:8]}"
        d_dot = identity["d_dot"]
        series.d_dot = d_dot
        series.spec = make_spec(self.conf, d_dot, p["phi"].d_key, series.grid_keys
                                or [self.conf.min_keys, self.conf.max_keys])

    def record(self) -> dict:
        """What sweep.json records of this invocation: probes asked for, rounds trained."""
        return {"points": self.total, "search": {"series": len(self.series),
                                                 "rounds": self.rounds}}

    def run(self, points: list[list[str]]) -> list:
        self.series = all_series = self._series(points)
        for series in all_series:
            self._plan(series)
        print(f"sweep {self.config.experiment}: search=bisect over {len(all_series)} "
              "configurations x seeds")
        returns = []
        for round_no in range(1, self.conf.max_rounds + 1):
            wanted = [(s, p) for s in all_series if s.verdict is None for p in self._next(s)]
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
            returns += self.sweeper.launch([s.point(p.n_keys) for s, p in todo],
                                           label=f"round {round_no}")
            for s, p in todo:
                if self.config.dry_run:  # the probes are planned, nothing is trained
                    s.verdict = {"outcome": "dry_run", "reason": f"next: n_keys={p.n_keys}"}
                elif not self._read(s, p.n_keys):
                    s.verdict = {"outcome": "lost", "reason": f"the probe at n_keys="
                                 f"{p.n_keys} left no summary; rerun the sweep to retry it"}
            self._write(all_series)
        else:
            for s in all_series:
                s.verdict = s.verdict or {"outcome": "unfinished",
                                          "reason": f"search.max_rounds={self.conf.max_rounds}"}
        self._write(all_series)
        verdicts = Counter(s.verdict["outcome"] for s in all_series)
        print(f"search: {', '.join(f'{k} {v}' for k, v in sorted(verdicts.items()))}; "
              f"{plural(self.rounds, 'round')} launched, {plural(self.total, 'probe')}")
        return returns

    def _next(self, series: Series) -> list:
        if series.spec is None:  # infeasible: its one probe records why
            n = series.grid_keys[0] if series.grid_keys else self.conf.min_keys
            if series.probes:
                series.verdict = series.verdict or {"outcome": "infeasible"}
                return []
            return [Probe(n, "record why the configuration is infeasible")]
        nxt = next_probes(series.spec, series.observed, series.losses)
        if isinstance(nxt, Verdict):
            series.verdict = {k: v for k, v in asdict(nxt).items() if v is not None}
            return []
        return nxt

    def _read(self, series: Series, n_keys: int) -> bool:
        """Fold a finished probe into its series; False if the store has no result for it."""
        summary = self.sweeper.indexed(series.point(n_keys))
        if summary is None:
            return False
        probe = next(p for p in series.probes if p["n_keys"] == n_keys)
        probe["run_id"] = summary["run_id"]
        if summary["status"] == "infeasible":
            series.verdict = {"outcome": "infeasible", "reason": summary["reason"]}
            return True
        loss = summary["final_eval_loss"]
        fails = bool(failing(math.nan if loss is None else float(loss),
                             summary["status"] == "diverged", self.conf.threshold))
        probe["fails"] = fails
        series.observed[n_keys] = fails
        if loss is not None and summary["status"] != "diverged":
            series.losses[n_keys] = float(loss)
        return True

    def _write(self, all_series: list[Series]) -> None:
        if self.config.dry_run:
            return
        path = store.search_file(self.exp_dir)
        with FileLock(str(path) + ".lock"):  # keep the series of another sweep on this store
            try:
                series = store.read_search(self.exp_dir) or {}
            except store.StoreError as err:
                print(store.set_aside(path, err), file=sys.stderr)
                series = {}
            series.update({s.key: s.record() for s in all_series})
            files.atomic_write_text(path, json.dumps({"series": series}, indent=1) + "\n")
