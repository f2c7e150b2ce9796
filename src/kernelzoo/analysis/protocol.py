"""Which protocol the runs of a store were trained with (the report says it in one line:
``report.markdown.protocol_line``).

The published protocol is the trainer schema's defaults (``kernelzoo.config.TrainerConf``,
which ``conf/trainer/paper.yaml`` spells out: at most 100,000 steps, patience 10, ...). A run's
trainer settings are those its config.yaml recorded (``settings.of_config``: how it was trained,
not where), and its learning rate. ``departures`` names every setting some run had otherwise,
with the values seen, and ``capped`` counts the runs that stopped at their step cap rather than
by the stopping rule: a failure there may be slow learning rather than lack of capacity.
"""

from __future__ import annotations

import json
from dataclasses import fields

import pandas as pd

from kernelzoo.config import TrainerConf, show

PUBLISHED = {f"trainer.{f.name}": f.default for f in fields(TrainerConf)}


def format_value(value) -> str:
    """A setting as a command line would give it: 3000, 0.001, true, null."""
    return f"{value:g}" if isinstance(value, float) else show(value)


def departures(runs: pd.DataFrame) -> dict[str, list[str]]:
    """{trainer setting: the values some run had other than the published one, as written}."""
    seen: dict[str, set[str]] = {}
    for text in runs.get("settings", pd.Series(dtype=str)).dropna().unique():
        for key, value in (json.loads(text) if text else {}).items():
            if key in PUBLISHED and value != PUBLISHED[key]:
                seen.setdefault(key, set()).add(format_value(value))
    for value in runs.get("lr", pd.Series(dtype=str)).dropna().unique():
        if value != "" and float(value) != PUBLISHED["trainer.lr"]:
            seen.setdefault("trainer.lr", set()).add(value)
    return {k: sorted(v, key=lambda x: (len(x), x)) for k, v in sorted(seen.items())}


def capped(runs: pd.DataFrame) -> tuple[int, int]:
    """(runs that stopped at their step cap, runs trained): infeasible points train nothing."""
    trained = runs[runs["status"] != "infeasible"]
    return int((trained["status"] == "max_steps").sum()), len(trained)
