"""Checkpoints (checkpoint.py): an unfinished run continued from its checkpoint ends exactly as
the run that never stopped — the same curve, byte for byte, and the same summary."""

import json
from dataclasses import replace

import pytest
from conftest import PYTHON, slow_but, train as cli_train
from test_pack import CASES, composed

from kernelzoo.records import store
from kernelzoo.training import checkpoint
from kernelzoo.records.rundir import RunDir
from kernelzoo.training.job import run
from kernelzoo.training.plan import plan

TINY = ["d_key=8", "logger=none", "trainer.max_steps=300", "trainer.eval_every=50",
        "trainer.eval_sequences=4", "trainer.patience=100", "trainer.progress=false"]
RESUME_CASES = {**CASES, "favor_every_n": ["feature_map=favor", "feature_map.m=16",
                                           "feature_map.redraw=every_n_steps",
                                           "feature_map.redraw_every=30"]}
SAME = ("status", "reason", "steps", "final_eval_loss", "best_eval_loss", "final_eval_accuracy")


class Stop(KeyboardInterrupt):
    """The kill of a test: raised where the real one could land."""


def train(results, overrides, members=(), echo=None):
    cfg = composed(*TINY, f"results_dir={results}", "trainer.checkpoint_minutes=0", *overrides,
                   f"pack_members={json.dumps([list(m) for m in members])}")
    return {rid: summary for rid, summary in run(cfg, echo=echo or (lambda line: None))}


def stop_at_checkpoint(monkeypatch, n: int) -> None:
    """Kill the training when it would write its n-th checkpoint file (a pack writes one per
    run): the files before it are written, and the evaluation at that step is in curve.csv."""
    written, real = [], checkpoint.write

    def write(path, state):
        if len(written) + 1 == n:
            raise Stop
        written.append(state["step"])
        real(path, state)

    monkeypatch.setattr(checkpoint, "write", write)


def run_dir(results, rid):
    return store.run_dir(str(results), "adhoc", rid)


def assert_same_run(a, b, rid):
    """Run ``rid`` of stores a and b: the same curve bytes, summary and diagnostics."""
    assert (run_dir(a, rid) / "curve.csv").read_bytes() == (run_dir(b, rid) / "curve.csv").read_bytes()
    sa, sb = (store.read_summary(run_dir(r, rid)) for r in (a, b))
    assert {k: sa[k] for k in SAME} == {k: sb[k] for k in SAME}
    assert {k: v for k, v in sa.items() if k.startswith(("feature_rank", "dead", "margin"))} == \
           {k: v for k, v in sb.items() if k.startswith(("feature_rank", "dead", "margin"))}


@pytest.mark.parametrize("case", slow_but({"elu", "favor_redrawn"}, RESUME_CASES))
def test_a_run_continued_from_its_checkpoint_is_the_run_that_never_stopped(tmp_path, case,
                                                                            monkeypatch):
    """Killed after the evaluation at step 200, before its checkpoint: the rerun continues
    from step 150 (the row of step 200 is dropped and recomputed) and ends bit-identical."""
    point = [*RESUME_CASES[case], "n_keys=10", "seed=3"]
    (rid,) = train(tmp_path / "whole", point)
    with monkeypatch.context() as m:
        stop_at_checkpoint(m, 4)
        with pytest.raises(Stop):
            train(tmp_path / "stopped", point)
    path = run_dir(tmp_path / "stopped", rid)
    assert (path / checkpoint.NAME).is_file() and not (path / "summary.json").exists()
    assert "200," in (path / "curve.csv").read_text()
    lines = []
    train(tmp_path / "stopped", point, echo=lines.append)
    assert f"resume {rid}: from its checkpoint at step 150" in "\n".join(lines)
    assert_same_run(tmp_path / "stopped", tmp_path / "whole", rid)
    summary = store.read_summary(path)
    assert summary["resumes"] == 1 and summary["steps"] == 300
    assert store.read_summary(run_dir(tmp_path / "whole", rid))["resumes"] == 0
    assert not (path / checkpoint.NAME).exists()  # removed with the summary


def test_a_pack_resumes_as_one_and_each_run_is_the_run_alone(tmp_path, monkeypatch):
    """Three runs killed mid-pack continue from one checkpoint step as one pack; a fourth,
    fresh, trains beside them as a pack of its own (stacked runs share Adam's step): each
    ends as when its pack never stopped."""
    point = ["feature_map=dpfp", "feature_map.nu=1", "memory=delta", "task=update", "n_keys=8",
             "seed=1"]
    members = [(8, 2), (12, 1)]
    whole = train(tmp_path / "whole", point, members)
    with monkeypatch.context() as m:
        stop_at_checkpoint(m, 7)  # the first of step 150's three
        with pytest.raises(Stop):
            train(tmp_path / "stopped", point, members)
    lines = []
    train(tmp_path / "stopped", point, [*members, (6, 1)], echo=lines.append)
    assert sum(line.startswith("resume ") for line in lines) == 3
    for rid in whole:
        assert_same_run(tmp_path / "stopped", tmp_path / "whole", rid)
    (fresh,) = train(tmp_path / "fresh", [*point[:-2], "n_keys=6", "seed=1"])
    assert_same_run(tmp_path / "stopped", tmp_path / "fresh", fresh)


