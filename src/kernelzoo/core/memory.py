"""The associative memory: write L (key, value) pairs into a fast-weight state, read Q queries.

A fast weight programmer (Schlag, Irie & Schmidhuber 2021; reference document §1.2) keeps a
matrix W of shape (d_v, D), W^(0) = 0, and programs it with one instruction per written pair.
Every function here receives already-mapped features phi(k), phi(q) (shape (B, L, D) and
(B, Q, D)) and the values v (B, L, d_v); all L pairs are written in order and the Q queries are
read against the final state, giving y of shape (B, Q, d_v).

Update rules (`update_rule`):

- "sum":   W <- W + v_l phi(k_l)^T                                      (§1.2, §2.1)
- "delta": v_bar = W k_l;  W <- W + beta_l (v_l - v_bar) k_l^T          (task spec, "ours")
           i.e. W <- W (I - beta_l k_l k_l^T) + beta_l v_l k_l^T, with k_l the key after
           normalisation (below).
- "fwm":   the delta step with the raw phi(k_l); after every step from the second on,
           W <- W / max(1, ||W||_F); output y = LayerNorm(W phi(q)) over d_v, no affine
           parameters, eps 1e-5 (task spec). `normalisation` is ignored for this rule.

Normalisations (`normalisation`, for "sum" and "delta"):

- "attention": raw keys; y = W phi(q) / (z . phi(q) + eps), z = sum_l phi(k_l) (Katharopoulos
               et al. 2020; reference §1.3).
- "sum":       keys phi(k) / (sum_i phi(k)_i + key_eps), query phi(q) / (sum_i phi(q)_i + eps),
               y = W phi'(q) (reference §7.2). The authors use key_eps = 0, so an all-zero
               phi(k) gives 0/0 = NaN: that faithful behaviour is the default.
- "none":      raw keys and query, y = W phi(q) (the plain FWP of §1.2).

`read` is the production path (no loop over time steps for "sum" and "delta"; for "fwm" with a
large state, a loop over (B, d_v) vectors instead of (B, d_v, D) states); `read_reference` is the
literal step-by-step recurrence that `read` is tested against.
"""

import math

import torch
import torch.nn.functional as F

from kernelzoo.core import fwm
from kernelzoo.config import NORMALISATIONS, UPDATE_RULES
from kernelzoo.maps.base import sum_normalise
FWM_LAYER_NORM_EPS = 1e-5  # task spec: LayerNorm of the fwm output, no affine parameters
# fwm: the chunked form (`fwm.state`) pays from about this many state entries B * d_v * D; below
# it the literal loop is as fast (`make bench`, rows fwm, compares the two).
FWM_CHUNKED_FROM = 8192


def _validate(update_rule, normalisation, beta):
    if update_rule not in UPDATE_RULES:
        raise ValueError(f"unknown update_rule {update_rule!r}; expected one of {UPDATE_RULES}")
    if normalisation not in NORMALISATIONS:
        raise ValueError(f"unknown normalisation {normalisation!r}; expected one of {NORMALISATIONS}")
    if update_rule != "sum" and beta is None:
        raise ValueError(f"update_rule {update_rule!r} needs beta of shape (B, L)")


def divides_by_feature_sum(update_rule: str, normalisation: str) -> bool:
    """Whether keys and queries are divided by the sum of their features (§7.2): the sum
    normalisation, which fwm ignores."""
    return normalisation == "sum" and update_rule != "fwm"


def has_denominator(update_rule: str, normalisation: str) -> bool:
    """Whether the read-out divides by a sum of features that can come near zero: the attention
    denominator z . phi(q) + eps, or the sum normalisation's feature sums; not the fwm rule (its
    LayerNorm), not normalisation "none"."""
    return update_rule != "fwm" and normalisation in ("attention", "sum")


def _normalise(phi_k, phi_q, update_rule, normalisation, eps, key_eps):
    """Keys and queries as the update rule and the read see them (sum normalisation, §7.2)."""
    if divides_by_feature_sum(update_rule, normalisation):
        phi_k, phi_q = sum_normalise(phi_k, key_eps), sum_normalise(phi_q, eps)
    return phi_k, phi_q


def _finish(y, phi_k, q, update_rule, normalisation, eps, value_mask=None):
    """Output head: attention denominator z . phi(q) + eps, or the fwm LayerNorm (over the
    real value slots only when ``value_mask`` (B, d_v) marks them; the others give 0)."""
    if update_rule == "fwm":
        if value_mask is None:
            return F.layer_norm(y, y.shape[-1:], eps=FWM_LAYER_NORM_EPS)
        m = value_mask.unsqueeze(1).to(y.dtype)
        n = m.sum(-1, keepdim=True)
        mean = (y * m).sum(-1, keepdim=True) / n
        var = ((y - mean).square() * m).sum(-1, keepdim=True) / n
        return (y - mean) * torch.rsqrt(var + FWM_LAYER_NORM_EPS) * m
    if normalisation == "attention":
        z = phi_k.sum(1)  # (B, D), z = sum_l phi(k_l)
        return y / ((q @ z.unsqueeze(-1)) + eps)
    return y


