"""The associative memory: write L (key, value) pairs into a fast-weight state, read Q queries.

A fast weight programmer (Schlag, Irie & Schmidhuber 2021; reference document §1.2) keeps a
matrix W of shape (d_v, D), W^(0) = 0, and programs it with one instruction per written pair.
Every function here receives already-mapped features phi(k), phi(q) (shape (B, L, D) and
(B, Q, D)) and the values v (B, L, d_v); all L pairs are written in order and the Q queries are
read against the final state, giving y of shape (B, Q, d_v).

The instruction is the update rule (`update_rule`), one module of ``kernelzoo.core.rules`` each
(sum, delta, fwm, gated_delta: the equations are in their docstrings). This module applies what
all rules share, the normalisation of keys and queries (`normalisation`, for the rules it
applies to):

- "attention": raw keys; y = W phi(q) / (z . phi(q) + eps), z = sum_l phi(k_l) (Katharopoulos
               et al. 2020; reference §1.3).
- "sum":       keys phi(k) / (sum_i phi(k)_i + key_eps), query phi(q) / (sum_i phi(q)_i + eps),
               y = W phi'(q) (reference §7.2). The authors use key_eps = 0, so an all-zero
               phi(k) gives 0/0 = NaN: that faithful behaviour is the default.
- "none":      raw keys and query, y = W phi(q) (the plain FWP of §1.2).

`read` is the production path (each rule's ``read``); `read_reference` is the literal
step-by-step recurrence (each rule's ``step``) that `read` is tested against.
"""

import torch

from kernelzoo.config import NORMALISATIONS
from kernelzoo.core import rules
from kernelzoo.core.rules.base import recurrent_state
from kernelzoo.maps.base import sum_normalise


def _rule(update_rule, normalisation, gates):
    rule = rules.get(update_rule)
    if normalisation not in NORMALISATIONS:
        raise ValueError(f"unknown normalisation {normalisation!r}; expected one of {NORMALISATIONS}")
    missing = [g for g in rule.gates if gates[g] is None]
    if missing:
        raise ValueError(f"update_rule {update_rule!r} needs {' and '.join(missing)} of shape (B, L)")
    return rule


def _normalise(phi_k, phi_q, rule, normalisation, eps, key_eps):
    """Keys and queries as the update rule and the read see them (sum normalisation, §7.2)."""
    if rule.divides_by_feature_sum(normalisation):
        phi_k, phi_q = sum_normalise(phi_k, key_eps), sum_normalise(phi_q, eps)
    return phi_k, phi_q


def read(phi_k, v, phi_q, *, update_rule="sum", normalisation="attention", beta=None,
         alpha=None, eps=1e-6, key_eps=0.0, chunk_size=64, mask=None, value_mask=None):
    """Write all L pairs, then read the Q queries: y (B, Q, d_v). Production path.

    phi_k (B, L, D), v (B, L, d_v), phi_q (B, Q, D); the gates beta (B, L) and alpha (B, L) in
    (0, 1) where the rule has them (``rule.gates``), else ignored. key_eps only matters for
    normalisation "sum". Works in the input dtype and device and is differentiable in every
    input. ``mask`` (B, L) marks real pairs and ``value_mask`` (B, d_v) real value slots (a
    pack's padding, ``pack.py``): a padded pair writes nothing (k, beta 0, alpha 1), and padded
    slots read 0.
    """
    rule = _rule(update_rule, normalisation, {"beta": beta, "alpha": alpha})
    k, q = _normalise(phi_k, phi_q, rule, normalisation, eps, key_eps)
    if mask is not None:  # after the normalisation: a padded key is a real one, never 0 / 0
        m = mask.unsqueeze(-1).to(k.dtype)
        phi_k, k = phi_k * m, k * m
        beta = None if beta is None else beta * mask
        alpha = None if alpha is None else torch.where(mask, alpha, torch.ones_like(alpha))
    y = rule.read(k, v, q, beta, alpha, chunk_size)
    return rule.finish(y, phi_k, q, normalisation, eps, value_mask)


def read_reference(phi_k, v, phi_q, *, update_rule="sum", normalisation="attention", beta=None,
                   alpha=None, eps=1e-6, key_eps=0.0):
    """Same contract as `read`, computed by the literal recurrence: a Python loop over the L
    writes (each rule's ``step``), then y = W^(L) q for every query."""
    rule = _rule(update_rule, normalisation, {"beta": beta, "alpha": alpha})
    k, q = _normalise(phi_k, phi_q, rule, normalisation, eps, key_eps)
    W = recurrent_state(rule, k, v, beta, alpha)
    return rule.finish(q @ W.transpose(1, 2), phi_k, q, normalisation, eps)


def softmax_read(k, v, q, scale=None):
    """Exact softmax attention at the end of the sequence: y_q = sum_l softmax_l(k_l . q * scale) v_l.

    k (B, L, d_key), v (B, L, d_v), q (B, Q, d_key) -> y (B, Q, d_v); scale defaults to
    1 / sqrt(d_key) (the task spec's softmax baseline).
    """
    if scale is None:
        scale = k.shape[-1] ** -0.5
    return torch.softmax((q @ k.transpose(1, 2)) * scale, dim=-1) @ v