@pytest.mark.parametrize("spoil, why", [
    (lambda path: (path / checkpoint.NAME).write_bytes(b"not a checkpoint"), "cannot be read"),
    (lambda path: (path / "curve.csv").unlink(), "curve.csv is missing"),
])
def test_a_checkpoint_that_cannot_be_used_restarts_the_run_and_says_why(tmp_path, monkeypatch,
                                                                        spoil, why):
    point = ["feature_map=elu", "n_keys=6"]
    (rid,) = train(tmp_path / "whole", point)
    with monkeypatch.context() as m:
        stop_at_checkpoint(m, 2)
        with pytest.raises(Stop):
            train(tmp_path / "stopped", point)
    spoil(run_dir(tmp_path / "stopped", rid))
    lines = []
    train(tmp_path / "stopped", point, echo=lines.append)
    assert any(line.startswith(f"restart {rid} from step 0: its ") and why in line
               for line in lines), lines
    assert_same_run(tmp_path / "stopped", tmp_path / "whole", rid)
    assert store.read_summary(run_dir(tmp_path / "stopped", rid))["resumes"] == 0


def test_a_checkpoint_of_another_device_or_configuration_is_not_used(tmp_path):
    p = plan(composed("feature_map=elu", "n_keys=6", "trainer.device=cpu"))
    checkpoint.write(RunDir(tmp_path), {"identity": checkpoint.key(p.identity), "device": "cuda:0",
                                "step": 50})
    (tmp_path / "curve.csv").write_text("step\n")
    saved, why = checkpoint.read(RunDir(tmp_path), p, lambda: None)
    assert saved is None and why == "its checkpoint.pt was written on cuda:0, this run trains on cpu"
    other = replace(p, identity=replace(p.identity, n_keys=7))
    saved, why = checkpoint.read(RunDir(tmp_path), other, lambda: None)
    assert saved is None and why == "its checkpoint.pt is of another configuration"
    assert checkpoint.read(RunDir(tmp_path / "none"), p, lambda: None) == (None, None)


def test_resume_false_starts_over_and_dry_run_names_the_checkpoint(tmp_path, monkeypatch):
    point = ["feature_map=elu", "n_keys=6"]
    with monkeypatch.context() as m:
        stop_at_checkpoint(m, 3)
        with pytest.raises(Stop):
            train(tmp_path, point)
    lines = []
    (rid,) = train(tmp_path, [*point, "dry_run=true"], echo=lines.append)
    assert lines == [f"plan {rid}: d_dot 8, to train from its checkpoint at step 100"]
    lines = []
    train(tmp_path, [*point, "resume=false"], echo=lines.append)
    assert not any(line.startswith(("resume", "restart")) for line in lines)
    summary = store.read_summary(run_dir(tmp_path, rid))
    assert summary["resumes"] == 0 and summary["steps"] == 300


def test_without_checkpoint_minutes_nothing_is_written(tmp_path, monkeypatch):
    written = []
    monkeypatch.setattr(checkpoint, "write", lambda path, state: written.append(path))
    train(tmp_path, ["feature_map=elu", "n_keys=6", "trainer.checkpoint_minutes=null"])
    assert written == []


@pytest.mark.slow  # ~30 s: two runs of 1500 steps in subprocesses
def test_a_run_killed_with_sigkill_continues_from_its_checkpoint(tmp_path, cli_env, background):
    """The real thing: ``kill -9`` of a training process; the rerun says where it continues
    and ends with the curve and summary of the run that was never killed."""
    args = ["-m", "kernelzoo.train", "logger=none", "trainer.threads=1", "d_key=8", "n_keys=24",
            "trainer.eval_every=50", "trainer.eval_sequences=4", "trainer.max_steps=1500",
            "trainer.patience=1000", "trainer.stop_loss=1e-12", "trainer.checkpoint_minutes=0"]
    whole = cli_train([*args[2:], f"results_dir={tmp_path / 'whole'}"], cli_env)
    assert whole.returncode == 0, whole.explain()
    (rid,) = [p.name for p in (tmp_path / "whole" / "adhoc" / "runs").iterdir()]
    path = run_dir(tmp_path / "killed", rid)
    proc = background([PYTHON, *args, f"results_dir={tmp_path / 'killed'}"], cli_env)
    assert proc.wait_for(lambda b: (path / checkpoint.NAME).exists()
                         and "550," in (path / "curve.csv").read_text(), timeout=120, poll=0.02)
    proc.kill()
    assert not (path / "summary.json").exists()
    rerun = cli_train([*args[2:], f"results_dir={tmp_path / 'killed'}"], cli_env)
    assert rerun.returncode == 0, rerun.explain()
    assert f"resume {rid}: from its checkpoint at step " in rerun.stdout
    assert any(f"resume {rid}: from its checkpoint" in log.read_text()  # the rerun's train.log
               for log in (tmp_path / "killed" / "adhoc" / "hydra").rglob("train.log"))
    assert_same_run(tmp_path / "killed", tmp_path / "whole", rid)
