"""The wider zoo: feature maps of today's linear-attention libraries and recall benchmarks.

Each map declares its own ``d_dot``, the number of linearly independent features (the registry's
rank test checks it on random inputs), and is written exactly as a user's own map would be
(docs/own_map.md); ``catalog.py`` registers them. Learned maps hold
``nn.Parameter``s: they are model parameters, trained with the model and initialised from the
global RNG (seeded per run).

| map            | phi(x)                                               | d_dot          |
|----------------|------------------------------------------------------|----------------|
| `squared_relu` | relu(x)^2                                            | d_key          |
| `sigmoid`      | sigmoid(x)                                           | d_key          |
| `hedgehog`     | softmax([W x, -W x]), W learned, W_0 = I             | 2 d_key        |
| `t2r`          | relu(W x + b), W (m x d_key), b learned              | m              |
| `rebased`      | quadratic features of gamma * norm(x) + beta         | d(d+1)/2 - 1   |
| `polysketch`   | quadratic features of a degree-p/2 sketch (r wide)   | r(r+1)/2       |
| `cosformer`    | relu(x) re-weighted by cos / sin of its position     | 2 d_key        |

"Quadratic features" of u (width n) are the upper triangle of u u^T with the off-diagonal
entries times sqrt(2): phi(x) . phi(y) = (u(x) . u(y))^2 exactly, with n(n+1)/2 features (the
full vec(u u^T) repeats each off-diagonal product, see ``Taylor``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from kernelzoo.maps.base import Elementwise, FeatureMap, InfeasibleError, as_count, derive, require


def quadratic_features(u: torch.Tensor) -> torch.Tensor:
    """(..., n) -> (..., n(n+1)/2): the upper triangle of u u^T, off-diagonals times sqrt(2)."""
    n = u.shape[-1]
    i, j = torch.triu_indices(n, n, device=u.device)
    scale = u.new_full(i.shape, math.sqrt(2)).masked_fill_(i == j, 1.0)
    return u[..., i] * u[..., j] * scale


def _triangle(n: int) -> int:
    return n * (n + 1) // 2


def _triangle_root(total) -> int | None:
    """n >= 1 with n(n+1)/2 = total, or None."""
    total = as_count(total)
    n = (math.isqrt(8 * total + 1) - 1) // 2 if total else 0
    return n if n >= 1 and _triangle(n) == total else None


# ------------------------------------------------------------------------------ elementwise


class SquaredRelu(Elementwise):
    """phi(x) = relu(x)^2 elementwise (the squared ReLU of Primer, So et al. 2021, used as a
    linear-attention map in recall benchmarks): d_dot = d_key."""

    name, positive = "squared_relu", True
    label = "ReLU²"
    fn = staticmethod(lambda x: torch.relu(x).square())


class Sigmoid(Elementwise):
    """phi(x) = sigmoid(x) elementwise: d_dot = d_key."""

    name, positive = "sigmoid", True
    label = "sigmoid"
    fn = staticmethod(torch.sigmoid)


# ------------------------------------------------------------------------------ learned maps


class Hedgehog(FeatureMap):
    """Hedgehog (Zhang et al., ICLR 2024): phi(x) = softmax([W x, -W x]), W (d_key x d_key)
    learned, initialised to the identity. One softmax over all 2 d_key entries: its outputs
    sum to 1 but do not pass through 0, so they span all 2 d_key dimensions (the paper's code
    takes a softmax over each half, whose two sum constraints leave 2 d_key - 1). Positive and
    d_dot = 2 d_key; reaching a d_dot sets d_key = d_dot / 2."""

    name, positive = "hedgehog", True
    label = "Hedgehog"

    def __init__(self, d_key):
        super().__init__(d_key, 2 * d_key, {})
        self.weight = nn.Parameter(torch.eye(d_key))

    def forward(self, x, is_query=False):
        wx = x @ self.weight.to(x.dtype).T
        return torch.softmax(torch.cat([wx, -wx], dim=-1), dim=-1)

    @classmethod
    def params_for_d_dot(cls, d_dot, d_key, **params):
        return {**params, "d_key": _half(cls.name, d_dot)}


class T2R(FeatureMap):
    """T2R (Kasai et al., EMNLP 2021): phi(x) = relu(W x + b) with W (m x d_key) and b learned
    (PyTorch's Linear initialisation). Positive; d_dot = m (default d_key), so reaching a d_dot
    sets m."""

    name, positive = "t2r", True
    label, sizing_param, run_id_params = "T2R", "m", ("m",)

    def __init__(self, d_key, m=None):
        m = d_key if m is None else m
        require(as_count(m) == m, f"t2r: m must be an integer >= 1, got {m!r}")
        super().__init__(d_key, m, {"m": m})
        self.linear = nn.Linear(d_key, m)

    def forward(self, x, is_query=False):
        return torch.relu(F.linear(x, self.linear.weight.to(x.dtype), self.linear.bias.to(x.dtype)))

    @classmethod
    def params_for_d_dot(cls, d_dot, d_key, **params):
        m = as_count(d_dot)
        if m is None:
            raise InfeasibleError(f"t2r cannot reach d_dot={d_dot}: d_dot = m must be an integer >= 1")
        return {**derive(cls.name, params, "m", m, d_dot), "d_key": d_key}


class ReBased(FeatureMap):
    """ReBased (Aksenov et al., 2024): u = gamma * n + beta with n = (x - mean) / std the layer
    normalisation (eps 1e-5) and gamma, beta learned (initialised to 1 and 0), then
    phi(x) = quadratic_features(u), d(d+1)/2 features with d = d_key, so phi(q) . phi(k) =
    (u(q) . u(k))^2 >= 0 (the features themselves can be negative).

    They span one dimension less: n lies in the hyperplane sum(n) = 0 on the sphere |n|^2 = d,
    so the quadratic features of u are polynomials of degree <= 2 on a (d-2)-sphere, a space of
    dimension d(d+1)/2 - 1. d_dot = d(d+1)/2 - 1 (``width`` stays d(d+1)/2); reaching a d_dot
    sets d_key. At initialisation (gamma = 1, beta = 0) u = n spans only d(d-1)/2 dimensions:
    training must move gamma and beta to use the whole state."""

    name = "rebased"
    label = "ReBased"

    def __init__(self, d_key):
        require(as_count(d_key) == d_key and d_key >= 3, f"rebased: d_key must be an integer >= 3 "
                 f"(the layer normalisation of 2 numbers leaves only their sign), got {d_key!r}")
        super().__init__(d_key, _triangle(d_key) - 1, {})
        self.gamma = nn.Parameter(torch.ones(d_key))
        self.beta = nn.Parameter(torch.zeros(d_key))

    @property
    def width(self):
        return _triangle(self.d_key)

    def forward(self, x, is_query=False):
        u = F.layer_norm(x, (self.d_key,), eps=1e-5) * self.gamma.to(x.dtype) + self.beta.to(x.dtype)
        return quadratic_features(u)

    @classmethod
    def params_for_d_dot(cls, d_dot, d_key, **params):
        d = _triangle_root(d_dot + 1) if as_count(d_dot) else None
        if d is None or d < 3:
            raise InfeasibleError(f"rebased cannot reach d_dot={d_dot}: d_dot must be "
                                  "d_key(d_key+1)/2 - 1 = 5, 9, 14, 20, 27, ... (d_key >= 3)")
        return {**params, "d_key": d}


class PolySketch(FeatureMap):
    """Non-negative PolySketch (Kacham et al., 2023): a learned sketch of degree p/2,
    s(x) = (G_1 x) * ... * (G_{p/2} x) / sqrt(r) (elementwise product of p/2 projections G_i of
    shape (r, d_key), initialised N(0, 1/d_key)), then phi(x) = quadratic_features(s(x)), so
    phi(q) . phi(k) = (s(q) . s(k))^2 >= 0, a sketch of the polynomial kernel (q . k)^p.
    d_dot = r(r+1)/2, the rank of the quadratic features of an r-wide sketch. That needs r
    independent sketch coordinates (homogeneous polynomials of degree p/2 in d_key variables)
    and r(r+1)/2 independent products (degree p), so r is capped (``_max_sketch``): d_key for
    p = 2. Reaching a d_dot sets r."""

    name = "polysketch"
    label, sizing_param, run_id_params = "PolySketch", "r", ("r", "degree")

    def __init__(self, d_key, r=None, degree=4):
        r = d_key if r is None else r
        require(degree in (2, 4), f"polysketch: degree must be 2 or 4, got {degree!r}")
        require(as_count(r) == r, f"polysketch: r must be an integer >= 1, got {r!r}")
        require(as_count(d_key) == d_key, f"polysketch: d_key must be an integer >= 1, got {d_key!r}")
        most = _max_sketch(d_key, degree)
        require(r <= most, f"polysketch: r={r} > {most}: with d_key={d_key} and degree={degree} "
                            f"at most r={most} gives r(r+1)/2 independent features; use r <= {most}")
        super().__init__(d_key, _triangle(r), {"r": r, "degree": degree})
        self.projections = nn.Parameter(torch.randn(degree // 2, r, d_key) / math.sqrt(d_key))

    def forward(self, x, is_query=False):
        s = torch.einsum("...d,prd->p...r", x, self.projections.to(x.dtype)).prod(dim=0)
        return quadratic_features(s / math.sqrt(self.params["r"]))

    @classmethod
    def params_for_d_dot(cls, d_dot, d_key, **params):
        r = _triangle_root(d_dot)
        if r is None:
            raise InfeasibleError(f"polysketch cannot reach d_dot={d_dot}: d_dot must be r(r+1)/2 "
                                  "= 1, 3, 6, 10, 15, 21, ...")
        most = _max_sketch(d_key, params.get("degree", 4))
        if r > most:
            raise InfeasibleError(f"polysketch cannot reach d_dot={d_dot} with d_key={d_key}: it "
                                  f"needs r={r} > {most}; reachable: r(r+1)/2 for r <= {most}")
        return {**derive(cls.name, params, "r", r, d_dot), "d_key": d_key}


def _max_sketch(d_key: int, degree: int) -> int:
    """The largest r whose sketch coordinates (degree/2) and their products (degree) can be
    linearly independent: r <= C(d+p/2-1, p/2) and r(r+1)/2 <= C(d+p-1, p)."""
    r = math.comb(d_key + degree // 2 - 1, degree // 2)
    while _triangle(r) > math.comb(d_key + degree - 1, degree):
        r -= 1
    return r


# ----------------------------------------------------------------------------- positional


class CosFormer(FeatureMap):
    """cosFormer (Qin et al., ICLR 2022): phi(x_i) = [relu(x_i) cos(pi i / 2M),
    relu(x_i) sin(pi i / 2M)] for position i of M, so phi(q_i) . phi(k_j) =
    relu(q_i) . relu(k_j) cos(pi (i - j) / 2M). d_dot = 2 d_key; reaching a d_dot sets d_key.

    Positions in the retrieval task (which has no positional encoding of its own): the keys of
    a sequence of length L sit at i = 1..L (the rows of x along dim -2) and M = L; the query
    comes after them, at i = M, so its features are [0, relu(q)] and key j is read with weight
    sin(pi j / 2L): the earliest keys are nearly silent, and the read-out is d_key-dimensional
    however wide the state (2 d_key) is."""

    name, positive = "cosformer", True
    label = "cosFormer"

    def __init__(self, d_key):
        super().__init__(d_key, 2 * d_key, {})

    @classmethod
    def query_rank_of(cls, d_key, d_dot, params):
        return d_key

    def forward(self, x, is_query=False):
        r = torch.relu(x)
        if is_query:
            return torch.cat([torch.zeros_like(r), r], dim=-1)
        length = x.shape[-2]
        angle = torch.arange(1, length + 1, device=x.device, dtype=x.dtype) * (math.pi / (2 * length))
        weights = torch.stack([angle.cos(), angle.sin()]).clamp(min=0)  # cos(pi/2): -4e-8 in float32
        return torch.cat([r * weights[0, :, None], r * weights[1, :, None]], dim=-1)

    @classmethod
    def params_for_d_dot(cls, d_dot, d_key, **params):
        return {**params, "d_key": _half(cls.name, d_dot)}


def _half(name: str, d_dot) -> int:
    """d_key = d_dot / 2 for a map with d_dot = 2 d_key, or InfeasibleError."""
    n = as_count(d_dot)
    if n is None or n % 2:
        raise InfeasibleError(f"{name} cannot reach d_dot={d_dot}: d_dot = 2 d_key must be an even "
                              "integer >= 2")
    return n // 2
