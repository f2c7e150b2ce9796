"""The delta rule (task spec, "ours"): v_bar = W k_l; W <- W + beta_l (v_l - v_bar) k_l^T, i.e.
W <- W (I - beta_l k_l k_l^T) + beta_l v_l k_l^T, with k_l the key after normalisation.

No loop over time steps in ``read``: one triangular solve over the whole sequence when that is
cheaper (``read_direct``: short sequences, few queries — training and evaluation in this task),
else the chunkwise parallel form (``state_chunked``), a loop over L / chunk_size chunks.
"""

import math

import torch
import torch.nn.functional as F

from kernelzoo.core.rules.base import Sizes, UpdateRule, delta_step


def state_chunked(k, v, beta, chunk_size):
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


class Gram(torch.autograd.Function):
    """K K^T for K (..., L, D), with the backward (G + G^T) K as one matmul instead of two."""

    @staticmethod
    def forward(ctx, k):
        ctx.save_for_backward(k)
        return k @ k.transpose(-1, -2)

    @staticmethod
    def backward(ctx, grad):
        (k,) = ctx.saved_tensors
        return (grad + grad.transpose(-1, -2)) @ k


def read_direct(k, v, q, beta):
    """The delta rule's read q W^T without the state: one triangular solve over the sequence.

    With W^(0) = 0, W = sum_t u_t k_t^T where (I + A) U = diag(beta) V, A = tril(diag(beta) K K^T,
    -1) (the UT form of `state_chunked` over the whole sequence). So
    q W^T = (K q)^T (I + A)^{-1} diag(beta) V: solve the upper-triangular (I + A)^T X = K Q^T,
    a Q-column right-hand side, then y = (diag(beta) X)^T V. Costs L^2 (D + Q) + L Q d_v, not
    the state's L D d_v; better when L is not much larger than d_v or Q is small.
    """
    upper = torch.triu(Gram.apply(k) * beta.unsqueeze(-2), diagonal=1)  # (I + A)^T - I
    x = torch.linalg.solve_triangular(upper, k @ q.transpose(-1, -2), upper=True,
                                      unitriangular=True)  # (B, L, Q)
    return (beta.unsqueeze(-1) * x).transpose(-1, -2) @ v


def direct_is_cheaper(L, Q, D, d_v, chunk_size):
    """Multiply-adds of read_direct against the chunked state and its read."""
    C = min(chunk_size, L)
    return L * L * (D + Q) + L * Q * d_v <= L * (C * (D + d_v) + 2 * D * d_v) + Q * D * d_v


class Delta(UpdateRule):
    name = "delta"
    gates = ("beta",)

    def step(self, W, k_l, v_l, beta_l, alpha_l, l):
        return delta_step(W, k_l, v_l, beta_l)

    def read(self, k, v, q, beta, alpha, chunk_size):
        L, D, Q, d_v = k.shape[1], k.shape[2], q.shape[1], v.shape[-1]
        if direct_is_cheaper(L, Q, D, d_v, chunk_size):
            return read_direct(k, v, q, beta)
        return q @ state_chunked(k, v, beta, chunk_size).transpose(1, 2)

    def train_bytes(self, s: Sizes):
        N, L, D, S, b = s.N, s.L, s.D, s.S, s.b
        NL = N * L
        if direct_is_cheaper(L, 1, D, S, s.chunk_size):  # read_direct
            square = N * L * L * b  # gram, its product with beta, its upper triangle
            kept = s.base + 2 * square
            back = [s.base - s.values + 4 * square + NL * D * b,  # solve_triangular's, Gram's
                    s.gates + s.features + 5 * NL * D * b]  # sum_normalise's (DivBackward)
            return [s.base + s.keys + 3 * square], kept, back
        C = min(s.chunk_size, L)  # state_chunked, every chunk's state kept for the backward
        n = math.ceil(L / C)
        system = N * n * C * (S + D) * b
        pads = N * n * C * (S + D + 1) * b if n * C > L else 0
        solve = s.base + s.keys + pads + 3 * N * n * C * C * b + 2 * system
        kept = (s.base + pads + N * n * C * C * b + system + (n + 1) * s.state
                + n * N * C * S * b)
        return [solve, kept + s.keys + 2 * s.state], kept, [kept + 2 * s.state + system]

    def eval_bytes(self, s: Sizes):
        N, L, Q, D, S, b = s.N, s.L, s.Q, s.D, s.S, s.b
        y = N * Q * S * b
        if direct_is_cheaper(L, Q, D, S, s.chunk_size):  # read_direct
            return s.base + max(2 * N * L * L, N * L * L + 3 * N * L * Q) * b + y
        C = min(s.chunk_size, L)  # state_chunked: its system, solved, two states in its loop
        n = math.ceil(L / C)
        system, square = N * n * C * (S + D) * b, N * n * C * C * b
        pads = N * n * C * (S + D + 1) * b if n * C > L else 0
        return s.base + pads + 2 * system + max(2 * square,
                                                square + 3 * s.state + 2 * N * C * S * b)


RULE = Delta()
