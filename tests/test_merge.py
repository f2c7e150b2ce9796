"""A store kept apart (``results/pending``) joins the store it extends whole
(``kernelzoo.records.merge``): runs, search series and sweep invocations, nothing overwritten, a conflict
refused before anything is written, a repeated merge a no-op; the analysis reads the merged
store as one."""

from __future__ import annotations

import json
import os
import resource
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from kernelzoo.records.files import StoreError
from kernelzoo.records.merge import merge
from kernelzoo.analysis.runs import load_runs
from synthetic import write_series
from conftest import snapshot


def contents(exp_dir: Path) -> dict:
    """The store's files but the lock files a sweep leaves beside its records too."""
    return {k: v for k, v in snapshot(exp_dir).items() if not k.endswith(".lock")}


def series(probes: list[int]) -> dict:
    return {"overrides": ["seed=1"], "d_dot": 64, "spec": {}, "verdict": None,
            "probes": [{"n_keys": n, "round": i + 1, "why": "bisect", "run_id": f"r{n}",
                        "fails": n > 64} for i, n in enumerate(probes)]}


def invocation(started: str, wall: float) -> dict:
    return {"started": started, "points": 3, "search": {"series": 1, "rounds": 2},
            "outcomes": {"converged": 3}, "wall_seconds": wall, "launcher": "JoblibLauncher",
            "machine": "test"}


def records(exp_dir: Path, found: dict, invocations: list[dict]) -> None:
    (exp_dir / "search.json").write_text(json.dumps({"series": found}))
    (exp_dir / "sweep.json").write_text(json.dumps(
        {"invocations": invocations, "wall_seconds": sum(i["wall_seconds"] for i in invocations)}))


@pytest.fixture
def stores(tmp_path):
    """The reference: ELU+1 (d_dot 64), seeds 1-2; the pending store: DPFP-1 (d_dot 128),
    seed 1, one run unfinished, a series ELU+1 seed 1 continued and a new one."""
    ref, pending = tmp_path / "reference" / "zoo", tmp_path / "pending" / "zoo"
    for seed in (1, 2):
        write_series(ref, {32: 1e-4, 64: 1e-4, 96: 0.3}, seed=seed)
    write_series(pending, {64: 1e-4, 128: 1e-4, 192: 0.3}, feature_map="dpfp",
                 params={"nu": 1}, d_dot=128)
    (pending / "runs" / "dpfp-unfinished").mkdir()
    records(ref, {"elu-1": series([32, 64]), "elu-2": series([32, 64, 96])},
            [invocation("2026-12-01T10:00:00", 100.0)])
    records(pending, {"elu-1": series([32, 64, 96]), "dpfp-1": series([64, 128, 192])},
            [invocation("2026-12-04T10:00:00", 30.5), invocation("2026-12-05T10:00:00", 12.0)])
    return ref, pending


def test_a_pending_store_joins_whole_and_a_second_merge_adds_nothing(stores, tmp_path):
    ref, pending = stores
    done = merge(pending, ref)
    assert len(done.copied) == 3 and done.present == [] and done.unfinished == ["dpfp-unfinished"]
    assert (done.series, done.invocations) == (2, 2)
    runs = sorted(p.name for p in (ref / "runs").iterdir())
    assert len(runs) == 9 and "dpfp-unfinished" not in runs
    found = json.loads((ref / "search.json").read_text())["series"]
    assert [p["n_keys"] for p in found["elu-1"]["probes"]] == [32, 64, 96]  # continued
    assert [p["n_keys"] for p in found["elu-2"]["probes"]] == [32, 64, 96]  # kept
    assert set(found) == {"elu-1", "elu-2", "dpfp-1"}
    sweep = json.loads((ref / "sweep.json").read_text())
    assert [i["started"][:10] for i in sweep["invocations"]] == \
        ["2026-12-01", "2026-12-04", "2026-12-05"]
    assert sweep["wall_seconds"] == 142.5
    before = contents(ref)
    again = merge(pending, ref)
    assert (len(again.copied), len(again.present), again.series, again.invocations) == \
        (0, 3, 0, 0)
    assert contents(ref) == before
    runs, unfinished, damaged = load_runs(ref)
    assert (unfinished, damaged, len(runs)) == ([], [], 9)
    assert runs.groupby("feature_map").size().to_dict() == {"dpfp": 3, "elu": 6}


def test_a_series_recorded_by_an_older_sweeper_is_continued_with_both_records_fields(stores):
    """The reference recorded elu-1's probes without the accuracy view's fields; the pending
    store recorded the same probes with them and one more: the same probes, so it continues."""
    ref, pending = stores
    newer = series([32, 64, 96])
    for p in newer["probes"]:
        p.update(accuracy_fails=p["fails"], keys_retrieved=float(min(p["n_keys"], 64)))
    records(pending, {"elu-1": newer}, [])
    older = json.loads((ref / "search.json").read_text())["series"]
    assert [p["n_keys"] for p in older["elu-1"]["probes"]] == [32, 64]
    assert "keys_retrieved" not in older["elu-1"]["probes"][0]
    assert merge(pending, ref).series == 1
    found = json.loads((ref / "search.json").read_text())["series"]["elu-1"]["probes"]
    assert found == newer["probes"]
    assert merge(pending, ref).series == 0


