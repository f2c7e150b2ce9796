"""How configurations and numbers are named: a configuration's label parts (its map's head,
its sizing parameter, its canonical parameters), the natural order of labels, d_dot levels grouped
by size, and a number or a bound as tables write it. A map's name is what its class declares
(``map_label``: ``FeatureMap.label_of``; its feature_map where no installed map has that name),
its parameters as ``canonical_params`` writes them.
"""

from __future__ import annotations

import re

import pandas as pd

from kernelzoo.maps.catalog import map_class


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


def rho_words(rho: float | None) -> str:
    """Spearman's rho as reports print it; where it is undefined, why."""
    return "undefined (one view's ratios are all equal)" if rho is None else f"{rho:.2f}"


def bound(value, outcome, digits: int = 3) -> str:
    """A failure point (or its ratio to d_dot) with its outcome: bounds as inequalities, a
    plateau as "plateau 32", "–" where there is none; ``digits`` significant digits."""
    if outcome is None or pd.isna(outcome) or outcome == "no_data" or value is None \
            or pd.isna(value):
        return "–"
    sign = {"never_fails": ">= ", "fails_everywhere": "<= ", "plateau": "plateau "}.get(outcome, "")
    return sign + cell(value, digits)


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


def dkey(values) -> str:
    """"d_key=64", or the set of d_key values when an experiment has several."""
    keys = sorted({int(v) for v in values})
    return f"d_key={keys[0]}" if len(keys) == 1 else "d_key in {" + ", ".join(map(str, keys)) + "}"


def is_search(runs: pd.DataFrame) -> bool:
    """True for the runs of a failure-point search (``search=bisect``), which are its probes."""
    return "probe_round" in runs and bool(runs["probe_round"].notna().any())
