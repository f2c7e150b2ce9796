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
format and device it was written with; otherwise the run starts over and says why.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from . import files

NAME = "checkpoint.pt"
FORMAT = 1


def key(identity: dict) -> str:
    """The run's identity as the checkpoint stores it."""
    return json.dumps(identity, sort_keys=True, default=str)


def write(path: Path, state: dict) -> None:
    """Write the run's checkpoint (``runner._Run.state`` and the fields the loop adds)."""
    files.atomic_write(path / NAME, lambda f: torch.save({"format": FORMAT, **state}, f))


def read(path: Path, identity: dict, device: torch.device) -> tuple[dict | None, str | None]:
    """The run's checkpoint and None, or None and why it cannot be used (None and None when
    the run has none)."""
    file = path / NAME
    if not file.exists():
        return None, None
    try:
        state = torch.load(file, map_location=device, weights_only=True, mmap=True)
    except Exception as err:  # a damaged or foreign file: the run starts over
        return None, f"its {NAME} cannot be read ({type(err).__name__})"
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        return None, f"its {NAME} is not of format {FORMAT}"
    if state.get("identity") != key(identity):
        return None, f"its {NAME} is of another configuration"
    if state.get("device") != str(device):
        return None, f"its {NAME} was written on {state.get('device')}, this run trains on {device}"
    if not (path / "curve.csv").is_file():
        return None, f"its curve.csv is missing beside its {NAME}"
    return state, None


def remove(path: Path) -> None:
    (path / NAME).unlink(missing_ok=True)