@pytest.mark.parametrize("spoil, needle", [
    ("experiment", "two experiments"),
    ("run", "the two stores hold different results"),
    ("series", "search series elu-2: the two stores probed it differently"),
])
def test_a_conflict_is_refused_before_anything_is_written(stores, spoil, needle):
    ref, pending = stores
    if spoil == "experiment":
        pending = pending.rename(pending.with_name("figure2"))
    elif spoil == "run":
        write_series(pending, {96: 1e-4}, seed=2)  # the reference says 0.3 at 96 keys, seed 2
    else:
        found = json.loads((pending / "search.json").read_text())["series"]
        records(pending, {**found, "elu-2": series([32, 48])}, [])
    before = contents(ref)
    with pytest.raises(StoreError, match=needle):
        merge(pending, ref)
    assert contents(ref) == before


def test_the_command_says_what_it_did_and_refuses_a_link(stores, tmp_path):
    ref, pending = stores
    outside = tmp_path / "outside"
    outside.mkdir()
    (pending / "runs" / "elu-link").symlink_to(outside, target_is_directory=True)
    cmd = [sys.executable, "-m", "kernelzoo.records.merge", str(pending), str(ref)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 1 and "a symbolic link in the store" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    (pending / "runs" / "elu-link").unlink()
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "3 runs copied, 0 already there, 1 unfinished left behind" in res.stdout
    assert "2 search series added or extended, 2 sweep invocations added" in res.stdout


def _small_disk() -> None:
    """In the merge's process: no file may grow past 1 MiB (a full disk, in effect)."""
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))


def _plant(path: Path, what: str, outside: Path) -> None:
    path.unlink(missing_ok=True)
    if what == "device":
        try:
            os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 5))  # /dev/zero's numbers
        except PermissionError:
            pytest.skip("making a device node needs CAP_MKNOD")
    elif what == "fifo":
        os.mkfifo(path)
    elif what == "link":
        (outside / "secret").write_text("not the store's")
        path.symlink_to(outside / "secret")
    else:  # a regular file larger than the disk has room for
        path.write_bytes(b"0" * (2 << 20))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("what, words", [
    ("device", "a character device, not a regular file or directory"),
    ("fifo", "a FIFO, not a regular file or directory"),
    ("link", "a symbolic link, not a regular file or directory"),
    ("larger than the disk", "File too large"),
])
def test_merge_copies_regular_files_only_and_leaves_no_part_behind(stores, tmp_path, what,
                                                                   words):
    """A curve.csv that is /dev/zero was copied until the disk was full and the part left in
    the target's staging; a FIFO gave a partial merge and a list of errors; a link was copied.
    Each is one line naming the file, exit 1, the target as it was (a file too large for the
    disk is copied no further than that, and its staging removed)."""
    ref, pending = stores
    outside = tmp_path / "outside"
    outside.mkdir()
    run = next((pending / "runs").glob("dpfp*S128*"))
    bad = run / "curve.csv"
    _plant(bad, what, outside)
    before = contents(ref)
    res = subprocess.run([sys.executable, "-m", "kernelzoo.records.merge", str(pending), str(ref)],
                         capture_output=True, text=True, preexec_fn=_small_disk, timeout=100)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 1 and len(lines) == 1, (res.returncode, res.stderr)
    assert lines[0].startswith(f"error: {bad}: " if what != "larger than the disk" else
                               "error: ") and words in lines[0], lines
    if what == "larger than the disk":  # the runs copied before it stay, each whole
        assert not (ref / "runs" / run.name).exists()
        assert not [p for p in (ref / "runs").iterdir() if p.name.startswith(".")]
    else:
        assert contents(ref) == before
    assert (outside / "secret").read_text() == "not the store's" if what == "link" else True


def test_a_store_inside_the_other_is_refused(stores, tmp_path):
    """Merging into a folder inside one of the source's runs recursed 73 levels deep."""
    ref, pending = stores
    run = next((pending / "runs").glob("dpfp*S64*"))
    before = contents(pending)
    for source, target in ((pending, run / "zoo"), (run / "zoo", pending)):
        (run / "zoo" / "runs").mkdir(parents=True, exist_ok=True)
        with pytest.raises(StoreError, match="one inside the other; valid: two separate stores"):
            merge(source, target)
    assert contents(pending) == before