def _recurrent_state(k, v, beta, update_rule):
    """Final fast weights W (B, d_v, D), one literal update per written pair, W^(0) = 0 (§1.2)."""
    B, L, D = k.shape
    W = k.new_zeros(B, v.shape[-1], D)
    for l in range(L):
        k_l, v_l = k[:, l], v[:, l]
        if update_rule == "sum":
            W = W + v_l[:, :, None] * k_l[:, None, :]
        else:
            v_bar = (W @ k_l[:, :, None]).squeeze(-1)
            W = W + beta[:, l, None, None] * (v_l - v_bar)[:, :, None] * k_l[:, None, :]
            if update_rule == "fwm" and l > 0:
                W = W / torch.linalg.matrix_norm(W).clamp(min=1.0)[:, None, None]
    return W


def _delta_state_chunked(k, v, beta, chunk_size):
    """Final delta-rule fast weights W (B, d_v, D) in the chunkwise parallel (WY / UT) form.

    Yang et al. 2024, "Parallelizing Linear Transformers with the Delta Rule over Sequence
    Length". Within a chunk of C keys starting from W_prev, W_t = W_prev + sum_{i<=t} u_i k_i^T
    with u_i = beta_i (v_i - W_prev k_i - sum_{j<i} (k_j . k_i) u_j), i.e.
    (I + A) U = diag(beta) (V - K W_prev^T),  A = tril(diag(beta) K K^T, -1).
    With T = (I + A)^{-1} diag(beta) (UT transform, a unit-lower-triangular solve):
    U = T V - (T K) W_prev^T and W_new = W_prev + U^T K. T V and T K do not depend on W_prev,
    so they are solved for all chunks at once; only the two matmuls above loop over chunks.
    The sequence is zero-padded to a whole number of chunks: a pair with k = 0 and beta = 0
    leaves W unchanged.
    """
    B, L, D = k.shape
    d_v = v.shape[-1]
    C = min(chunk_size, L)
    n = math.ceil(L / C)
    pad = n * C - L
    if pad:
        k, v, beta = F.pad(k, (0, 0, 0, pad)), F.pad(v, (0, 0, 0, pad)), F.pad(beta, (0, pad))
    k = k.reshape(B, n, C, D)
    b = beta.reshape(B, n, C, 1)
    A = torch.tril(b * (k @ k.transpose(-1, -2)), diagonal=-1)
    eye = torch.eye(C, dtype=k.dtype, device=k.device)
    rhs = b * torch.cat([v.reshape(B, n, C, d_v), k], dim=-1)
    tv, tk = torch.linalg.solve_triangular(eye + A, rhs, upper=False, unitriangular=True).split(
        [d_v, D], dim=-1
    )
    W = k.new_zeros(B, d_v, D)
    for c in range(n):
        u = tv[:, c] - tk[:, c] @ W.transpose(-1, -2)  # (B, C, d_v)
        W = W + u.transpose(-1, -2) @ k[:, c]
    return W


class _Gram(torch.autograd.Function):
    """K K^T for K (..., L, D), with the backward (G + G^T) K as one matmul instead of two."""

    @staticmethod
    def forward(ctx, k):
        ctx.save_for_backward(k)
        return k @ k.transpose(-1, -2)

    @staticmethod
    def backward(ctx, grad):
        (k,) = ctx.saved_tensors
        return (grad + grad.transpose(-1, -2)) @ k


def _delta_read_direct(k, v, q, beta):
    """The delta rule's read q W^T without the state: one triangular solve over the sequence.

    With W^(0) = 0, W = sum_t u_t k_t^T where (I + A) U = diag(beta) V, A = tril(diag(beta) K K^T,
    -1) (the UT form of `_delta_state_chunked` over the whole sequence). So
    q W^T = (K q)^T (I + A)^{-1} diag(beta) V: solve the upper-triangular (I + A)^T X = K Q^T,
    a Q-column right-hand side, then y = (diag(beta) X)^T V. Costs L^2 (D + Q) + L Q d_v, not
    the state's L D d_v; better when L is not much larger than d_v or Q is small.
    """
    upper = torch.triu(_Gram.apply(k) * beta.unsqueeze(-2), diagonal=1)  # (I + A)^T - I
    x = torch.linalg.solve_triangular(upper, k @ q.transpose(-1, -2), upper=True,
                                      unitriangular=True)  # (B, L, Q)
    return (beta.unsqueeze(-1) * x).transpose(-1, -2) @ v


