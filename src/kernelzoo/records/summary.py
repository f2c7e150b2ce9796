"""A run's ``summary.json``: its fields declared once (``FIELDS``), in the order they are written.

Every writer builds a summary with ``new`` (a field it does not give takes its default; an
unknown or missing field is a ValueError), the store checks it before writing it and every
reader checks what it reads (``problem``: ``RunDir.write_summary``, ``store.read_summary``).

A field is one of three kinds, by what a summary without it means:

- ``REQUIRED``: every summary has it; one without it is damaged;
- ``NULL_WHEN_ABSENT``: written by this version, absent from older summaries, read as null;
- ``OPTIONAL``: absent from older summaries, and absent from a summary that has no such value
  (the diagnostics of an infeasible record, never trained: ``core/diagnostics.py``); read as
  absent.

A field present is checked against its type (a number may be null or the store's "inf" and
"-inf"); fields that are not declared are kept as they are.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Callable

from kernelzoo import __version__
from kernelzoo.config import is_name
from kernelzoo.config.schema import N_KEYS_MAX

REQUIRED, NULL_WHEN_ABSENT, OPTIONAL = "required", "null when absent", "optional"
STATUSES = ("converged", "plateau", "max_steps", "diverged", "infeasible")
NO_DEFAULT = object()  # a writer must give the field


@dataclass(frozen=True)
class Field:
    """One field of summary.json: its name, its type (``test``, ``what`` it must be), its kind
    and the value a writer that does not give it gets."""

    name: str
    test: Callable[[object], bool]
    what: str
    kind: str = REQUIRED
    default: object = NO_DEFAULT


def _integer(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(v) -> bool:
    return v in ("inf", "-inf") or isinstance(v, (int, float)) and not isinstance(v, bool)


def _finite(v) -> bool:
    return _number(v) and v not in ("inf", "-inf") and math.isfinite(v)


def _text(v) -> bool:
    return isinstance(v, str)


def _or_null(test: Callable[[object], bool]) -> Callable[[object], bool]:
    return lambda v: v is None or test(v)


def _count(v) -> bool:
    return _integer(v) and v >= 1


INTEGER = (_integer, "an integer")
NAME = (lambda v: _text(v) and is_name(v), "a name (letters, digits, '-', '_', '.')")
RUN_ID = (lambda v: _text(v) and is_run_id(v), "a run id (letters, digits, '-', '_', '.')")


def is_run_id(value: str) -> bool:
    """A run directory's name: one path component of letters, digits, '-', '_' and '.' (of any
    length: a map's parameters may make it longer than a config name)."""
    return bool(RUN_ID_CHARS.fullmatch(value)) and value not in (".", "..")


RUN_ID_CHARS = re.compile(r"[A-Za-z0-9_.-]+")
COUNT, COUNT_OR_NULL = (_count, "an integer >= 1"), (_or_null(_count), "an integer >= 1 or null")
NUMBER = (_or_null(_number), "a number, null or \"inf\"")
# values the analysis computes with: in range, so it never builds by a value it read
LOSS = (_or_null(lambda v: _finite(v) and v >= 0), "a finite number >= 0 or null")
ACCURACY = (_or_null(lambda v: _finite(v) and 0 <= v <= 1), "a number in [0, 1] or null")
SECONDS = (lambda v: _finite(v) and v >= 0, "a finite number >= 0")
N_KEYS = (lambda v: _count(v) and v <= N_KEYS_MAX, f"an integer from 1 to {N_KEYS_MAX}")
NATURAL = (lambda v: _integer(v) and v >= 0, "an integer >= 0")
NATURAL_OR_NULL = (_or_null(NATURAL[0]), "an integer >= 0 or null")
TEXT, TEXT_OR_NULL = (_text, "a string"), (_or_null(_text), "a string or null")
# what core/diagnostics.py measures on the trained model (null where it could not)
DIAGNOSTICS = ("phi_rank", "phi_effective_rank", "phi_rank_initial", "phi_effective_rank_initial",
               "margin", "negative_margin_fraction", "dead_keys")

FIELDS = (
    Field("run_id", *RUN_ID),
    Field("experiment", *NAME),
    Field("task", *TEXT_OR_NULL),
    Field("feature_map", *NAME),
    Field("feature_map_params", lambda v: isinstance(v, dict) and all(map(is_name, v)),
          "an object whose keys are names"),
    Field("d_key", *COUNT),
    Field("d_dot", *COUNT_OR_NULL),  # null: unbounded (softmax)
    Field("predicted_capacity", *COUNT_OR_NULL),  # d_dot, the capacity the reference predicts
    Field("n_keys", *N_KEYS),
    Field("seq_len", *COUNT_OR_NULL),
    Field("update_rule", *TEXT),
    Field("normalisation", *TEXT_OR_NULL),
    Field("seed", *INTEGER),
    Field("status", lambda v: v in STATUSES, f"one of {', '.join(STATUSES)}"),
    Field("reason", *TEXT_OR_NULL, default=None),
    Field("steps", *NATURAL, default=0),
    Field("final_eval_loss", *LOSS, default=None),
    Field("best_eval_loss", *LOSS, default=None),
    Field("final_eval_accuracy", *ACCURACY, default=None),
    Field("wall_seconds", *SECONDS, default=0.0),
    Field("device", *TEXT_OR_NULL, default=None),
    Field("kernelzoo_version", *TEXT, default=__version__),
    Field("resumes", *NATURAL, kind=OPTIONAL, default=0),  # continued from a checkpoint
    # what sets its arithmetic to the last bit (training.devices.numerics): torch, device, BLAS,
    # threads, the pack it trained in, denormals flushed, compiled
    Field("numerics", lambda v: isinstance(v, dict) and all(map(is_name, v)),
          "an object whose keys are names", kind=OPTIONAL),
    Field("stall_check_of", _or_null(lambda v: _text(v) and is_name(v)), "a run id or null",
          kind=NULL_WHEN_ABSENT, default=None),  # the stalled run a stall check retrains
    *(Field(name, *(NATURAL_OR_NULL if name == "dead_keys" else NUMBER), kind=OPTIONAL)
      for name in DIAGNOSTICS),
)
BY_NAME = {f.name: f for f in FIELDS}


def new(**values) -> dict:
    """A summary of ``values`` in the declared order, each field not given at its default (an
    ``OPTIONAL`` field without one stays absent); ValueError for a field not declared or a
    required one missing."""
    unknown = [k for k in values if k not in BY_NAME]
    if unknown:
        raise ValueError(f"summary has no field {', '.join(unknown)}")
    missing = [f.name for f in FIELDS if f.name not in values and f.default is NO_DEFAULT
               and f.kind != OPTIONAL]
    if missing:
        raise ValueError(f"summary lacks {', '.join(missing)}")
    return {f.name: values.get(f.name, f.default) for f in FIELDS
            if f.name in values or f.default is not NO_DEFAULT}


def problem(summary: dict) -> str | None:
    """What makes ``summary`` (as JSON holds it) no summary, or None; a ``NULL_WHEN_ABSENT``
    field it lacks is set to null."""
    missing = [f.name for f in FIELDS if f.kind == REQUIRED and f.name not in summary]
    if missing:
        return f"summary lacks {', '.join(missing)}"
    for f in FIELDS:
        if f.kind == NULL_WHEN_ABSENT:
            summary.setdefault(f.name, None)
        if f.name in summary and not f.test(summary[f.name]):
            value = summary[f.name]
            if f.name == "status":
                return f"status {value!r} is not {f.what}"
            return f"{f.name} is {json.dumps(value)[:40]}, not {f.what}"
    return None
