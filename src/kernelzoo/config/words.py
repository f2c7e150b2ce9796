"""How a count reads, and how a name from a store is shown, in the lines the suite prints and
the reports it writes.

Kept apart from ``style`` (which loads matplotlib and pandas) because the sweeper plugin, which
Hydra imports on every command, prints counts too.
"""

from __future__ import annotations

import re

_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f|<>`]")
_MARKUP = {"|": "\\|", "<": "&lt;", ">": "&gt;", "`": "\\`"}


def plural(n: int, noun: str) -> str:
    """"1 point", "2 points": a count and its noun, plural unless the count is 1."""
    return f"{n} {noun}" + ("" if n == 1 else "s")


def escaped(text: str) -> str:
    """``text`` (a label or name read from a store) safe on a terminal and in markdown: control
    characters (a terminal's escape sequences, line breaks) written as ``\\xNN``, and ``|``,
    ``<``, ``>`` and backticks escaped, so that no table, HTML or screen is broken by it. A name
    the suite makes itself holds none of them and is unchanged."""
    return _UNSAFE.sub(lambda m: _MARKUP.get(m.group()) or f"\\x{ord(m.group()):02x}", text)
