"""The YAML and JSON a store holds (config.yaml, summary.json, sweep.json, search.json),
parsed within limits, so that a hostile or damaged file is named as damaged instead of hanging
the reader or filling its memory.

A value may hold at most ``MAX_VALUES`` values (lists, mappings and scalars), counted with YAML
aliases expanded, since whoever walks the value later (a serialiser, a flattening of the
config) meets every alias again: a "billion laughs" file of a few hundred bytes composes in
microseconds and expands to 10^9 values. It may nest at most ``MAX_DEPTH`` levels deep, its
integers are within 64 bits and its numbers finite: NaN and Infinity are no result the suite
writes (summaries write a non-finite number as ``null`` or ``"inf"``). What is beyond a limit
is a ``LimitError`` (a ValueError) whose text says which limit, for the caller to report with
the file's name.
"""

from __future__ import annotations

import json
import math

import yaml

MAX_VALUES = 1 << 20   # a config holds ~100 values, the largest search.json ~20 000
MAX_DEPTH = 64         # the deepest record nests ~6 levels
MAX_INT = 2 ** 63 - 1


class LimitError(ValueError):
    """A value beyond one of the limits; the text names the limit."""


def load_json(text: str):
    """The JSON value of ``text``; ValueError when it is not JSON, LimitError when it is
    beyond a limit (NaN, Infinity and numbers beyond 64 bits included)."""
    try:
        value = json.loads(text, parse_constant=_constant, parse_int=_int, parse_float=_float)
    except RecursionError:
        raise LimitError(f"nested deeper than {MAX_DEPTH} levels") from None
    _measure(value)
    return value


def load_yaml(text: str):
    """The YAML value of ``text`` (safe tags only); yaml.YAMLError when it is not YAML,
    LimitError when it is beyond a limit. The aliases are counted on the composed document,
    before anything is built from it."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _count(node)
        value = loader.construct_document(node)
    except RecursionError:
        raise LimitError(f"nested deeper than {MAX_DEPTH} levels") from None
    finally:
        loader.dispose()
    _measure(value)
    return value


def _constant(name: str):
    raise LimitError(f"{name}, not a finite number")


def _int(text: str) -> int:
    if len(text.lstrip("-")) > 19 or abs(int(text)) > MAX_INT:
        raise LimitError(f"the integer {text[:24]}{'...' if len(text) > 24 else ''} is beyond "
                         "64 bits")
    return int(text)


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise LimitError(f"{text[:24]} is beyond the largest finite number")
    return value


def _count(node: yaml.Node) -> None:
    """LimitError when the composed ``node`` expands to more than MAX_VALUES values, nests
    deeper than MAX_DEPTH or refers to itself (an alias inside its own anchor)."""
    sizes: dict[int, int] = {}

    def size(n: yaml.Node, depth: int, open_: set[int]) -> int:
        if depth > MAX_DEPTH:
            raise LimitError(f"nested deeper than {MAX_DEPTH} levels")
        if id(n) in sizes:
            return sizes[id(n)]
        if id(n) in open_:
            raise LimitError("an alias that contains itself")
        total = 1
        if isinstance(n, (yaml.SequenceNode, yaml.MappingNode)):
            open_.add(id(n))
            children = n.value if isinstance(n, yaml.SequenceNode) else \
                [c for pair in n.value for c in pair]
            for child in children:
                total += size(child, depth + 1, open_)
                if total > MAX_VALUES:
                    raise LimitError(f"more than {MAX_VALUES} values once its aliases are "
                                     "expanded")
            open_.discard(id(n))
        sizes[id(n)] = total
        return total

    size(node, 0, set())


def _measure(value) -> None:
    """LimitError for a built value with a non-finite or out-of-range number (YAML's .nan,
    .inf and big integers are built before they can be seen), or nesting deeper than
    MAX_DEPTH. The walk is bounded: the values were counted before they were built."""
    todo = [(value, 0)]
    while todo:
        v, depth = todo.pop()
        if depth > MAX_DEPTH:
            raise LimitError(f"nested deeper than {MAX_DEPTH} levels")
        if isinstance(v, float) and not math.isfinite(v):
            raise LimitError(f"{v}, not a finite number")
        if isinstance(v, int) and not isinstance(v, bool) and abs(v) > MAX_INT:
            raise LimitError(f"the integer {str(v)[:24]}... is beyond 64 bits")
        if isinstance(v, dict):
            todo += [(x, depth + 1) for pair in v.items() for x in pair]
        elif isinstance(v, list):
            todo += [(x, depth + 1) for x in v]
