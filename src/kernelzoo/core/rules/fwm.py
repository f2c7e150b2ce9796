"""The fast weight memory rule (task spec, "fwm"; Figure 3 only): the delta step with the raw
phi(k_l); after every step from the second on, W <- W / max(1, ||W||_F); output
y = LayerNorm(W phi(q)) over d_v, no affine parameters, eps 1e-5. ``normalisation`` does not
apply. The per-step renormalisation is nonlinear, so the loop over time steps stays: for a large
state (``CHUNKED_FROM`` entries B d_v D or more) over vectors (``state``, which forms the state
once per chunk, with a hand-written backward), for a small one the literal loop.

``state``: step l writes u_l = beta_l (v_l - v_bar_l), v_bar_l = W k_l, into
M_l = W + u_l k_l^T, then W <- M_l / n_l with n_l = max(1, ||M_l||_F) (n_0 = 1: no division
after the first write).

Within a chunk of C steps starting from the state W_0, with log-scales l_t = -sum_{i<=t} log n_i
(l_{-1} = 0), the state before step t is W_{t-1} = e^{l_{t-1}} W_0 + sum_{j<t} e^{l_{t-1} - l_{j-1}}
u_j k_j^T, so

    v_bar_t = e^{l_{t-1}} p_t + sum_{j<t} e^{l_{t-1} - l_{j-1}} g_tj u_j,   p = K W_0^T, g = K K^T,
    q_t = ||M_t||^2 = s_{t-1} + 2 u_t . v_bar_t + |u_t|^2 g_tt,   s_{-1} = ||W_0||^2,

and a step that divides (q_t > 1, after the first write) sets l_t = l_{t-1} - log(q_t) / 2 and
s_t = 1; any other step keeps l_t = l_{t-1} and s_t = q_t. The state is formed once per chunk.
Every coefficient e^{l_{t-1} - l_{j-1}} is at most 1, so nothing overflows however much the
steps divide, and the log-scales are kept in float64 (their differences would lose float32's
precision once the sum of logs is large). The loop runs over (B, d_v) vectors, not (B, d_v, D)
states.

Autograd through that loop would record ~100 tiny operations a step (and zero-filled gradients of
every slice), so the backward here is written out: the same loop in reverse over the stored
u_t, v_bar_t, q_t and scales, with the chunk's matrix products batched after it. It is tested
against autograd through the literal recurrence (values and gradients, `tests/test_memory.py`).
"""

import math

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from kernelzoo.core.rules.base import Sizes, UpdateRule, delta_step, recurrent_state

LAYER_NORM_EPS = 1e-5  # task spec: LayerNorm of the output, no affine parameters
# the chunked form (`state`) pays from about this many state entries B * d_v * D; below it the
# literal loop is as fast (`make bench`, rows fwm, compares the two).
CHUNKED_FROM = 8192
F64 = 8  # bytes of a float64 log-scale
LOG_DTYPE = {"mps": torch.float32}  # the log-scales' dtype where float64 is missing (else float64)


def _exp(x, like):
    """e^x in the dtype of ``like``. The log-scales are float64 (where the device has it), whose
    absolute error stays far below float32's relative one however negative they get (the steps'
    logs add up); in float32 they cost 1e-5 relative only where every step divides by 10-100."""
    return x.exp().to(like.dtype)


def _dot(a, b):
    """<a, b> per batch entry of two contiguous (B, d_v, D) states: a batched product per row,
    then a sum over the d_v rows. No state-sized temporary. One (1 x d_v D) @ (d_v D x 1)
    product per entry is a shape BLAS handles badly: several times slower, and less accurate
    against float64 (one long float32 sum instead of d_v short ones)."""
    B, d_v, D = a.shape
    return (a.view(B * d_v, 1, D) @ b.view(B * d_v, D, 1)).view(B, d_v).sum(1)


