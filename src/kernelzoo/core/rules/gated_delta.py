"""The gated delta rule (Yang, Kautz & Hatamizadeh 2025, "Gated Delta Networks"; the reference
document's "gated delta"): a scalar decay alpha_l in (0, 1) before the delta update,

    W <- alpha_l W (I - beta_l k_l k_l^T) + beta_l v_l k_l^T,

i.e. v_bar = W k_l; W <- alpha_l W + beta_l (v_l - alpha_l v_bar) k_l^T. Both gates are made
from x_l like the delta rule's beta: beta_l = sigmoid(w_b . x_l + b_b), alpha_l =
sigmoid(w_a . x_l + b_a), b_a initialised at ALPHA_BIAS (alpha about 0.993: the memory starts
close to the delta rule's and learns how fast to forget, as an LSTM's forget gate starts open).

``read`` is one triangular solve over the sequence (the delta rule's ``read_direct`` with the
decays). With G_t = sum_{i<=t} log alpha_i, W^(L) = sum_s e^{G_L - G_s} u_s k_s^T where
(I + A) U = diag(beta) V, A_ts = beta_t e^{G_t - G_s} (k_t . k_s) for s < t (induction on
the step above: u_t = beta_t (v_t - alpha_t W^(t-1) k_t)). So y = (diag(beta) X)^T V with X
solving the upper-triangular (I + A)^T X = diag(e^{G_L - G}) K Q^T. Every decay e^{G_t - G_s},
s <= t, is at most 1: nothing overflows however fast the memory forgets. It costs
L^2 (D + Q) + L Q d_v; there is no chunked form here, so it suits this task's sequences
(L = n_keys, a few hundred), not long ones.
"""

import torch

from kernelzoo.core.rules.base import Sizes, UpdateRule
from kernelzoo.core.rules.delta import Gram

ALPHA_BIAS = 5.0  # the decay gate's initial bias: sigmoid(5) = 0.9933


class GatedDelta(UpdateRule):
    name = "gated_delta"
    gates = ("beta", "alpha")
    gate_bias = {"alpha": ALPHA_BIAS}

    def step(self, W, k_l, v_l, beta_l, alpha_l, l):
        v_bar = (W @ k_l[:, :, None]).squeeze(-1)
        a = alpha_l[:, None]
        u = beta_l[:, None] * (v_l - a * v_bar)
        return a[:, :, None] * W + u[:, :, None] * k_l[:, None, :]

    def read(self, k, v, q, beta, alpha, chunk_size):
        G = torch.log(alpha).cumsum(-1)  # (B, L)
        L = G.shape[-1]
        below = torch.ones(L, L, dtype=torch.bool, device=G.device).tril(-1)
        # e^{G_t - G_s} at [s, t]: at most 1 on and above the diagonal; 1 below it (unused)
        decay = (G.unsqueeze(-2) - G.unsqueeze(-1)).masked_fill(below, 0.0).exp()
        upper = torch.triu(Gram.apply(k) * beta.unsqueeze(-2) * decay, diagonal=1)
        rhs = (G[:, -1:] - G).exp().unsqueeze(-1) * (k @ q.transpose(-1, -2))  # (B, L, Q)
        x = torch.linalg.solve_triangular(upper, rhs, upper=True, unitriangular=True)
        return (beta.unsqueeze(-1) * x).transpose(-1, -2) @ v

    def train_bytes(self, s: Sizes):
        N, L, D, b = s.N, s.L, s.D, s.b
        square = N * L * L * b  # the gram, the decays (difference, clamp, exp), products
        kept = s.base + 4 * square
        back = [s.base - s.values + 6 * square + N * L * D * b,
                s.gates + s.features + 5 * N * L * D * b]
        return [s.base + s.keys + 5 * square], kept, back

    def eval_bytes(self, s: Sizes):
        N, L, Q, S, b = s.N, s.L, s.Q, s.S, s.b
        return s.base + (4 * N * L * L + 3 * N * L * Q) * b + N * Q * S * b


RULE = GatedDelta()
