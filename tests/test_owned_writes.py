"""The suite writes and removes only what is its own: a link planted under the name of a
sweep's next directory redirects nothing, and the /dev/shm cleanup leaves alone what a sweep
in another PID namespace (a container sharing /dev/shm) still uses."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import PYTHON, run_cmd, smoke_args, snapshot

from kernelzoo.records import store
from kernelzoo.training import shm

# ------------------------------------------------------------------ planted links in hydra/


@pytest.mark.slow  # a dry-run sweep on the command line: ~5 s
def test_a_link_planted_as_the_next_sweep_directory_is_refused(tmp_path, cli_env):
    """A group member foresees the next sweep directory's name (time and pid) and plants a link
    there: the sweep made it with exist_ok, which follows the link, and wrote multirun.yaml,
    progress.json, its locks and the job logs where it points. The sweep stops with one line,
    exit 2, before writing anything."""
    results = tmp_path / "results"
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "thesis.tex").write_text("years of work\n")
    planted = results / "smoke" / "hydra" / "2026-12-06_23-30-00-4242"
    planted.parent.mkdir(parents=True)
    planted.symlink_to(victim, target_is_directory=True)
    before = snapshot(victim)
    res = run_cmd([PYTHON, "-m", "kernelzoo.sweep", "smoke", *smoke_args(results),
                   "dry_run=true", f"hydra.sweep.dir={planted}"], cli_env)
    assert res.returncode == 2 and "Traceback" not in res.output, res.explain()
    assert res.stderr.strip().splitlines()[-1] == (
        f"error: {planted}: a symbolic link already there, where this sweep makes its own new "
        "directory; kernelzoo writes into no directory it did not make: run again, which names "
        "a new one (remove this one only when no sweep writes there)"), res.explain()
    assert snapshot(victim) == before and sorted(os.listdir(victim)) == ["thesis.tex"]


def test_a_sweep_directory_is_made_new_or_refused(tmp_path):
    results = tmp_path / "results"
    made = store.make_dir(results, results / "exp" / "hydra" / "one")
    assert made.is_dir() and not made.is_symlink()
    with pytest.raises(store.StoreError, match="one: something already there"):
        store.make_dir(results, made)  # a directory planted there, to plant links inside
    outside = tmp_path / "outside"
    (results / "exp" / "hydra").rename(outside)
    (results / "exp" / "hydra").symlink_to(outside, target_is_directory=True)
    with pytest.raises(store.StoreError, match="hydra: a symbolic link in the store"):
        store.make_dir(results, results / "exp" / "hydra" / "two")
    assert sorted(os.listdir(outside)) == ["one"]
    mine = tmp_path / "multirun"  # a hydra.sweep.dir of the user's own, outside the store
    assert store.make_dir(results, mine) == store.make_dir(results, mine)
    link = tmp_path / "linked"
    link.symlink_to(outside, target_is_directory=True)
    with pytest.raises(store.StoreError, match="linked: a symbolic link already there"):
        store.make_dir(results, link)


# ------------------------------------------------------------------ /dev/shm shared with another namespace

def test_the_shm_cleanup_removes_only_what_a_dead_sweep_of_its_own_left(tmp_path, monkeypatch):
    """A sweep in another PID namespace sharing /dev/shm (a container) had 8 semaphores removed
    while it ran: "gone" was judged by /proc/<pid> in the cleaner's namespace. Only what a
    sweep's token lists, once its lock is free (the sweep dead, however it ended), is removed."""
    monkeypatch.delenv("JOBLIB_TEMP_FOLDER", raising=False)
    elsewhere = 2 ** 22 + 1  # no such process here: a running sweep's pid in another namespace
    theirs = [tmp_path / f"sem.loky-{elsewhere}-x1y2", tmp_path / f"sem.loky-{elsewhere}-z3",
              tmp_path / f"joblib_memmapping_folder_{elsewhere}_ab12_cd34"]
    for path in theirs:
        path.mkdir() if "folder" in path.name else path.write_text("")

    def owner_of(*names) -> shm.Owner:
        owner = shm.Owner(tmp_path, every=3600)
        assert os.environ["JOBLIB_TEMP_FOLDER"] == str(owner.dir)  # joblib's folders inside
        for name in names:
            (tmp_path / name).write_text("")
            owner.seen[name] = shm.identity((tmp_path / name).stat())
        owner.record()
        return owner

    running = owner_of("sem.loky-7-run1")
    killed = owner_of("sem.loky-8-dead1", "sem.loky-8-dead2")
    (Path(killed.dir) / "joblib_memmapping_folder_8_ab_cd").mkdir()
    killed_dir = killed.dir
    os.close(killed.fd)  # kill -9: the kernel frees its lock; nothing else happens
    killed.stop.set()
    (tmp_path / "sem.loky-8-dead2").unlink()  # gone since, and its name taken by another file
    (tmp_path / "sem.loky-8-dead2").write_text("")
    assert sorted(shm.clean(tmp_path)) == sorted([tmp_path / "sem.loky-8-dead1", killed_dir])
    assert all(p.exists() for p in theirs) and (tmp_path / "sem.loky-8-dead2").exists()
    assert (tmp_path / "sem.loky-7-run1").exists() and Path(running.dir).is_dir()
    running_dir = running.dir
    running.close()
    assert not running_dir.exists()
    assert shm.clean(tmp_path) == []


