"""A store with links, special files and odd contents, and sweeps ended in every way: the store
never reads or writes through a link out of itself, never waits on a special file, and every
case ends in one line (tests/test_store.py has the common damage: truncated and wrong files)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import TINY, runs_dir, snapshot

from kernelzoo import store
from kernelzoo import train as train_module
from kernelzoo.config import UsageError


def _composed(results, *overrides):
    from hydra import compose, initialize_config_dir

    from kernelzoo.config import CONF

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=[f"results_dir={results}", *TINY,
                                            "trainer.max_steps=50", *overrides])


def _quiet(cfg):
    return train_module.run(cfg, echo=lambda line: None)


# ------------------------------------------------------------------ links out of the store

@pytest.fixture
def victim(tmp_path) -> Path:
    """A directory outside the store, with a file someone would miss."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "thesis.tex").write_text("years of work\n")
    return outside


def _run_path(results) -> tuple[str, Path]:
    """The run id and directory the composed tiny config trains into (planned, not trained)."""
    cfg = _composed(results, "dry_run=true")
    ((rid, _),) = _quiet(cfg)
    return rid, runs_dir(results, "adhoc") / rid


@pytest.mark.parametrize("force", [False, True])
def test_a_linked_run_directory_is_refused_and_its_target_untouched(tmp_path, victim, force):
    results = tmp_path / "results"
    rid, path = _run_path(results)
    if force:  # a finished run, then its directory replaced by a link
        _quiet(_composed(results))
        store.remove(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(victim, target_is_directory=True)
    before = snapshot(victim)
    with pytest.raises(UsageError, match=f"{path}: a symbolic link"):
        _quiet(_composed(results, *(["force=true"] if force else [])))
    assert snapshot(victim) == before
    assert sorted(p.name for p in path.parent.iterdir()) == [rid]  # no .next left behind


@pytest.mark.parametrize("level", ["adhoc", "adhoc/runs"])
def test_a_linked_experiment_or_runs_directory_is_refused(tmp_path, victim, level):
    results = tmp_path / "results"
    results.mkdir()
    link = results / level
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(victim, target_is_directory=True)
    before = snapshot(victim)
    with pytest.raises(UsageError, match=f"{link}: a symbolic link"):
        _quiet(_composed(results))
    assert snapshot(victim) == before and sorted(os.listdir(victim)) == ["thesis.tex"]


def test_reset_removes_links_not_what_they_point_to(tmp_path, victim):
    run = tmp_path / "run"
    run.mkdir()
    (run / "curve.csv").symlink_to(victim / "thesis.tex")
    (run / "tmp").symlink_to(victim, target_is_directory=True)
    (run / "sub").mkdir()
    (run / "sub" / "link").symlink_to(victim, target_is_directory=True)
    store.reset(run)
    assert sorted(os.listdir(run)) == [] and (victim / "thesis.tex").read_text() == "years of work\n"


def test_a_linked_claim_lock_is_not_truncated_through(tmp_path, victim):
    run = tmp_path / "run"
    run.mkdir()
    (run / ".claim").symlink_to(victim / "thesis.tex")
    with store.Claim(run) as claimed:
        assert claimed
    assert (victim / "thesis.tex").read_text() == "years of work\n"
    assert not (run / ".claim").is_symlink()


def test_a_planted_staging_link_is_removed_not_followed(tmp_path, victim):
    results = tmp_path / "results"
    ((rid, _),) = _quiet(_composed(results))
    path = runs_dir(results, "adhoc") / rid
    (path.parent / f".{rid}.next").symlink_to(victim, target_is_directory=True)
    before = snapshot(victim)
    ((_, summary),) = _quiet(_composed(results, "force=true"))
    assert summary["status"] and snapshot(victim) == before
    assert sorted(p.name for p in path.parent.iterdir()) == [rid]
