"""Merge one experiment's store into another: the finished runs, the search's series and the
sweeper's invocations of a sweep that ran elsewhere (another machine, a worktree, a store kept
apart while its search was unfinished) join the store it extends, which the analysis then reads
as one.

    python -m kernelzoo.records.merge results/pending/zoo results/reference/zoo   (or kernelzoo-merge)

Nothing is overwritten: a run both stores hold must have the same summary (or differ in its
wall_seconds alone, with a byte-identical curve: trained alike in both), a run must be of the
experiment merged into, and a series both hold must have one record's probes begin the
other's (a search continued from the same probes); anything else is a conflict, reported
before anything is written, as is a source inside the target or the target inside a source
run (the copy would copy itself). A run without its summary (an
interrupted one) stays behind. Each run directory arrives whole (copied beside, then renamed;
removed again when the copy fails) and holds only directories and regular files: a link, a
FIFO or a device in a source run is refused, naming it, before anything is copied.
``search.json`` and ``sweep.json`` are written whole; a merge that is interrupted and run again
finishes the job and copies nothing twice. The store follows no link (``store.guard``). A
conflict is one line and exit 1 from ``main``, with nothing written.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from kernelzoo.records import history, store
from kernelzoo.records.files import (StoreError, atomic_write_text, check_tree, copy_tree, lock,
                                     read_bytes)

LEFT_BEHIND = (".claim", "checkpoint.pt")  # a run's lock, and what only a rerun would read


@dataclass
class Merged:
    """What a merge did: run ids copied, already present, and left behind unfinished; search
    series added or extended; sweeper invocations added."""
    copied: list[str] = field(default_factory=list)
    present: list[str] = field(default_factory=list)
    unfinished: list[str] = field(default_factory=list)
    series: int = 0
    invocations: int = 0

    def line(self, source: Path, target: Path) -> str:
        return (f"merged {source} into {target}: {len(self.copied)} runs copied, "
                f"{len(self.present)} already there, {len(self.unfinished)} unfinished left "
                f"behind; {self.series} search series added or extended, {self.invocations} "
                "sweep invocations added")


def _runs(exp_dir: Path) -> dict[str, Path]:
    runs = exp_dir / "runs"
    store.guard(exp_dir.parent, runs)
    return {p.name: store.guard(exp_dir.parent, p) for p in sorted(runs.iterdir())
            if not p.name.startswith(".")} if runs.is_dir() else {}


HOW = ("wall_seconds", "resumes")  # how a run was trained, not what it gave


def _same_run(ours: Path, theirs: Path) -> bool:
    """True when two run directories hold the same result: the same summary, or the same
    summary but how it was trained (``HOW``: its wall time, how often it was resumed from a
    checkpoint) and a byte-identical curve (a run trained alike in both)."""
    a, b = store.read_summary(ours), store.read_summary(theirs)
    if a == b:
        return True
    for summary in (a, b):
        for key in HOW:
            summary.pop(key, None)
    try:
        return a == b and read_bytes(ours / "curve.csv") == read_bytes(theirs / "curve.csv")
    except FileNotFoundError:
        return False


def _probe(p, key: str) -> tuple:
    """What a probe is: its n_keys and its run. The rest is what a sweeper recorded of it, and an
    older sweeper recorded less (no accuracy_fails, keys_retrieved). StoreError for anything
    that is no probe record (a string, an n_keys that is no integer >= 1)."""
    n = p.get("n_keys") if isinstance(p, dict) else None
    if not (isinstance(n, int) and not isinstance(n, bool) and n >= 1):
        raise StoreError(f"search series {key}: {json.dumps(p)[:60]} is no probe; valid: a "
                         "record with an integer n_keys, as the sweeper writes it")
    return n, p.get("run_id")


def _joined(old: dict, new: dict, key: str) -> dict:
    """One probe recorded in both stores: the fields of both, where they agree."""
    clash = [f for f in old.keys() & new.keys() if old[f] != new[f]]
    if clash:
        said = ", ".join(f"{f} {old[f]!r} and {new[f]!r}" for f in clash)
        raise StoreError(f"search series {key}: the probe at n_keys={old['n_keys']} is recorded "
                         f"differently ({said}); valid: stores whose common probes agree")
    return {**old, **new}


def _series(source: dict, target: dict) -> tuple[dict, int]:
    """The union of two search records' series; a series in both keeps the longer probe list
    when the shorter begins it (the same probes, ``_probe``), each common probe with the fields
    of both records."""
    merged, changed = dict(target), 0
    for key, theirs in source.items():
        probes = theirs.get("probes") if isinstance(theirs, dict) else None
        if not isinstance(probes, list):
            raise StoreError(f"search series {key}: no list of probes; valid: search.json as "
                             "the sweeper writes it")
        for p in probes:
            _probe(p, key)
        ours = target.get(key)
        if ours is None or ours == theirs:
            changed += ours is None
            merged[key] = theirs
            continue
        a, b = ours["probes"], theirs["probes"]
        shorter, longer = (a, b) if len(a) <= len(b) else (b, a)
        if [_probe(p, key) for p in longer[:len(shorter)]] != [_probe(p, key) for p in shorter]:
            raise StoreError(f"search series {key}: the two stores probed it differently; "
                             "valid: stores whose common series share their first probes")
        probes = [_joined(old, new, key) for old, new in zip(shorter, longer)] \
            + longer[len(shorter):]
        merged[key] = {**(theirs if longer is b else ours), "probes": probes}
        changed += merged[key] != ours
    return merged, changed


def merge(source: str | Path, target: str | Path) -> Merged:
    """Merge the experiment directory ``source`` (``<results_dir>/<experiment>``) into
    ``target``; StoreError naming the first conflict, with nothing written. Holds the locks a
    sweep takes to write ``target``'s records, so a sweep on ``target`` keeps its own too."""
    source, target = Path(source), Path(target)
    if source.resolve() == target.resolve():
        raise StoreError(f"{source}: merged into itself; valid: two different stores")
    if source.resolve().is_relative_to(target.resolve()) or \
            target.resolve().is_relative_to(source.resolve()):  # the copy would copy itself
        raise StoreError(f"{source} into {target}: one inside the other; valid: two separate "
                         "stores")
    if source.name != target.name:
        raise StoreError(f"{source} into {target}: two experiments; valid: the same "
                         "experiment's directory in two results stores")
    if not (source / "runs").is_dir():
        raise StoreError(f"{source}: no runs/ to merge; valid: an experiment directory of a "
                         "results store, <results_dir>/<experiment>")
    target.mkdir(parents=True, exist_ok=True)
    with lock(f"{history.search_file(target)}.lock"), lock(f"{history.sweep_file(target)}.lock"):
        return _merge(source, target)