def test_a_run_trained_alike_in_both_stores_merges_as_one(stores):
    """The same run trained in both stores differs in its wall_seconds alone: it was a
    conflict although its curve was byte-identical."""
    ref, pending = stores
    run = next((pending / "runs").glob("dpfp*S64*"))
    twin = ref / "runs" / run.name
    shutil.copytree(run, twin)
    summary = json.loads((twin / "summary.json").read_text())
    (twin / "summary.json").write_text(json.dumps({**summary, "wall_seconds": 9.5}))
    done = merge(pending, ref)
    assert done.present == [run.name] and len(done.copied) == 2
    assert json.loads((twin / "summary.json").read_text())["wall_seconds"] == 9.5  # kept
    (twin / "curve.csv").write_text((twin / "curve.csv").read_text().replace("100,", "101,"))
    with pytest.raises(StoreError, match=f"run {run.name}: the two stores hold different"):
        merge(pending, ref)


def test_a_foreign_experiments_run_is_refused(stores):
    ref, pending = stores
    foreign = write_series(pending.parent / "figure2", {40: 1e-4}, seed=7)[0]
    shutil.copytree(foreign, pending / "runs" / foreign.name)
    before = contents(ref)
    with pytest.raises(StoreError, match=f"{foreign.name}: a run of experiment 'figure2', "
                                         "not 'zoo'"):
        merge(pending, ref)
    assert contents(ref) == before


def test_a_wrong_type_in_a_record_is_refused_before_any_copy(stores):
    """A sweep record whose invocations cannot be ordered gave a TypeError after the runs were
    copied; a search record nested past reason gave a RecursionError."""
    ref, pending = stores
    sweep = json.loads((pending / "sweep.json").read_text())
    sweep["invocations"][0]["started"] = 20261204
    (pending / "sweep.json").write_text(json.dumps(sweep))
    before = contents(ref)
    with pytest.raises(StoreError, match="invocations that cannot be ordered by their start"):
        merge(pending, ref)
    assert contents(ref) == before
    (pending / "sweep.json").unlink()
    (pending / "search.json").write_text('{"series": ' + "[" * 5000 + "]" * 5000 + "}")
    with pytest.raises(StoreError, match="search.json: not readable JSON \\(nested deeper"):
        merge(pending, ref)
    assert contents(ref) == before


def test_ctrl_c_is_one_line(stores, monkeypatch, capsys):
    from kernelzoo.records import merge as command

    def interrupted(source, target):
        raise KeyboardInterrupt

    monkeypatch.setattr(command, "merge", interrupted)
    with pytest.raises(SystemExit) as stop:
        command.main([str(stores[1]), str(stores[0])])
    assert stop.value.code == 130
    assert capsys.readouterr().err == (
        f"interrupted: each run and record written into {stores[0]} so far is whole; the same "
        "command finishes the merge\n")


def test_a_link_planted_as_a_records_lock_is_not_written_through(stores, tmp_path):
    """A record's lock file is opened for writing: through a link planted under its name it
    would empty what the link points to (filelock 3.x), or fail (4.x). It is removed, the
    merge goes on and the file it pointed to is untouched."""
    ref, pending = stores
    victim = tmp_path / "thesis.tex"
    victim.write_text("years of work\n")
    for name in ("sweep.json.lock", "search.json.lock"):
        (ref / name).unlink(missing_ok=True)
        (ref / name).symlink_to(victim)
    assert len(merge(pending, ref).copied) == 3
    assert victim.read_text() == "years of work\n"
    assert not any((ref / n).is_symlink() for n in ("sweep.json.lock", "search.json.lock"))


def test_a_run_resumed_alike_is_the_same_run(stores):
    """A byte-identical run resumed 3 times from its checkpoints in one store: its summary
    differs in wall_seconds and resumes alone, and merge called it "different results"."""
    ref, pending = stores
    run = next((pending / "runs").glob("dpfp*S64*"))
    twin = ref / "runs" / run.name
    shutil.copytree(run, twin)
    summary = json.loads((twin / "summary.json").read_text())
    (twin / "summary.json").write_text(json.dumps({**summary, "wall_seconds": 9.5,
                                                   "resumes": 3}))
    assert merge(pending, ref).present == [run.name]


@pytest.mark.parametrize("probe, needle", [
    ("64", 'search series dpfp-1: "64" is no probe'),
    ({"n_keys": "64", "run_id": "r64"}, "search series dpfp-1: {\"n_keys\": \"64\""),
])
def test_a_probe_that_is_no_probe_record_is_refused(stores, probe, needle):
    ref, pending = stores
    records(pending, {"dpfp-1": {**series([64]), "probes": [probe]}}, [])
    before = contents(ref)
    with pytest.raises(StoreError, match=needle.replace("{", "\\{")):
        merge(pending, ref)
    assert contents(ref) == before


def test_a_common_probe_recorded_differently_is_a_conflict(stores):
    """The same probe (n_keys and run) recorded failing in one store and passing in the other
    was merged silently, the pending store's field winning."""
    ref, pending = stores
    spoiled = series([32, 64, 96])
    spoiled["probes"][1]["fails"] = True  # the reference records 64 keys passing
    records(pending, {"elu-1": spoiled}, [])
    before = contents(ref)
    with pytest.raises(StoreError, match="search series elu-1: the probe at n_keys=64 is "
                                         "recorded differently \\(fails False and True\\)"):
        merge(pending, ref)
    assert contents(ref) == before
