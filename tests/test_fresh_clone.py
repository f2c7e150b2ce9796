"""A new user's first command on a fresh clone: ``make sweep`` builds its own venv, trains the
default sweep into the user's own store, writes a report that sets each failure point beside the
committed reference run's and the authors' published one, and leaves ``git status`` clean.

Slow (a venv from nothing plus the ``quick`` sweep: minutes on 2 cores): ``make test-slow``.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from conftest import DONE, REPO, run_cmd

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800),  # its make sweep may take 1500 s
              pytest.mark.skipif(shutil.which("make") is None or shutil.which("git") is None,
                                 reason="needs make and git")]


def git(args: list, cwd) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout


def fresh_clone(dst):
    """The working tree as a new user gets it: tracked and untracked-not-ignored files (no
    .venv, no local results), committed in a repository of its own."""
    files = git(["ls-files", "-co", "--exclude-standard", "-z"], REPO).split("\0")
    for name in filter(None, files):
        src = REPO / name
        if src.is_file() and not src.is_symlink():
            (dst / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / name)
        elif src.is_symlink():
            (dst / name).parent.mkdir(parents=True, exist_ok=True)
            (dst / name).symlink_to(src.readlink())
    git(["init", "-q"], dst)
    git(["add", "-A"], dst)
    git(["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "clone"], dst)
    return dst


def test_make_sweep_on_a_fresh_clone_trains_and_leaves_git_clean(tmp_path, cli_env):
    clone = fresh_clone(tmp_path / "kernelzoo")
    env = {k: v for k, v in cli_env.items() if k != "PYTHONPATH"}  # the clone's own package
    res = run_cmd(["make", "sweep"], env, timeout=1500, cwd=clone)
    assert res.returncode == 0, res.explain()
    assert "Traceback" not in res.output, res.explain()
    trained = DONE.findall(res.stdout)
    planned = int(re.search(r"sweep quick: (\d+) points", res.stdout).group(1))
    assert len(trained) == planned >= 30, res.stdout[-3000:]
    report = (clone / "results" / "local" / "quick" / "report.md").read_text()
    header = next(line for line in report.splitlines() if line.startswith("| configuration"))
    assert "| loss / d_dot | reference (loss) | published (loss) | flags |" in header, header
    assert git(["status", "--porcelain"], clone) == ""
