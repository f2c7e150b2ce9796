"""What every figure of the analysis shares: names, label order, colours, markers, legends, log-log
axes, saving.

One colour per configuration label throughout (``config_colors``: a fixed mapping in natural
label order, so "m=64" comes before "m=128"). Figures use matplotlib's object API with the Agg
canvas: no pyplot state, no display needed. ``save`` writes each figure as PNG and SVG. A map's
name in labels is what its class declares (``map_label``: ``FeatureMap.label_of``; its
feature_map where no installed map has that name), its parameters as ``canonical_params`` writes
them.
"""

from __future__ import annotations

import re
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import NullFormatter

from kernelzoo.maps.catalog import map_class
from kernelzoo.records.files import atomic_write

DISPLAY_FLOOR = 1e-8  # losses are clipped here so that a loss of 0 still shows on a log axis
OUTCOME_MARKERS = {"fails_at": "o", "never_fails": "^", "fails_everywhere": "v"}
OUTCOME_WORDS = {"fails_at": "fails at n*",
                 "never_fails": "never fails: lower bound",
                 "fails_everywhere": "fails everywhere: upper bound"}
PUBLISHED_LABEL = "published (Schlag et al. 2021)"
SVG_SETTINGS = {"svg.fonttype": "none", "svg.hashsalt": "kernelzoo"}  # text as text, stable ids


def map_label(feature_map: str, params: dict) -> tuple[str, tuple[str, ...]]:
    """(The head of the label of a configuration of ``feature_map`` with ``params``, the
    parameters it shows): ``FeatureMap.label_of`` of the map's class, ``(feature_map, ())`` for
    a map no installed package defines."""
    cls = map_class(feature_map)
    return cls.label_of(params) if cls is not None else (feature_map, ())


def sizing_param(feature_map: str) -> str | None:
    """The parameter the map resolves from d_dot (``FeatureMap.sizing_param``: DPFP's nu,
    FAVOR+'s m), shown in every label and left out of a scaling family; None where d_dot sets
    d_key (the elementwise maps) or no installed map has that name."""
    cls = map_class(feature_map)
    return cls.sizing_param if cls is not None else None


def query_rank(feature_map: str, d_key, d_dot, params: dict):
    """The features a query of this configuration reads (``FeatureMap.query_rank_of``): the
    read-out's rank, below d_dot for cosFormer; d_dot for a map no installed package defines."""
    cls = map_class(feature_map)
    return d_dot if cls is None or d_dot is None else cls.query_rank_of(d_key, d_dot, params)


def format_value(value) -> str:
    """A parameter's value as labels and ``canonical_params`` show it: true, 1, 0.5, name."""
    if isinstance(value, bool):
        return str(value).lower()
    return f"{value:g}" if isinstance(value, float) else str(value)


def cell(value, digits: int = 3) -> str:
    """A number as report tables show it (3 significant digits), "–" where there is none."""
    if value is None or pd.isna(value):
        return "–"
    return f"{value:.{digits}g}" if isinstance(value, float) else str(value)


def bound(value, outcome) -> str:
    """A failure point with its outcome: bounds as inequalities, "–" where there is none."""
    if outcome is None or pd.isna(outcome) or outcome == "no_data":
        return "–"
    sign = {"never_fails": ">= ", "fails_everywhere": "<= "}.get(outcome, "")
    return sign + cell(value)


def canonical_params(params: dict) -> str:
    """``{"nu": 2, "a": True}`` -> ``"a=true,nu=2"``; ``""`` for no parameters."""
    return ",".join(f"{k}={format_value(v)}" for k, v in sorted(params.items()))


SIZE_SPREAD = 1.1  # d_dot levels within this factor of a group's smallest are one size


def size_groups(levels) -> dict[int, list[int]]:
    """Sorted d_dot levels grouped by size: the smallest of each group -> its levels, a level
    joining the group whose smallest is within ``SIZE_SPREAD`` of it (the quadratic maps' 65
    and 66 are the others' 64)."""
    groups: dict[int, list[int]] = {}
    for d in sorted(int(d) for d in levels):
        head = next((h for h in groups if d <= SIZE_SPREAD * h), None)
        groups.setdefault(d if head is None else head, []).append(d)
    return groups


def natural_key(label: str) -> tuple:
    """Sort key that orders "FAVOR+ m=64" before "FAVOR+ m=128" and "lr=0.0003" before
    "lr=0.001"; labels whose numbers are equal ("lr=0.10", "lr=0.1") fall back to the text,
    so the order never depends on the order the labels came in."""
    parts = re.split(r"(\d+(?:\.\d+)?)", label)
    return [float(p) if i % 2 else p for i, p in enumerate(parts)], label


