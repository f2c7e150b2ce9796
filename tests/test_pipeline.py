"""The analysis reads its store once, in one pass (analysis.pipeline.analyse): each run's
summary.json and config.yaml once, the search and sweep records once, and the report layer
reads no store file."""

from __future__ import annotations

from collections import Counter

import pytest
from synthetic import write_grid_store

from kernelzoo.analysis import pipeline, runs
from kernelzoo.records import files
from kernelzoo.report import outputs


@pytest.fixture
def store(tmp_path):
    exp = tmp_path / "results" / "grid"
    write_grid_store(exp)
    return exp


def test_each_file_of_the_store_is_read_once(store, monkeypatch):
    read = Counter()
    for module, name in ((runs, "read_summary"), (runs, "read_config"), (runs, "read_search"),
                         (pipeline, "read_sweep"), (pipeline, "read_text")):
        original = getattr(module, name)

        def counted(path, *args, _original=original, _name=name, **kwargs):
            read[(_name, str(path))] += 1
            return _original(path, *args, **kwargs)
        monkeypatch.setattr(module, name, counted)
    a = pipeline.analyse(store, "grid", 0.01, 0.99)
    n = len(list((store / "runs").iterdir()))
    assert len(a.runs) == n
    summaries = [k for k in read if k[0] == "read_summary"]
    configs = [k for k in read if k[0] == "read_config"]
    assert len(summaries) == len(configs) == n
    assert all(read[k] == 1 for k in summaries + configs), read
    assert read[("read_search", str(store))] == 1 and read[("read_sweep", str(store))] == 1
    curves = [k for k in read if k[0] == "read_text"]  # around each failure point, once each
    assert curves and all(k[1].endswith("curve.csv") and read[k] == 1 for k in curves)


def test_writing_the_outputs_opens_no_store_file(store, monkeypatch):
    a = pipeline.analyse(store, "grid", 0.01, 0.99)
    opened = []
    monkeypatch.setattr(files, "read_text", lambda path, *args, **kwargs: opened.append(path))
    report, figures = outputs.write(a)
    assert not opened
    assert report.read_text().startswith("# Capacity analysis: `grid`")
    head = report.read_text().splitlines()[:60]
    assert "## Capacity" in head and "## Verdicts" in head
    assert {p.name for p in figures} >= {"headline.png", "loss_panels.png", "accuracy_panels.png"}
    for name in ("capacity.csv", "capacity_long.csv", "verdicts.csv", "headlines.csv",
                 "scaling.csv"):
        assert (store / name).stat().st_size > 0, name