# ------------------------------------------------------------------ where results_dir may be

@pytest.mark.parametrize("where", [(".", "conf"), (".", "experiments"), ("src/kernelzoo", "conf")])
def test_a_store_inside_the_package_is_refused(where, capsys):
    """``results_dir=. experiment=conf`` wrote runs into the shipped config tree; a conf/ made
    inside the package hid the shipped one from every later command."""
    from conftest import REPO, TINY

    from kernelzoo import train

    results, experiment = where
    with pytest.raises(SystemExit) as stop:
        train.precheck([f"results_dir={REPO / results}", f"experiment={experiment}", *TINY])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(
        f"error: results_dir={REPO / results} with experiment={experiment} would write runs "
        f"into {(REPO / results / experiment).resolve() if experiment == 'experiments' else ''}"
    ) and "the package's own files" in err, err


def test_a_home_directory_in_results_dir_is_expanded(monkeypatch):
    """``results_dir='~/x'`` made a directory literally named ``~``."""
    from kernelzoo import config

    monkeypatch.setenv("HOME", "/home/someone")
    assert config.expand_home(["results_dir='~/x'", "+results_dir=~", 'results_dir="~/a b"',
                               "seed=1", "results_dir=/data/~x"]) == [
        "results_dir='/home/someone/x'", "+results_dir=/home/someone",
        'results_dir="/home/someone/a b"', "seed=1", "results_dir=/data/~x"]


def test_a_temp_file_left_by_a_killed_writer_is_cleaned_by_the_next_one(tmp_path):
    """A kill between the write and the rename left ``.report.md.*`` or ``.sweep.json.*`` for
    good. The next writer of the same file removes those older than STALE_TEMP; a write in
    flight (a fresh temp file) and other files' temp files are left alone."""
    import os
    import time

    from kernelzoo.records import files

    stale, fresh = tmp_path / ".report.md.ab12cd_9", tmp_path / ".report.md.zz12cd_9"
    other = tmp_path / ".sweep.json.ab12cd_9"
    for path in (stale, fresh, other):
        path.write_text("part")
    for path in (stale, other):
        os.utime(path, (time.time() - 2 * files.STALE_TEMP,) * 2)
    files.atomic_write_text(tmp_path / "report.md", "whole\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == [fresh.name, other.name, "report.md"]
    files.atomic_write_text(tmp_path / "sweep.json", "{}\n")
    assert not other.exists() and fresh.exists()
