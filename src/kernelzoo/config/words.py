"""How a count reads in the lines the suite prints and the reports it writes.

Kept apart from ``style`` (which loads matplotlib and pandas) because the sweeper plugin, which
Hydra imports on every command, prints counts too.
"""

from __future__ import annotations


def plural(n: int, noun: str) -> str:
    """"1 point", "2 points": a count and its noun, plural unless the count is 1."""
    return f"{n} {noun}" + ("" if n == 1 else "s")
