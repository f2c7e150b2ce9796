"""The rank bound: the lowest eval loss a memory of rank r can reach on the capacity task, and
from it the most keys whose loss can still be at or below tau. Pure: it reads no file.

Its rule is stated once, in docs/analysis.md ("The rank bound").
"""

from __future__ import annotations

import math

from kernelzoo.core import rules


def rank(d_dot, update_rule: str) -> int | None:
    """The rank r of the read-out of a map of ``d_dot`` features under ``update_rule``, or None
    (unbounded d_dot, or a rule the bound does not cover)."""
    if d_dot is None or (isinstance(d_dot, float) and not math.isfinite(d_dot)) \
            or update_rule not in rules.RULES or rules.RULES[update_rule].extra_rank is None:
        return None
    try:
        return int(d_dot) + rules.RULES[update_rule].extra_rank
    except (TypeError, ValueError):  # pandas' NA
        return None


def loss_floor(n_keys: int, r: int, max_queries: int = 200, query_batch: int | None = 32) -> float:
    """The lowest eval loss of a rank-``r`` read-out at ``n_keys`` keys (module docstring)."""
    q = min(int(n_keys), int(max_queries))
    wrong = q - r
    if wrong <= 0:
        return 0.0
    if not query_batch:
        return 0.5 * wrong / q
    full, rest = divmod(q, int(query_batch))
    chunks = full + (rest > 0)
    weights = [1 / query_batch] * (full * query_batch) + [1 / rest] * rest if rest else \
        [1 / query_batch] * q
    return 0.5 / chunks * sum(sorted(weights)[:wrong])


def largest_keys(r: int, threshold: float, max_queries: int = 200,
                 query_batch: int | None = 32) -> int | None:
    """The largest n_keys whose ``loss_floor`` is <= ``threshold``; None when every n_keys is
    (r >= the queries ever asked, or the floor at ``max_queries`` queries stays below)."""
    if loss_floor(max_queries, r, max_queries, query_batch) <= threshold:
        return None
    return max(n for n in range(r, int(max_queries) + 1)
               if loss_floor(n, r, max_queries, query_batch) <= threshold)


def floor_of(n_keys: int, d_dot, update_rule: str, max_queries: int = 200,
             query_batch: int | None = 32) -> float:
    """``loss_floor`` of one run of the capacity task; NaN where no rank applies."""
    r = rank(d_dot, update_rule)
    return math.nan if r is None else loss_floor(n_keys, r, max_queries, query_batch)


def bound_of(d_dot, update_rule: str, replacement: bool, threshold: float,
             max_queries: int = 200, query_batch: int | None = 32) -> int | None:
    """The loss view's largest n_keys for one configuration, or None where no bound holds."""
    r = None if replacement else rank(d_dot, update_rule)
    return None if r is None else largest_keys(r, threshold, max_queries, query_batch)