class _State(torch.autograd.Function):
    @staticmethod
    def forward(ctx, k, v, beta, chunk_size):
        B, L, D = k.shape
        U, Vbar = v.new_empty(B, L, v.shape[-1]), v.new_empty(B, L, v.shape[-1])
        l_prev = k.new_empty(B, L, dtype=LOG_DTYPE.get(k.device.type, torch.float64))
        q, divides = k.new_empty(B, L), k.new_zeros(B, L, dtype=torch.bool)
        W, starts = k.new_zeros(B, v.shape[-1], D), range(0, L, chunk_size)
        W0s = []
        for s in starts:
            e = min(s + chunk_size, L)
            kc = k[:, s:e]
            p, g = kc @ W.transpose(1, 2), kc @ kc.transpose(1, 2)
            l, sq = l_prev.new_zeros(B), _dot(W, W)
            for t in range(e - s):
                i = s + t
                v_bar = _exp(l, k)[:, None] * p[:, t]
                if t:
                    coef = _exp(l[:, None] - l_prev[:, s:i], k) * g[:, t, :t]
                    v_bar = v_bar + (coef[:, None] @ U[:, s:i]).squeeze(1)
                u = beta[:, i, None] * (v[:, i] - v_bar)
                q_t = sq + (u * torch.addcmul(2 * v_bar, u, g[:, t, t, None])).sum(-1)
                U[:, i], Vbar[:, i], l_prev[:, i], q[:, i] = u, v_bar, l, q_t
                if i:  # divide when q_t > 1: l_t = l_{t-1} - log(q_t) / 2, s_t = 1
                    divides[:, i] = q_t > 1
                    l, sq = l - 0.5 * q_t.clamp(min=1).log(), q_t.clamp(max=1)
                else:
                    sq = q_t
            W0s.append(W)
            c = _exp(l[:, None] - l_prev[:, s:e], k)
            W = (_exp(l, k)[:, None, None] * W).baddbmm_(
                (U[:, s:e] * c[..., None]).transpose(1, 2), kc)
        ctx.chunk_size = chunk_size
        ctx.save_for_backward(k, v, beta, U, Vbar, l_prev, q, divides, W, *W0s)
        return W

    @staticmethod
    @once_differentiable  # a gradient of this gradient is not written out
    def backward(ctx, G_W):
        k, v, beta, U, Vbar, l_prev, q, divides, W_end, *W0s = ctx.saved_tensors
        B, L, D = k.shape
        G_k, G_beta = torch.empty_like(k), torch.empty_like(beta)
        G_v = torch.empty_like(v) if ctx.needs_input_grad[1] else None  # one-hot values: none
        G_W, W1, owned = G_W.contiguous(), W_end, False  # owned: G_W is updated in place
        for n, s in reversed(list(enumerate(range(0, L, ctx.chunk_size)))):
            e = min(s + ctx.chunk_size, L)
            kc, Uc, W0 = k[:, s:e], U[:, s:e], W0s[n]
            g = kc @ kc.transpose(1, 2)
            l_end = l_prev[:, e - 1] - 0.5 * q[:, e - 1].clamp(min=1).log() * divides[:, e - 1]
            c = _exp(l_end[:, None] - l_prev[:, s:e], k)  # (B, C): u_j's weight in W1
            # W1 = e^{l_end} W0 + sum_j c_j u_j k_j^T
            G_l = _dot(G_W, W1)  # d/d l_end
            G_U_out = c[..., None] * (kc @ G_W.transpose(1, 2))  # (B, C, d_v)
            G_kc = (Uc * c[..., None]) @ G_W
            scale = _exp(l_end, k)[:, None, None]
            G_W0 = G_W.mul_(scale) if owned else G_W * scale  # the state-sized buffers are
            # updated in place: fresh ones cost more (page faults) than the arithmetic
            G_sq = torch.zeros_like(G_l)
            G_U, G_Vbar, G_Q = torch.empty_like(Uc), torch.empty_like(Uc), torch.empty_like(c)
            for t in reversed(range(e - s)):
                i = s + t
                u, v_bar = U[:, i], Vbar[:, i]
                G_q = torch.where(divides[:, i], -G_l / (2 * q[:, i]), G_sq)  # via l_t or s_t
                G_u = G_U_out[:, t]
                if t + 1 < e - s:  # v_bar of the later steps of the chunk
                    coef = _exp(l_prev[:, i + 1:e] - l_prev[:, i, None], k) * g[:, t + 1:, t]
                    G_u = G_u + (coef[:, None] @ G_Vbar[:, t + 1:]).squeeze(1)
                G_l = G_l - (u * G_u).sum(-1)  # u_t's weights e^{l_{t'-1} - l_{t-1}}
                two_G_q = 2 * G_q[:, None]
                G_u = torch.addcmul(G_u, two_G_q, torch.addcmul(v_bar, u, g[:, t, t, None]))
                G_vbar = torch.addcmul(two_G_q * u, beta[:, i, None], G_u, value=-1)
                G_l = G_l + (G_vbar * v_bar).sum(-1)  # v_bar_t is proportional to e^{l_{t-1}}
                G_U[:, t], G_Q[:, t], G_Vbar[:, t] = G_u, G_q, G_vbar
                G_sq = G_q
            G_beta[:, s:e] = (G_U * (v[:, s:e] - Vbar[:, s:e])).sum(-1)
            if G_v is not None:
                G_v[:, s:e] = beta[:, s:e, None] * G_U
            G_W0.addcmul_(2 * G_sq[:, None, None], W0)  # s_{-1} = ||W_0||^2
            G_P = _exp(l_prev[:, s:e], k)[..., None] * G_Vbar  # e^{l_{t-1}} p_t
            G_kc.baddbmm_(G_P, W0)
            G_W0.baddbmm_(G_P.transpose(1, 2), kc)
            ratio = _exp((l_prev[:, s:e, None] - l_prev[:, None, s:e]).clamp(max=0), k)  # j < t
            G_g = torch.tril(ratio * (G_Vbar @ Uc.transpose(1, 2)), diagonal=-1)
            G_g = G_g + torch.diag_embed(G_Q * Uc.square().sum(-1))  # q_t's |u_t|^2 g_tt
            G_k[:, s:e] = G_kc.baddbmm_(G_g + G_g.transpose(1, 2), kc)
            G_W, W1, owned = G_W0, W0, True
        return G_k, G_v, G_beta, None


