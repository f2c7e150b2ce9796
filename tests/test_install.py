"""kernelzoo installed as a plain (non-editable) package works from any directory: ``pip install .``
into a fresh venv ships conf/ and experiments/ inside the package without a warning from
setuptools, and the smoke sweep and its analysis run from an unrelated directory with nothing of
the checkout on the path."""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # a pip install and a sweep: ~21 s of make test's ~300 worker-seconds
def test_a_plain_install_runs_the_smoke_sweep_from_another_directory(tmp_path):
    venv, work = tmp_path / "venv", tmp_path / "elsewhere"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    fresh_site = Path(subprocess.run([py, "-c", "import site; print(site.getsitepackages()[0])"],
                                     capture_output=True, text=True, check=True).stdout.strip())
    # the dependencies come from the test environment's site-packages, added as a plain path:
    # its .pth files (the editable kernelzoo among them) are not processed there
    (fresh_site / "deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    source = tmp_path / "checkout"  # setuptools builds in the source tree: a copy of it
    source.mkdir()
    for part in ("pyproject.toml", "README.md", "src", "conf", "experiments"):
        copy = shutil.copytree if (ROOT / part).is_dir() else shutil.copy2
        kwargs = {"symlinks": True, "ignore": shutil.ignore_patterns("__pycache__", "*.egg-info")}
        copy(ROOT / part, source / part, **(kwargs if copy is shutil.copytree else {}))
    build = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                            "--no-build-isolation", "--no-cache-dir", "--target",
                            str(fresh_site), str(source)],
                           capture_output=True, text=True, cwd=tmp_path)
    assert build.returncode == 0, build.stderr[-2000:]
    assert "Warning" not in build.stderr, build.stderr[-2000:]  # setuptools has nothing to say
    shipped = fresh_site / "kernelzoo" / "conf"
    assert (shipped / "config.yaml").is_file() and (shipped / "experiments" / "smoke.yaml").is_file()
    assert (fresh_site / "kernelzoo" / "data" / "published_figure2.csv").is_file()

    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(WANDB_MODE="disabled", PYTHONDONTWRITEBYTECODE="1")
    where = subprocess.run(
        [py, "-c", "import kernelzoo, hydra_plugins.kernelzoo_sweeper as s; "
                   "print(kernelzoo.__file__); print(s.__file__)"],
        capture_output=True, text=True, cwd=work, env=env, check=True).stdout.split()
    assert all(Path(p).is_relative_to(fresh_site) for p in where), where
    hint = subprocess.run([py, "-c", "from kernelzoo.records import tracking; print(tracking.SYNC)"],
                          capture_output=True, text=True, cwd=work, env=env, check=True).stdout
    assert hint.strip() == "`wandb sync <results_dir>/wandb/offline-run-*`"  # no make here

    results = work / "results"
    sweep = subprocess.run([py, "-m", "kernelzoo.sweep", "smoke", f"results_dir={results}",
                            "hydra.sweep.dir=" + str(work / "multirun")],
                           capture_output=True, text=True, cwd=work, env=env, timeout=300)
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    summaries = [json.loads(p.read_text()) for p in results.glob("smoke/runs/*/summary.json")]
    assert len(summaries) == 6
    assert {s["status"] for s in summaries} >= {"infeasible"}
    # the sweep ends with its analysis (the installed python -m kernelzoo.analyze)
    assert f"runs of smoke -> {results / 'smoke' / 'report.md'}" in sweep.stdout, sweep.stdout
    assert (results / "smoke" / "capacity.csv").is_file()
    assert not list(ROOT.glob("elsewhere*")) and not (ROOT / "results" / "smoke").exists()