def natural(labels) -> list[str]:
    """The distinct labels in natural order."""
    return sorted(set(labels), key=natural_key)


def config_colors(labels) -> dict[str, tuple]:
    """Fixed colour per configuration label, assigned in natural label order."""
    labels = natural(labels)
    if len(labels) <= 10:
        cmap = matplotlib.colormaps["tab10"]
        return {label: cmap(i) for i, label in enumerate(labels)}
    cmap = matplotlib.colormaps["tab20" if len(labels) <= 20 else "turbo"]
    return {label: cmap(i / max(len(labels) - 1, 1)) for i, label in enumerate(labels)}


def dkey(values) -> str:
    """"d_key=64", or the set of d_key values when an experiment has several."""
    keys = sorted({int(v) for v in values})
    return f"d_key={keys[0]}" if len(keys) == 1 else "d_key in {" + ", ".join(map(str, keys)) + "}"


def is_search(runs: pd.DataFrame) -> bool:
    """True for the runs of a failure-point search (``search=bisect``), which are its probes."""
    return "probe_round" in runs and bool(runs["probe_round"].notna().any())


def log_square(ax, values: pd.Series) -> None:
    """Both axes log scale over the values' range (a factor 1.5 of margin), powers of 2 as
    ticks, and the dotted line y = x."""
    low, high = values.min() / 1.5, values.max() * 1.5
    ax.plot([low, high], [low, high], "k:", lw=1)
    ticks = 2.0 ** np.arange(np.floor(np.log2(low)), np.ceil(np.log2(high)) + 1)
    ax.set_xscale("log")
    ax.set_yscale("log")
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_ticks(ticks, [f"{t:g}" for t in ticks])
        axis.set_minor_formatter(NullFormatter())
    ax.set_xlim(low, high)
    ax.set_ylim(low, high)


def save(fig: Figure, path: Path) -> Path:
    """Write ``path`` (PNG) and the same figure as SVG beside it, each atomically (the old
    figure or the new, never a part); returns the PNG's path."""
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=110, bbox_inches="tight"))
    with matplotlib.rc_context(SVG_SETTINGS):
        atomic_write(path.with_suffix(".svg"), lambda f: fig.savefig(
            f, format="svg", bbox_inches="tight", metadata={"Date": None}))
    return path


def legend(ax, handles=None) -> None:
    """The legend to the right of the axes; ``handles`` in the order given (else the axes')."""
    if handles is None:
        handles, _ = ax.get_legend_handles_labels()
    ax.legend(handles=handles, fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5),
              frameon=False)


def bar_handles(kinds) -> list[Line2D]:
    """Legend entries naming every kind of error bar drawn, ``kinds`` as
    ``capacity.interval_words`` writes them: solid, the order-statistic intervals over seeds
    with their levels; dashed, one seed's bracket; a note where one seed has no interval."""
    kinds = set(kinds)
    spans = sorted((k for k in kinds if k.endswith("%)")), key=natural_key)
    handles = []
    if spans:
        handles.append(Line2D([], [], color="grey", lw=1.2,
                              label="solid bar: " + ";\n    ".join(spans)))
    if any(k.startswith("bracket") for k in kinds):
        handles.append(Line2D([], [], color="grey", lw=1.2, ls="--",
                              label="dashed bar: one seed's bracket [last pass, first fail]"))
    if "one seed: no interval" in kinds:
        handles.append(Line2D([], [], ls="none", label="no bar: one seed, no interval"))
    return handles


def error_bar(ax, x: float, y: float, low, high, kind: str, color, **style) -> None:
    """A marker at (x, y) with the bar [low, high] that ``kind`` (``capacity.interval_words``)
    names: solid for an interval over seeds (gid "interval"), dashed for one seed's bracket
    (gid "bracket"), none for the other kinds."""
    solid = kind.endswith("%)")
    bar = (solid or kind.startswith("bracket")) and pd.notna(low) and pd.notna(high)
    drawn = ax.errorbar(x, y, yerr=[[max(y - low, 0)], [max(high - y, 0)]] if bar else None,
                        capsize=3, color=color, **style)
    if bar:
        drawn[2][0].set_linestyle("-" if solid else (0, (3, 2)))
        drawn[2][0].set_gid("interval" if solid else "bracket")


def legend_labels(ax) -> list[str]:
    """The texts of the axes' legend, top to bottom ([] without a legend)."""
    found = ax.get_legend()
    return [] if found is None else [text.get_text() for text in found.get_texts()]