def _merge(source: Path, target: Path) -> Merged:
    done = Merged()
    theirs, ours = _runs(source), _runs(target)
    for rid, path in theirs.items():
        if not store.is_done(path):
            done.unfinished.append(rid)
        elif (found := store.read_summary(path)["experiment"]) != target.name:
            raise StoreError(f"{path}: a run of experiment {found!r}, not {target.name!r}; "
                             "valid: runs of the experiment merged into")
        elif rid not in ours:
            done.copied.append(rid)
        elif not store.is_done(ours[rid]):
            raise StoreError(f"{ours[rid]}: unfinished in {target} but finished in {source}; "
                             "valid: finish or remove the unfinished run, then merge")
        elif not _same_run(ours[rid], path):
            raise StoreError(f"run {rid}: the two stores hold different results; valid: stores "
                             "whose common runs agree")
        else:
            done.present.append(rid)
    search, done.series = _series(history.read_search(source) or {},
                                  history.read_search(target) or {})
    sweeps = [history.read_sweep(d) or {"invocations": []} for d in (target, source)]
    known = [json.dumps(i, sort_keys=True) for i in sweeps[0]["invocations"]]
    added = [i for i in sweeps[1]["invocations"] if json.dumps(i, sort_keys=True) not in known]
    done.invocations = len(added)
    try:  # the new records are built before anything is copied: a wrong type is no half merge
        invocations = sorted(sweeps[0]["invocations"] + added, key=lambda i: i.get("started", ""))
    except TypeError as err:
        raise StoreError(f"{history.sweep_file(source)} and {history.sweep_file(target)}: "
                         f"invocations that cannot be ordered by their start ({err}); valid: "
                         "sweep records as the sweeper writes them") from None

    for rid in done.copied:  # a link, a FIFO or a device in a run: refused before any copy
        check_tree(theirs[rid], LEFT_BEHIND)
    (target / "runs").mkdir(parents=True, exist_ok=True)
    for rid in done.copied:
        beside = store.guard(target.parent, target / "runs" / f".{rid}.merging")
        store.remove(beside)
        copy_tree(theirs[rid], beside, LEFT_BEHIND)
        beside.rename(target / "runs" / rid)
    if done.series:
        atomic_write_text(history.search_file(target), json.dumps({"series": search}, indent=1)
                          + "\n")
    if added:
        record = {"invocations": invocations,
                  "wall_seconds": round(sum(i["wall_seconds"] for i in invocations), 1)}
        atomic_write_text(history.sweep_file(target), json.dumps(record, indent=2) + "\n")
    return done


def main(argv=None) -> None:
    """The command: merge SOURCE into TARGET (each ``<results_dir>/<experiment>``)."""
    parser = argparse.ArgumentParser(prog="python -m kernelzoo.records.merge",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("source", type=Path, help="<results_dir>/<experiment> merged from")
    parser.add_argument("target", type=Path, help="<results_dir>/<experiment> merged into")
    args = parser.parse_args(argv)
    try:
        done = merge(args.source, args.target)
    except (StoreError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print(f"interrupted: each run and record written into {args.target} so far is whole; "
              "the same command finishes the merge", file=sys.stderr)
        sys.exit(130)
    print(done.line(args.source, args.target))
    if done.unfinished:
        print(f"left behind (no summary.json): {', '.join(done.unfinished)}")


if __name__ == "__main__":
    main()
