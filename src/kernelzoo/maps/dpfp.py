"""DPFP, the deterministic parameter-free projection (reference §6.3; the examples of §6.5-6.6),
and its fast path: for one query, phi(k) . phi(q) by the kernel trick, without building the
2 d_key nu features (same numbers). ``catalog.py`` registers it.
"""

import torch
from torch.autograd.function import once_differentiable

from kernelzoo.maps.base import FeatureMap, InfeasibleError, as_count, batch_slices, derive, is_count, require


class DPFP(FeatureMap):
    """Deterministic parameter-free projection, §6.3: r = relu([x, -x]) in R^{2 d_key} and
    phi = concat_{s=1..nu} r * roll(r, -s), i.e. (r * r^(s))_i = r_i r_{(i+s) mod 2 d_key}.
    d_dot = 2 d_key nu; the §6.5-6.6 examples hold verbatim (e.g. (1.5, -0.8) -> (0, 0, 0, 1.2)).

    §6.3 allows nu up to 2 d_key - 1, but shift s = d_key multiplies relu(x_i) by relu(-x_i),
    always 0, and shift 2 d_key - s gives the products of shift s in another order: for
    nu >= d_key the features have rank 2 d_key (d_key - 1) < d_dot, so nu must be < d_key
    (for nu < d_key the 2 d_key nu products are distinct and linearly independent)."""

    name, positive = "dpfp", True
    label, sizing_param, run_id_params = "DPFP", "nu", ("nu",)

    @classmethod
    def label_of(cls, params):
        """"DPFP-2": nu joins the name, as the authors write it (nu is never shown as nu=)."""
        nu = params.get("nu")
        return (cls.label if nu is None else f"{cls.label}-{nu}"), ("nu",)

    def __init__(self, d_key, nu=1):
        super().__init__(d_key, 2 * d_key * nu, {"nu": nu})
        require(d_key >= 2, f"dpfp: d_key must be >= 2 (at d_key=1 every feature is relu(x) relu(-x) = 0), "
                             f"got {d_key!r}")
        valid = f"an integer in [1, d_key-1] = [1, {d_key - 1}]"
        require(is_count(nu), f"dpfp: nu must be {valid}, got {nu!r}")
        require(nu < d_key, f"dpfp: {_dpfp_repeats(nu, d_key)}; nu must be {valid}")
        self.nu = nu

    def forward(self, x, is_query=False):
        r = _relu_pm(x)
        n = r.shape[-1]
        padded = torch.cat([r, r[..., :self.nu]], dim=-1)  # padded[..., s:s + n] = roll(r, -s)
        return torch.cat([r * padded[..., s:s + n] for s in range(1, self.nu + 1)], dim=-1)

    def scores(self, k, q, normalise=False, eps=1e-6, key_eps=0.0):
        """For one query (training) the kernel trick: with u = r(k) * r(q),
        phi(k) . phi(q) = sum_s sum_i u_i u_(i+s) and sum phi(k) = sum_s sum_i r_i r_(i+s), so
        the 2 d_key nu features are never built (_DPFPScores). For many queries (evaluation) one
        matmul of the explicit features is cheaper."""
        if q.shape[-2] != 1:
            return super().scores(k, q, normalise, eps, key_eps)
        rq = _relu_pm(q)
        s = _DPFPScores.apply(k, rq, self.nu)  # (B, L, 1)
        if normalise:
            sum_k = _DPFPScores.apply(k, torch.ones_like(rq), self.nu)
            sum_q = (rq * _window(rq, self.nu)).sum(-1, keepdim=True)
            s = s / ((sum_k + key_eps) * (sum_q + eps))
        return s.transpose(-1, -2)

    @classmethod
    def params_for_d_dot(cls, d_dot, d_key, **params):
        nu = as_count(d_dot / (2 * d_key)) if as_count(d_dot) else None
        if nu is None or nu >= d_key:
            why = "d_dot must be 2*d_key*nu" if nu is None else _dpfp_repeats(nu, d_key)
            raise InfeasibleError(
                f"dpfp cannot reach d_dot={d_dot} with d_key={d_key}: {why}; reachable (nu <= d_key-1): "
                f"{_dpfp_d_dots(d_key)}"
            )
        return {**derive(cls.name, params, "nu", nu, d_dot), "d_key": d_key}


def _dpfp_repeats(nu, d_key):
    """The reason DPFP refuses nu >= d_key (see DPFP), as a phrase for error messages."""
    return f"nu={nu} >= d_key={d_key} repeats or zeroes features (shift d_key pairs x with -x, 2*d_key-s repeats s)"


def _dpfp_d_dots(d_key):
    """The d_dot values DPFP reaches at d_key, 2 d_key nu for nu in [1, d_key-1], as text."""
    values = [2 * d_key * nu for nu in range(1, d_key)]
    shown = values if len(values) <= 3 else [*values[:2], "...", values[-1]]
    return ", ".join(map(str, shown)) or "none (dpfp needs d_key >= 2)"


def _relu_pm(x):
    """relu([x, -x]) over the last dim: the 2 d_key-vector r of DPFP (§6.3)."""
    return torch.cat([x, -x], dim=-1).relu_()


def _window(u, nu):
    """w_i = sum_{s=1..nu} u_(i+s), indices mod u's last dim (nu < 2 d_key). Then
    sum_s sum_i u_i u_(i+s) = u . w, whose derivative by u_i is w_i + w_(i-nu-1)."""
    n = u.shape[-1]
    padded = torch.cat([u, u[..., :nu]], dim=-1)
    w = padded[..., 1:1 + n]
    for s in range(2, nu + 1):
        w = w + padded[..., s:s + n]
    return w


class _DPFPScores(torch.autograd.Function):
    """s_l = sum_{s=1..nu} sum_i u_i u_(i+s), u = relu([k_l, -k_l]) * w: for keys k (B, L, d_key)
    and weights w (B, 1, 2 d_key), s (B, L, 1) is phi(k_l) . phi(q) for w = relu([q, -q]) and
    sum_i phi(k_l)_i for w = 1 (DPFP, §6.3). Nothing nu times wider than k is built, and on the
    CPU the batch is processed in slices that fit in cache; the backward recomputes u."""

    @staticmethod
    def forward(ctx, k, w, nu):
        ctx.save_for_backward(k, w)
        ctx.nu = nu
        out = k.new_empty(k.shape[:-1] + (1,))
        for b in batch_slices(k):
            u = _relu_pm(k[b]) * w[b]
            torch.sum(u * _window(u, nu), dim=-1, keepdim=True, out=out[b])
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        k, w = ctx.saved_tensors
        d = k.shape[-1]
        grad_k = torch.empty_like(k)
        grad_w = torch.empty_like(w) if ctx.needs_input_grad[1] else None
        for b in batch_slices(k):
            r = _relu_pm(k[b])
            win = _window(r * w[b], ctx.nu)
            grad_u = grad[b] * (win + win.roll(ctx.nu + 1, dims=-1))  # d s / d u
            if grad_w is not None:
                torch.sum(grad_u * r, dim=1, keepdim=True, out=grad_w[b])
            # relu's own backward (grad where r > 0, else 0); much faster than a comparison
            grad_r = torch.ops.aten.threshold_backward(grad_u * w[b], r, 0.0)
            torch.sub(grad_r[..., :d], grad_r[..., d:], out=grad_k[b])
        return grad_k, grad_w, None
