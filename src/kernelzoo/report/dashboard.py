"""The wandb dashboard of an analysis: its long tables (capacity, efficiency and scaling per view,
the final eval values per number of keys), each with feature_map and view columns to filter by
and each row's family with its colour (the figures' hex colour, ``panels.palette``), interactive
charts drawn from their rows (``CHARTS``) and the figures, logged as one ``analysis`` run of the
experiment's group (``log_dashboard``). wandb's built-in charts choose their own colours (their
Vega specs have no colour field), so the family colour travels as the tables' ``color`` column.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import pandas as pd
from matplotlib.colors import to_hex
from omegaconf import OmegaConf

from kernelzoo.analysis import efficiency, scaling
from kernelzoo.analysis.capacity import VIEWS, by_view
from kernelzoo.analysis.labels import is_search
from kernelzoo.records import tracking
from kernelzoo.report.panels import palette, panels


def dashboard_tables(runs: pd.DataFrame, capacity: pd.DataFrame,
                     families: list[scaling.Family]) -> dict[str, pd.DataFrame]:
    """The tables of the wandb dashboard (``log_dashboard``), each with feature_map and
    view columns to filter by: capacity (``capacity.by_view``), efficiency
    (``efficiency.efficiency_table``), scaling (``scaling.csv``) and keys: per configuration, view
    and n_keys the median over seeds of the final eval loss, accuracy or keys retrieved (no
    value where the run diverged), one ``series`` per configuration (a search's: per seed);
    every row with its ``family`` and that family's ``color`` (hex) as the figures draw it."""
    feasible = runs[runs["status"] != "infeasible"]
    diverged = feasible["status"].eq("diverged")
    series = feasible["label"] if not is_search(runs) else \
        feasible["label"] + " seed " + feasible["seed"].astype(str)
    values = {"loss": feasible["final_eval_loss"], "accuracy": feasible["final_eval_accuracy"],
              "keys_retrieved": feasible["n_keys"] * feasible["final_eval_accuracy"]}
    keys = pd.concat([
        feasible[["feature_map", "label", "update_rule", "n_keys"]]
        .assign(series=series, view=view, value=value.where(~diverged).astype(float))
        .groupby(["feature_map", "label", "update_rule", "series", "view", "n_keys"])["value"]
        .agg(value="median", seeds="size").reset_index() for view, value in values.items()],
        ignore_index=True)
    colors = palette(families, capacity)
    family = {label: name for name, labels in panels(families, capacity) for label in labels}

    def painted(frame: pd.DataFrame, names: pd.Series) -> pd.DataFrame:
        return frame.assign(family=names, color=names.map(lambda n: to_hex(colors[n])
                                                          if n in colors else None))

    tables = {"capacity": by_view(capacity), "efficiency": efficiency.efficiency_table(capacity),
              "keys": keys}
    tables = {name: painted(frame, frame["label"].map(family)) for name, frame in tables.items()}
    law = scaling.table(families)
    return {**tables, "scaling": painted(law, law["family"])}


# the interactive charts of the dashboard, each drawn from the rows of one of its tables where
# a column holds a value: (key, wandb.plot kind, table, x, y, (column, value), title)
CHARTS = (
    *((f"charts/{v}_vs_keys", "line", "keys", "n_keys", "value", ("view", v),
       f"{v.replace('_', ' ')} against the number of keys (median over seeds)") for v in VIEWS),
    ("charts/observed_vs_predicted", "scatter", "capacity", "predicted_capacity",
     "failure_point", ("view", "loss"), "failure point (loss view) against d_dot"),
    *((f"charts/capacity_efficiency/{v}", "bar", "efficiency", "label", "efficiency",
       ("view", v), f"failure point / d_dot, {v.replace('_', ' ')} view") for v in VIEWS),
    *((f"charts/capacity_scaling/{v}", "scatter", "scaling", "d_dot", "ratio", ("view", v),
       f"failure point / d_dot against d_dot per family, {v.replace('_', ' ')} view")
      for v in VIEWS),
)


def dashboard_payload(tables: dict, figures: list[Path]) -> dict:
    """What ``log_dashboard`` logs: each table (a DataFrame) as ``tables/<name>``, a wandb.Table
    a user filters by its columns (feature_map, view); the CHARTS drawn from their rows as
    wandb.plot charts (a line per ``series`` of the keys table); each figure as
    ``figures/<stem>`` (its PNG). A chart without rows is left out."""
    import wandb

    def table(frame):
        return wandb.Table(dataframe=frame.astype(object).where(frame.notna(), None))

    payload = {f"tables/{name}": table(frame) for name, frame in tables.items()}
    for key, kind, name, x, y, (column, value), title in CHARTS:
        rows = tables.get(name)
        if rows is None or column not in rows:
            continue
        rows = rows[rows[column] == value].dropna(subset=[x, y]).reset_index(drop=True)
        if rows.empty:
            continue
        if kind == "line":
            payload[key] = wandb.plot.line(table(rows), x, y, stroke="series", title=title)
        else:
            payload[key] = getattr(wandb.plot, kind)(table(rows), x, y, title=title)
    payload.update({f"figures/{p.stem}": wandb.Image(str(p)) for p in figures})
    return payload


def log_dashboard(cfg, tables: dict, figures: list[Path]) -> None:
    """Log an analysis to wandb as one ``analysis`` run of the experiment's group: its tables
    (DataFrames by name: ``dashboard_tables``), charts drawn from them and figures (PNG
    paths), as ``dashboard_payload`` lays them out; ``cfg`` is the analysis config. A failure is
    one warning line, nothing more."""
    tracker = tracking.start(
        True, cfg.results_dir, project=cfg.logger.get("project") or tracking.PROJECT,
        entity=cfg.logger.get("entity"), group=cfg.experiment, name=f"{cfg.experiment}-analysis",
        config=OmegaConf.to_container(cfg), job_type="analysis")
    if tracker.run is None:
        return
    try:
        tracker.run.log(dashboard_payload(tables, figures))
        tracker.finish()
    except Exception as err:  # the dashboard is a view: local outputs are already complete
        print(f"warning: wandb logging failed ({type(err).__name__}: {err}); "
              "the local outputs are complete", file=sys.stderr)
        with contextlib.suppress(Exception):
            tracker.finish(exit_code=1)
