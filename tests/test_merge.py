"""A store kept apart (``results/pending``) joins the store it extends whole
(``kernelzoo.records.merge``): runs, search series and sweep invocations, nothing overwritten, a conflict
refused before anything is written, a repeated merge a no-op; the analysis reads the merged
store as one."""

from __future__ import annotations

import json
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
    run = next((pending / "runs").glob("dpfp*S64*"))
    (outside / "secret").write_text("not the store's")
    (run / "notes").symlink_to(outside / "secret")  # a link inside a run is copied as a link
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert (ref / "runs" / run.name / "notes").is_symlink()
    assert "3 runs copied, 0 already there, 1 unfinished left behind" in res.stdout
    assert "2 search series added or extended, 2 sweep invocations added" in res.stdout
