"""The rank bound: the lowest eval loss a memory of rank r can reach on the capacity task, and
from it the most keys whose loss can still be at or below tau. Pure: it reads no file.

Derivation (Setting 1, every key once per sequence)
---------------------------------------------------
In one evaluation sequence the Q = min(S, eval_max_queries) queried keys hold distinct values,
so their targets are Q orthonormal rows p_i (one-hots). The sum and delta rules read
y_i = c_i W phi(q_i), c_i a scalar (the attention normalisation; 1 for delta), so the Q outputs
lie in a subspace U of dimension r <= d_dot; fwm's LayerNorm subtracts each output's mean,
which adds one direction: r = d_dot + 1. Here d_dot is the number of features a query reads
(``FeatureMap.query_rank_of``): a cosFormer query, at the end of its sequence, reads d_key of
its 2 d_key features, so its read-out has rank d_key whatever the state's width. For each
query ||p_i - y_i||^2 >= 1 - ||P_U p_i||^2 =: f_i, with f_i in [0, 1] and, the p_i being
orthonormal, sum_i ||P_U p_i||^2 <= trace(P_U) = r, so sum_i f_i >= Q - r (Eckart-Young for a
permutation matrix). A query's loss is 0.5 ||p_i - y_i||^2 >= 0.5 f_i.

The authors' batch-mean weighting: a sequence's queries fall into C = ceil(Q / b) chunks of
b = eval_query_batch queries in key order (the last one shorter), and the eval loss is the mean
over (sequence, chunk) of the chunk means, every sequence alike; a query in a chunk of c queries
weighs 1 / (C c). The weighted sum is smallest when f_i = 1 on the Q - r lightest queries (those
of the full chunks) and 0 elsewhere:

    floor(S, r) = 0.5 / C * (sum of the Q - r smallest weights 1/c_i),  0 when Q <= r;

with the plain mean (eval_query_batch null), 0.5 (Q - r) / Q. ELU+1 at d_key 16 (r = 16) at
S = 18: 0.5 * 2 / 18 = 0.0556, the loss its runs end at. ``largest_keys`` is the largest S
whose floor is <= tau: no loss-view failure point can lie above it (a run there cannot pass).
At d_dot 64 with chunks of 32 it is 65 (one wrong key in a full chunk costs 0.5 / (3 * 32));
once r >= eval_max_queries no S is bounded (only 200 keys are ever queried).

The bound holds for Setting 1 (the capacity task) with the sum, delta and fwm rules and a map of
finite d_dot; with replacement (Setting 2) two queried keys can share a value and the targets
are not orthonormal, and softmax attention has no feature dimension: no bound there (None).
"""

from __future__ import annotations

import math

RANKED_RULES = {"sum": 0, "delta": 0, "fwm": 1}  # rule -> extra rank of its read-out
DERIVATION = __doc__.partition("---\n")[2].strip()


def rank(d_dot, update_rule: str) -> int | None:
    """The rank r of the read-out of a map of ``d_dot`` features under ``update_rule``, or None
    (unbounded d_dot, or a rule the bound does not cover)."""
    if d_dot is None or (isinstance(d_dot, float) and not math.isfinite(d_dot)) \
            or update_rule not in RANKED_RULES:
        return None
    try:
        return int(d_dot) + RANKED_RULES[update_rule]
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