def delta_direct_is_cheaper(L, Q, D, d_v, chunk_size):
    """Multiply-adds of _delta_read_direct against the chunked state and its read."""
    C = min(chunk_size, L)
    return L * L * (D + Q) + L * Q * d_v <= L * (C * (D + d_v) + 2 * D * d_v) + Q * D * d_v


def read(phi_k, v, phi_q, *, update_rule="sum", normalisation="attention", beta=None,
         eps=1e-6, key_eps=0.0, chunk_size=64, mask=None, value_mask=None):
    """Write all L pairs, then read the Q queries: y (B, Q, d_v). Production path.

    phi_k (B, L, D), v (B, L, d_v), phi_q (B, Q, D); beta (B, L) in (0, 1), required for
    "delta" and "fwm", ignored for "sum". key_eps only matters for normalisation "sum".
    Works in the input dtype and device and is differentiable in every input. ``mask`` (B, L)
    marks real pairs and ``value_mask`` (B, d_v) real value slots (a pack's padding,
    ``pack.py``): a padded pair writes nothing, and padded slots read 0.

    - "sum": y = phi(Q) W^T with W = V^T phi(K) (§2.1), contracted in the cheaper order:
      scores phi(K) phi(Q)^T then scores^T V costs L Q (D + d_v); materialising W costs
      D d_v (L + Q), which wins when Q is large.
    - "delta": without the state, one triangular solve over the whole sequence
      (`_delta_read_direct`) when that is cheaper (short sequences, few queries: training and
      evaluation in this task); else the chunkwise parallel form (`_delta_state_chunked`), a
      loop over L / chunk_size chunks.
    - "fwm": the per-step Frobenius renormalisation is nonlinear, so the loop over time steps
      stays; for a large state it runs over vectors (`fwm.state`, which forms the
      state once per chunk), for a small one it is the literal loop. This rule ignores
      `normalisation`, `eps` and `key_eps`.
    """
    _validate(update_rule, normalisation, beta)
    k, q = _normalise(phi_k, phi_q, update_rule, normalisation, eps, key_eps)
    if mask is not None:  # after the normalisation: a padded key is a real one, never 0 / 0
        m = mask.unsqueeze(-1).to(k.dtype)
        phi_k, k = phi_k * m, k * m
        beta = None if beta is None else beta * mask
    B, L, D = k.shape
    Q, d_v = q.shape[1], v.shape[-1]
    if update_rule == "sum" and L * Q * (D + d_v) <= D * d_v * (L + Q):
        y = (q @ k.transpose(1, 2)) @ v
    elif update_rule == "delta" and delta_direct_is_cheaper(L, Q, D, d_v, chunk_size):
        y = _delta_read_direct(k, v, q, beta)
    else:
        if update_rule == "sum":
            W = v.transpose(1, 2) @ k
        elif update_rule == "delta":
            W = _delta_state_chunked(k, v, beta, chunk_size)
        elif B * D * d_v >= FWM_CHUNKED_FROM:
            W = fwm.state(k, v, beta, chunk_size)
        else:
            W = _recurrent_state(k, v, beta, update_rule)
        y = q @ W.transpose(1, 2)
    return _finish(y, phi_k, q, update_rule, normalisation, eps, value_mask)


def read_reference(phi_k, v, phi_q, *, update_rule="sum", normalisation="attention", beta=None,
                   eps=1e-6, key_eps=0.0):
    """Same contract as `read`, computed by the literal recurrence: a Python loop over the L
    writes (§1.2 and the task-spec delta / fwm steps), then y = W^(L) q for every query."""
    _validate(update_rule, normalisation, beta)
    k, q = _normalise(phi_k, phi_q, update_rule, normalisation, eps, key_eps)
    W = _recurrent_state(k, v, beta, update_rule)
    return _finish(q @ W.transpose(1, 2), phi_k, q, update_rule, normalisation, eps)


def softmax_read(k, v, q, scale=None):
    """Exact softmax attention at the end of the sequence: y_q = sum_l softmax_l(k_l . q * scale) v_l.

    k (B, L, d_key), v (B, L, d_v), q (B, Q, d_key) -> y (B, Q, d_v); scale defaults to
    1 / sqrt(d_key) (the task spec's softmax baseline).
    """
    if scale is None:
        scale = k.shape[-1] ** -0.5
    return torch.softmax((q @ k.transpose(1, 2)) * scale, dim=-1) @ v