def state(k, v, beta, chunk_size):
    """Final fwm fast weights W (B, d_v, D) for keys k (B, L, D), values v (B, L, d_v) and
    beta (B, L), forming the state every ``chunk_size`` steps; differentiable in k, v, beta.

    A compiled step runs it eagerly (``pack.EAGER``: a graph break; the rest of the step
    compiles): tracing its Python loops over the writes takes far longer than compiling the
    rest of the step."""
    return _State.apply(k, v, beta, chunk_size)


class Fwm(UpdateRule):
    name = "fwm"
    gates = ("beta",)
    normalised = False
    extra_rank = 1  # the LayerNorm's centring (docs/analysis.md, "The rank bound")
    layer_norm = True
    eager = ("state",)  # traced, its Python loop over the writes would unroll

    def step(self, W, k_l, v_l, beta_l, alpha_l, l):
        W = delta_step(W, k_l, v_l, beta_l)
        return W / torch.linalg.matrix_norm(W).clamp(min=1.0)[:, None, None] if l > 0 else W

    def read(self, k, v, q, beta, alpha, chunk_size):
        B, D, d_v = k.shape[0], k.shape[2], v.shape[-1]
        if B * D * d_v >= CHUNKED_FROM:
            W = state(k, v, beta, chunk_size)
        else:
            W = recurrent_state(self, k, v, beta, None)
        return q @ W.transpose(1, 2)

    def finish(self, y, phi_k, q, normalisation, eps, value_mask=None):
        """LayerNorm over d_v (over the real value slots only when ``value_mask`` (B, d_v) marks
        them; the others give 0)."""
        if value_mask is None:
            return F.layer_norm(y, y.shape[-1:], eps=LAYER_NORM_EPS)
        m = value_mask.unsqueeze(1).to(y.dtype)
        n = m.sum(-1, keepdim=True)
        mean = (y * m).sum(-1, keepdim=True) / n
        var = ((y - mean).square() * m).sum(-1, keepdim=True) / n
        return (y - mean) * torch.rsqrt(var + LAYER_NORM_EPS) * m

    def flushes_denormals(self, training, normalisation):
        return True

    def train_bytes(self, s: Sizes):
        N, L, D, S, b = s.N, s.L, s.D, s.S, s.b
        NL = N * L
        if N * D * S < CHUNKED_FROM:  # the literal loop keeps every step's state
            kept = s.base + 2 * L * s.state
            return [s.base + s.keys + 2 * L * s.state], kept, [kept + 2 * s.state]
        C = min(s.chunk_size, L)
        n = math.ceil(L / C)
        written = 2 * NL * S * b + NL * (F64 + b + 1) + (n + 1) * s.state  # ctx's tensors
        read = [s.base + s.keys + written + s.state + N * C * (2 * S + C) * b]
        kept = s.base + written + N * S * b
        # the state's gradient as it comes, contiguous, and scaled; the keys'; a chunk's
        back = [s.base + written + 3 * s.state + NL * (D + 1) * b
                + N * C * (D + 3 * S + 5 * C) * b]
        return read, kept, back

    def eval_bytes(self, s: Sizes):
        N, L, D, S, b = s.N, s.L, s.D, s.S, s.b
        if N * D * S < CHUNKED_FROM:
            return s.base + 2 * L * s.state
        C = min(s.chunk_size, L)
        n = math.ceil(L / C)
        NL = N * L
        return (s.base + (2 * NL * S + (n + 1) * N * S * D + N * C * (2 * S + C)) * b
                + NL * (F64 + b + 1))


RULE = Fwm()
