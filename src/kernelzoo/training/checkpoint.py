"""A run's checkpoint: what an unfinished run needs to go on as if it had never stopped.

At an evaluation, once ``trainer.checkpoint_minutes`` have passed since the last checkpoint (or
the start), every run of a pack writes ``checkpoint.pt`` into its run directory, atomically:
its step, its model's state (weights; a random map's projection, redraw count and generators:
``get_extra_state``), its Adam moments and step count (``Pack.adam_state``), its task's two
generators, its stopping-rule state, its wall time so far and how often it was resumed. The
next attempt at the run (a rerun of the sweep, ``resume=true``) continues from that step and
``curve.csv``'s rows up to it: the same batches, projections, updates and evaluations as the
run that never stopped, to the bit (tests/test_resume.py). Only the work since the checkpoint is
redone. The checkpoint is removed when the run's summary is written.

A checkpoint is used only by the configuration that wrote it (the run's identity), with the
format and device it was written with, and only when it is a regular file whose contents fit
the run (fields, shapes, a step before max_steps); otherwise the run starts over and says why.
"""

from __future__ import annotations

import json
import os
from typing import Callable

import torch

from kernelzoo.config import TrainerConf
from kernelzoo.records import files
from kernelzoo.records.rundir import CHECKPOINT as NAME
from kernelzoo.records.rundir import RunDir
from kernelzoo.training.plan import RunIdentity, Plan

FORMAT = 1
LIMIT = 16 << 30  # bytes: far above any run's (weights, two Adam moments and generators)
FIELDS = ("step", "wall_seconds", "resumes", "model", "task", "loop", "adam")


def key(identity: RunIdentity) -> str:
    """The run's identity as the checkpoint stores it."""
    return json.dumps(identity.as_dict(), sort_keys=True, default=str)


def write(run: RunDir, state: dict) -> None:
    """Write the run's checkpoint (``runner._Run.state`` and the fields the loop adds)."""
    run.write_checkpoint(lambda f: torch.save({"format": FORMAT, **state}, f))


def read(run: RunDir, plan: Plan,
         model: Callable[[], torch.nn.Module]) -> tuple[dict | None, str | None]:
    """The checkpoint of the planned run ``plan`` and None, or None and why it cannot be used
    (None and None when the run has none). It is read only when it is a regular file of at
    most ``LIMIT`` bytes (``files.open_regular``: a FIFO is never waited on) and used only when
    its contents fit the run: its identity and device, its fields, the shapes of ``model()``'s
    state (a fresh model of the run) and of its parameters' Adam moments, and a step at an
    evaluation before the plan's ``max_steps``."""
    identity, device = plan.identity, plan.device
    file = run / NAME
    if not os.path.lexists(file):
        return None, None
    try:
        with files.open_regular(file, LIMIT) as f:
            state = torch.load(f, map_location=device, weights_only=True)
    except files.StoreError as err:
        return None, f"its {NAME} cannot be read ({str(err).removeprefix(f'{file}: ')})"
    except Exception as err:  # a damaged or foreign file: the run starts over
        return None, f"its {NAME} cannot be read ({type(err).__name__})"
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        return None, f"its {NAME} is not of format {FORMAT}"
    if state.get("identity") != key(identity):
        return None, f"its {NAME} is of another configuration"
    if state.get("device") != str(device):
        return None, f"its {NAME} was written on {state.get('device')}, this run trains on {device}"
    with torch.random.fork_rng(devices=[]):  # the fresh model draws nothing from the run's
        problem = _contents_problem(state, plan.trainer, model())
    if problem:
        return None, f"its {NAME} does not fit the run ({problem})"
    if not (run / "curve.csv").is_file():
        return None, f"its curve.csv is missing beside its {NAME}"
    return state, None


def _contents_problem(state: dict, trainer: TrainerConf, model: torch.nn.Module) -> str | None:
    """What in ``state`` (a checkpoint of the right format and configuration) the run could not
    continue from, or None."""
    missing = [k for k in FIELDS if k not in state]
    if missing:
        return f"no {', '.join(missing)}"
    step, max_steps, every = state["step"], trainer.max_steps, trainer.eval_every
    if not (_integer(step) and 0 < step < max_steps and step % every == 0):
        return (f"step {step!r}, not an evaluation (a multiple of {every}) before "
                f"max_steps {max_steps}")
    if not (_integer(state["resumes"]) and state["resumes"] >= 0
            and isinstance(state["wall_seconds"], (int, float)) and state["wall_seconds"] >= 0):
        return "resumes or wall_seconds is not a count"
    loop = state["loop"]
    if not (isinstance(loop, dict) and all(isinstance(loop.get(k), (int, float))
                                           for k in ("best", "since_best", "eval_loss", "accuracy"))):
        return "its stopping-rule state is not four numbers"
    generators = state["task"]
    if not (isinstance(generators, (list, tuple)) and len(generators) == 2 and all(
            isinstance(g, torch.Tensor) and g.dtype == torch.uint8 for g in generators)):
        return "its task's generator states are not two byte tensors"
    expected = model.state_dict()
    saved = state["model"]
    if not isinstance(saved, dict) or set(saved) != set(expected):
        theirs = set(saved) if isinstance(saved, dict) else set()
        odd = sorted(theirs ^ set(expected))
        return f"its model's keys differ: {', '.join(odd[:3]) or 'not a state dict'}"
    for name, want in expected.items():
        got = saved[name]
        if isinstance(want, torch.Tensor) and not (isinstance(got, torch.Tensor)
                                                   and got.shape == want.shape):
            return f"{name} is {_shape(got)}, the run's is {tuple(want.shape)}"
    params = dict(model.named_parameters())
    adam = state["adam"]
    if not isinstance(adam, dict) or not set(adam) <= set(params):
        return "its Adam state names parameters the model lacks"
    for name, moments in adam.items():
        if not isinstance(moments, dict):
            return f"its Adam state of {name} is not a dict"
        for k, t in moments.items():
            if not isinstance(t, torch.Tensor) or t.dim() and t.shape != params[name].shape:
                return f"its Adam {k} of {name} is {_shape(t)}, the parameter's is " \
                       f"{tuple(params[name].shape)}"
    return None


def _integer(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _shape(value) -> str:
    return str(tuple(value.shape)) if isinstance(value, torch.Tensor) else type(value).__name__

