"""What every figure shares: colours, markers, legends, error bars, log-log axes, saving.

One colour per configuration label throughout (``config_colors``: a fixed mapping in natural
label order, so "m=64" comes before "m=128"). Figures use matplotlib's object API with the Agg
canvas: no pyplot state, no display needed. ``save`` writes each figure as PNG and SVG.
"""

from __future__ import annotations

import colorsys
import math
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import NullFormatter

from kernelzoo.analysis.labels import natural, natural_key
from kernelzoo.records.files import atomic_write

DISPLAY_FLOOR = 1e-8  # losses are clipped here so that a loss of 0 still shows on a log axis


OUTCOME_MARKERS = {"fails_at": "o", "plateau": "s", "never_fails": "^", "fails_everywhere": "v"}


OUTCOME_WORDS = {"fails_at": "fails at n*",
                 "plateau": "plateau: keys retrieved flat at its level",
                 "never_fails": "never fails: lower bound",
                 "fails_everywhere": "fails everywhere: upper bound"}


PUBLISHED_LABEL = "published (Schlag et al. 2021)"


SVG_SETTINGS = {"svg.fonttype": "none", "svg.hashsalt": "kernelzoo"}  # text as text, stable ids


def config_colors(labels) -> dict[str, tuple]:
    """Fixed colour per configuration label, assigned in natural label order."""
    labels = natural(labels)
    if len(labels) <= 10:
        cmap = matplotlib.colormaps["tab10"]
        return {label: cmap(i) for i, label in enumerate(labels)}
    cmap = matplotlib.colormaps["tab20" if len(labels) <= 20 else "turbo"]
    return {label: cmap(i / max(len(labels) - 1, 1)) for i, label in enumerate(labels)}


FAMILY_PALETTE = "tab10"  # one colour per family, in natural order (tab20 past ten families)
TAB20_ORDER = (*range(0, 20, 2), *range(1, 20, 2))  # its dark colours first: no light twin beside


def family_colors(names) -> dict[str, tuple]:
    """Fixed colour per family name, in natural order: tab10; past ten families tab20, its ten
    dark colours first and then their light twins, so neighbouring families never share a hue."""
    names = natural(names)
    if len(names) <= 10:
        cmap = matplotlib.colormaps[FAMILY_PALETTE]
        return {name: cmap(i) for i, name in enumerate(names)}
    cmap = matplotlib.colormaps["tab20"]
    return {name: cmap(TAB20_ORDER[i % 20]) for i, name in enumerate(names)}


def shades(color, n: int) -> list[tuple]:
    """``n`` shades of ``color``, dark to light (its lightness from 0.3 to 0.7; one: the colour
    itself): a family's sizes in its hue, so DPFP-1, -2 and -3 are told apart."""
    if n <= 1:
        return [matplotlib.colors.to_rgba(color)]
    h, _, s = colorsys.rgb_to_hls(*matplotlib.colors.to_rgb(color))
    return [(*colorsys.hls_to_rgb(h, 0.3 + 0.4 * i / (n - 1), s), 1.0) for i in range(n)]


def log_square(ax, values: pd.Series) -> None:
    """Both axes log scale over the values' range (a factor 1.5 of margin), powers of 2 as
    ticks, and the dotted line y = x."""
    values = values[np.isfinite(values) & (values > 0)]  # an interval's open end is no value
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


def error_bar(ax, x: float, y: float, low, high, kind: str, color, horizontal: bool = False,
              **style) -> None:
    """A marker at (x, y) with the bar [low, high] on y that ``kind``
    (``capacity.interval_words``) names: solid for an interval over seeds (gid "interval"),
    dashed for one seed's bracket (gid "bracket"), none for the other kinds; ``horizontal``:
    the marker at (y, x), the bar on x."""
    solid = kind.endswith("%)")
    bar = (solid or kind.startswith("bracket")) and pd.notna(low) and pd.notna(high)
    low = low if bar and 0 < low < math.inf else y  # an end a bound leaves open: not drawn
    high = high if bar and high < math.inf else y
    err = [[max(y - low, 0)], [max(high - y, 0)]] if bar else None
    drawn = (ax.errorbar(y, x, xerr=err, capsize=3, color=color, **style) if horizontal else
             ax.errorbar(x, y, yerr=err, capsize=3, color=color, **style))
    if bar:
        drawn[2][0].set_linestyle("-" if solid else (0, (3, 2)))
        drawn[2][0].set_gid("interval" if solid else "bracket")
