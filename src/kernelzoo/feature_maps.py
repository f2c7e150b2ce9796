"""Feature maps phi for linear attention: phi(q)^T phi(k) replaces exp(q^T k / sqrt(d_key)).

Every map is an nn.Module that declares its own output width `d_dot`, the capacity of the
memory it feeds (reference §2.2: at most d_dot non-interfering associations). References to
"§" are to the reference document (The Kernel Zoo); "task-spec" is the authors' protocol.

    phi = build_feature_map("dpfp", d_key=64, nu=2)        # phi.d_dot == 256
    phi = build_feature_map("favor", d_key=64, d_dot=128)  # m resolved from d_dot: m == 128
    phi.maybe_redraw()                                     # once per model forward
    k, q = phi(keys), phi(query, is_query=True)            # (..., d_key) -> (..., d_dot)
    s = phi.scores(keys, query)                            # (B, Q, L): phi(q_j) . phi(k_l)

`scores` is what the sum rule reads; DPFP and FAVOR+ compute it without materialising all the
features at once (same numbers; see "fast paths").

Random maps (favor, trig) hold their projection Omega (m, d_key) as a buffer; `maybe_redraw`
applies the redraw policy, and the caller must apply phi to keys AND queries between two calls
so that both share one Omega. Within `per_element_draws(n)` (evaluation, see runner.evaluate)
a redraw draws n projections at once, (n, m, d_key), one per batch element of phi's input.
This module knows no config system: parameters are plain values.
"""

import contextlib
import inspect
import math
import numbers

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable


class ConfigError(ValueError):
    """Invalid feature-map parameters (unknown name, out-of-range value, unknown parameter)."""


class InfeasibleError(ValueError):
    """A requested d_dot that the map cannot reach with the given d_key and parameters."""


def _require(ok, message):
    if not ok:
        raise ConfigError(message)


def _is_count(value):
    """True for an integer (not a bool) >= 1."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 1


def _count(value):
    """`value` as an int if it is a whole number >= 1 (e.g. 128 or 128.0), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return int(value) if value == int(value) and value >= 1 else None


# --------------------------------------------------------------------------------- base class


class FeatureMap(nn.Module):
    """phi: (..., d_key) -> (..., d_dot). Subclasses set `name`, `positive` and implement forward."""

    name = ""
    positive = False  # all outputs >= 0 by construction
    is_softmax = False  # True only for the exact-softmax baseline

    def __init__(self, d_key, d_dot, params):
        super().__init__()
        _require(_is_count(d_key), f"{self.name}: d_key must be an integer >= 1, got {d_key!r}")
        self.d_key, self.d_dot = d_key, d_dot
        self._params = params

    @property
    def params(self):
        """Constructor parameters except d_key, as plain Python values (for logging)."""
        return dict(self._params)

    def extra_repr(self):
        shown = {k: ("[...]" if isinstance(v, list) else v) for k, v in self._params.items()}
        return ", ".join(f"{k}={v!r}" for k, v in {"d_key": self.d_key, "d_dot": self.d_dot, **shown}.items())

    @property
    def width(self):
        """The number of features phi emits: d_dot, unless some are linearly dependent by
        construction (rebased: its layer normalisation ties them by one relation)."""
        return self.d_dot

    @property
    def query_rank(self):
        """The number of independent features of queries: d_dot unless a map treats queries
        differently (cosformer's query position uses half of its features)."""
        return self.d_dot

    draws_per_chunk = False  # True: evaluation draws a projection per query chunk (random maps)

    def maybe_redraw(self):
        """Called once per model forward, before phi is applied; deterministic maps do nothing."""

    def forward(self, x, is_query=False):
        raise NotImplementedError

    def scores(self, k, q, normalise=False, eps=1e-6, key_eps=0.0):
        """phi(q_j) . phi(k_l) for the keys k (B, L, d_key) and queries q (B, Q, d_key) of each
        batch element: (B, Q, L), what the sum rule reads without building its state. With
        normalise=True both sides are sum-normalised first (§7.2): phi(k) / (sum phi(k) + key_eps)
        and phi(q) / (sum phi(q) + eps). This default builds the features; a map may override it
        with a cheaper computation of the same numbers (DPFP does, for one query)."""
        fk, fq = self(k), self(q, is_query=True)
        if normalise:
            fk, fq = sum_normalise(fk, key_eps), sum_normalise(fq, eps)
        return batched_dot(fq, fk)

    @classmethod
    def params_for_d_dot(cls, d_dot, d_key, **params):
        """Full constructor kwargs (including d_key) that give this map d_dot, or InfeasibleError
        (this default: a map that does not say how its size follows from d_dot)."""
        raise InfeasibleError(f"{cls.name} cannot be sized by d_dot={d_dot}: it defines no "
                              "params_for_d_dot; give its parameters (and d_key) instead")


# --------------------------------------------------------------------------- deterministic maps


class Softmax(FeatureMap):
    """Exact softmax attention (no feature map): d_dot = inf, phi is the identity and the memory
    computes softmax(k^T q / sqrt(d_key)) itself (§3.1: its feature space is infinite)."""

    name = "softmax"
    is_softmax = True

    def __init__(self, d_key):
        super().__init__(d_key, math.inf, {})

    def forward(self, x, is_query=False):
        return x

    @classmethod
    def params_for_d_dot(cls, d_dot, d_key, **params):
        if d_dot != math.inf:
            raise InfeasibleError(f"softmax cannot reach d_dot={d_dot}: its d_dot is unbounded (math.inf)")
        return {"d_key": d_key, **params}


class _Elementwise(FeatureMap):
    """phi(x) = fn(x) elementwise, so d_dot = d_key; reaching a d_dot means setting d_key = d_dot."""

    fn = None

    def __init__(self, d_key):
        super().__init__(d_key, d_key, {})

    def forward(self, x, is_query=False):
        return self.fn(x)

    @classmethod
    def params_for_d_dot(cls, d_dot, d_key, **params):
        if _count(d_dot) is None:
            raise InfeasibleError(f"{cls.name} cannot reach d_dot={d_dot}: d_dot = d_key must be an integer >= 1")
        return {**params, "d_key": _count(d_dot)}


class Identity(_Elementwise):
    """phi(x) = x: the plain fast weight programmer of §1.3."""

    name = "identity"
    fn = staticmethod(lambda x: x)


class Relu(_Elementwise):
    """phi(x) = max(0, x)."""

    name, positive = "relu", True
    fn = staticmethod(torch.relu)


class Elu(_Elementwise):
    """phi(x) = elu(x) + 1 ("Linear" in Figure 2; the running example of the introduction)."""

    name, positive = "elu", True
    fn = staticmethod(lambda x: _EluPlusOne.apply(x))


class _EluPlusOne(torch.autograd.Function):
    """elu(x) + 1 = exp(min(x, 0)) + max(x, 0), whose derivative is min(elu(x) + 1, 1): two
    to three times faster than F.elu(x) + 1 (expm1 is slow on the CPU) and its backward."""

    @staticmethod
    def forward(ctx, x):
        out = x.clamp(max=0).exp_().add_(x.clamp(min=0))
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, grad):
        (out,) = ctx.saved_tensors
        return grad * out.clamp(max=1)


class Tanh(_Elementwise):
    """phi(x) = tanh(x) (paired with the fwm update rule in Figure 3)."""

    name = "tanh"
    fn = staticmethod(torch.tanh)


class DPFP(FeatureMap):
    """Deterministic parameter-free projection, §6.3: r = relu([x, -x]) in R^{2 d_key} and
    phi = concat_{s=1..nu} r * roll(r, -s), i.e. (r * r^(s))_i = r_i r_{(i+s) mod 2 d_key}.
    d_dot = 2 d_key nu; the §6.5-6.6 examples hold verbatim (e.g. (1.5, -0.8) -> (0, 0, 0, 1.2)).

    §6.3 allows nu up to 2 d_key - 1, but shift s = d_key multiplies relu(x_i) by relu(-x_i),
    always 0, and shift 2 d_key - s gives the products of shift s in another order: for
    nu >= d_key the features have rank 2 d_key (d_key - 1) < d_dot, so nu must be < d_key
    (for nu < d_key the 2 d_key nu products are distinct and linearly independent)."""

    name, positive = "dpfp", True

    def __init__(self, d_key, nu=1):
        super().__init__(d_key, 2 * d_key * nu, {"nu": nu})
        _require(d_key >= 2, f"dpfp: d_key must be >= 2 (at d_key=1 every feature is relu(x) relu(-x) = 0), "
                             f"got {d_key!r}")
        valid = f"an integer in [1, d_key-1] = [1, {d_key - 1}]"
        _require(_is_count(nu), f"dpfp: nu must be {valid}, got {nu!r}")
        _require(nu < d_key, f"dpfp: {_dpfp_repeats(nu, d_key)}; nu must be {valid}")
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
        nu = _count(d_dot / (2 * d_key)) if _count(d_dot) else None
        if nu is None or nu >= d_key:
            why = "d_dot must be 2*d_key*nu" if nu is None else _dpfp_repeats(nu, d_key)
            raise InfeasibleError(
                f"dpfp cannot reach d_dot={d_dot} with d_key={d_key}: {why}; reachable (nu <= d_key-1): "
                f"{_dpfp_d_dots(d_key)}"
            )
        return {**_derive(cls.name, params, "nu", nu, d_dot), "d_key": d_key}


def _dpfp_repeats(nu, d_key):
    """The reason DPFP refuses nu >= d_key (see DPFP), as a phrase for error messages."""
    return f"nu={nu} >= d_key={d_key} repeats or zeroes features (shift d_key pairs x with -x, 2*d_key-s repeats s)"


def _dpfp_d_dots(d_key):
    """The d_dot values DPFP reaches at d_key, 2 d_key nu for nu in [1, d_key-1], as text."""
    values = [2 * d_key * nu for nu in range(1, d_key)]
    shown = values if len(values) <= 3 else [*values[:2], "...", values[-1]]
    return ", ".join(map(str, shown)) or "none (dpfp needs d_key >= 2)"


class Taylor(FeatureMap):
    """Second-order Taylor features of exp as in Based: with d = d_key and t = q^T k / sqrt(d),
    phi(q)^T phi(k) = 1 + t + t^2/2, the Taylor expansion of exp(q^T k / sqrt(d)) (always > 0,
    but the features can be negative). The full form [1, x / d^(1/4), vec(x x^T) / sqrt(2d)]
    repeats every off-diagonal product x_i x_j (i < j) as x_j x_i, so phi keeps the upper
    triangle only, off-diagonal entries times sqrt(2) (same kernel):

        phi(x) = [1, x / d^(1/4), (x_i^2 / sqrt(2d))_i, (x_i x_j / sqrt(d))_{i<j}]

    d_dot = 1 + d + d(d+1)/2 = (d+1)(d+2)/2, the number of linearly independent features (§2.2:
    the dimension that bounds the capacity)."""

    name = "taylor"

    def __init__(self, d_key):
        super().__init__(d_key, _taylor_d_dot(d_key), {})

    def forward(self, x, is_query=False):
        d = self.d_key
        i, j = torch.triu_indices(d, d, device=x.device)  # row by row: (0, 0), (0, 1), ...
        scale = x.new_full(i.shape, 1 / math.sqrt(d)).masked_fill_(i == j, 1 / math.sqrt(2 * d))
        return torch.cat([torch.ones_like(x[..., :1]), x / d**0.25, x[..., i] * x[..., j] * scale], dim=-1)

    @classmethod
    def params_for_d_dot(cls, d_dot, d_key, **params):
        n = _count(d_dot)
        d = (math.isqrt(8 * n + 1) - 3) // 2 if n else 0  # root of (d+1)(d+2)/2 = d_dot
        if d < 1 or _taylor_d_dot(d) != n:
            raise InfeasibleError(
                f"taylor cannot reach d_dot={d_dot}: d_dot must be 1 + d + d(d+1)/2 = 3, 6, 10, 15, 21, ... "
                f"(d = d_key)"
            )
        return {**params, "d_key": d}


def _taylor_d_dot(d_key):
    """1 + d + d(d+1)/2: the constant, the linear and the distinct quadratic features of taylor."""
    return 1 + d_key + d_key * (d_key + 1) // 2


def _derive(name, params, key, value, d_dot):
    """params with params[key] = value; an explicitly given, different value is a ConfigError."""
    _require(
        params.get(key, value) == value,
        f"{name}: {key}={params.get(key)!r} contradicts d_dot={d_dot} (which needs {key}={value})",
    )
    return {**params, key: value}


# ------------------------------------------------------------------- fast paths (same numbers)


class _BatchedDot(torch.autograd.Function):
    """a @ b^T for a (B, M, D), b (B, N, D) -> (B, M, N), with bmm's backward made fast for a
    single row (M or N = 1, one query): bmm's own forms a transposed batched matrix-vector
    product and an outer product by matmul, each several times slower on the CPU than the
    other orientation and a broadcast multiply."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return a @ b.transpose(-1, -2)

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        grad_a = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_a = grad * b if b.shape[-2] == 1 else grad @ b
        if ctx.needs_input_grad[1]:
            grad_t = grad.transpose(-1, -2)
            grad_b = grad_t * a if a.shape[-2] == 1 else grad_t @ a
        return grad_a, grad_b


def sum_normalise(phi, eps):
    """phi / (sum_i phi_i + eps): sum normalisation of feature vectors (§7.2)."""
    return phi / (phi.sum(-1, keepdim=True) + eps)


def batched_dot(a, b):
    """a @ b^T over the last two dims, a (B, M, D) and b (B, N, D) -> (B, M, N)."""
    return _BatchedDot.apply(a, b)


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


def _batch_slices(x, widen=2, elements=1 << 18):
    """Slices of x's first dim such that intermediates `widen` times the size of x[slice] have
    about `elements` entries on the CPU and stay in cache; one slice on other devices."""
    per_item = max(1, int(x[:1].numel() * widen))
    step = x.shape[0] if x.device.type != "cpu" else max(1, elements // per_item)
    return [slice(i, i + step) for i in range(0, x.shape[0], step)]


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
        for b in _batch_slices(k):
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
        for b in _batch_slices(k):
            r = _relu_pm(k[b])
            win = _window(r * w[b], ctx.nu)
            grad_u = grad[b] * (win + win.roll(ctx.nu + 1, dims=-1))  # d s / d u
            if grad_w is not None:
                torch.sum(grad_u * r, dim=1, keepdim=True, out=grad_w[b])
            # relu's own backward (grad where r > 0, else 0); much faster than a comparison
            grad_r = torch.ops.aten.threshold_backward(grad_u * w[b], r, 0.0)
            torch.sub(grad_r[..., :d], grad_r[..., d:], out=grad_k[b])
        return grad_k, grad_w, None


# ------------------------------------------------------------------------ random projections


def gram_schmidt(rows):
    """Classical Gram-Schmidt on the rows (m <= d) of a (m, d) tensor: orthonormal rows with
    out[0] = rows[0] / |rows[0]| (§5.3; the example there is sqrt(2) * gram_schmidt(omega[:2]))."""
    _require(rows.shape[0] <= rows.shape[1], f"gram_schmidt: needs m <= d rows, got shape {tuple(rows.shape)}")
    basis = []
    for row in rows:
        v = row
        for e in basis:
            v = v - (row @ e) * e  # classical: coefficients from the original row
        basis.append(v / v.norm())
    return torch.stack(basis)


def orthogonal_projection(m, d, generator=None, device=None, dtype=None, scaling="chi"):
    """Omega (m, d) for orthogonal random features, §5.1: blocks of d orthonormal rows, each the
    Q of the QR of a Gaussian d x d matrix (sign-corrected, so Haar distributed), stacked and cut
    to m rows; blocks are independent. Rows are rescaled to norm sqrt(d) ("sqrt_d", §5.3) or to
    the norms of independent Gaussian d-vectors ("chi"), which makes every row marginally
    N(0, I_d) and so keeps the estimators unbiased."""
    _require(scaling in ("chi", "sqrt_d"), f"orthogonal_projection: scaling must be 'chi' or 'sqrt_d', got {scaling!r}")
    blocks = []
    for _ in range(-(-m // d)):
        q, r = torch.linalg.qr(torch.randn(d, d, generator=generator, device=device, dtype=dtype))
        blocks.append((q * torch.sign(torch.diagonal(r))).T)
    omega = torch.cat(blocks)[:m]
    if scaling == "sqrt_d":
        return omega * math.sqrt(d)
    norms = torch.randn(m, d, generator=generator, device=device, dtype=dtype).norm(dim=1, keepdim=True)
    return omega * norms


_REDRAWS = ("every_call", "every_n_steps", "never")
_EVAL_REDRAWS = ("per_chunk", "once")


class _RandomFeatures(FeatureMap):
    """Shared by favor and trig: the projection Omega (m, d_key) and its redraw policy.

    redraw: "every_call" (the authors: a new Omega at every maybe_redraw(), training and eval),
    "every_n_steps" (on the first maybe_redraw() made in training mode and then on every
    redraw_every-th one; eval-mode calls neither redraw nor count), or "never" (drawn once, at
    construction). An explicit `projection` is used as given and never redrawn; redraw defaults
    to "never" with one and to "every_call" without. Draws use a private generator when `seed`
    is set (one per device), else torch's global RNG, and happen on the buffer's device, in its
    dtype (float32 at least, for the QR).

    eval_redraw (only with redraw="every_call"): "per_chunk", the authors' evaluation (task-spec
    "Feature maps used in Figure 2" and "Quirks": one forward, hence one Omega, per sequence and
    chunk of at most 32 queries; runner.evaluate makes them one forward within
    per_element_draws), or "once", one Omega for the whole evaluation (the suite before issue
    #13; its eval loss is about 4x noisier).
    """

    copies = 1  # d_dot = copies * m

    def __init__(self, d_key, m, orthogonal, redraw, redraw_every, eval_redraw, projection, seed, **params):
        _require(_is_count(m), f"{self.name}: m must be an integer >= 1, got {m!r}")
        _require(_is_count(redraw_every), f"{self.name}: redraw_every must be an integer >= 1, got {redraw_every!r}")
        _require(isinstance(orthogonal, bool), f"{self.name}: orthogonal must be true or false, got {orthogonal!r}")
        _require(seed is None or (isinstance(seed, numbers.Integral) and not isinstance(seed, bool)
                                  and 0 <= seed < 2**63),
                 f"{self.name}: seed must be null or an integer from 0 to 2**63 - 1, got {seed!r}")
        redraw = redraw or ("never" if projection is not None else "every_call")
        _require(redraw in _REDRAWS, f"{self.name}: redraw must be one of {_REDRAWS}, got {redraw!r}")
        _require(eval_redraw in _EVAL_REDRAWS,
                 f"{self.name}: eval_redraw must be one of {_EVAL_REDRAWS}, got {eval_redraw!r}")
        _require(
            projection is None or redraw == "never",
            f"{self.name}: an explicit projection is never redrawn, so redraw must be 'never', got {redraw!r}",
        )
        try:
            given = None if projection is None else torch.as_tensor(projection, dtype=torch.get_default_dtype()).detach()
        except (TypeError, ValueError, RuntimeError) as err:
            raise ConfigError(f"{self.name}: projection must be an (m, d_key) array of numbers ({err})") from None
        # eval_redraw names a run only where it acts (redraw=every_call): runs of fixed maps keep their ids
        all_params = {"m": m, **params, "orthogonal": orthogonal, "redraw": redraw, "redraw_every": redraw_every,
                      **({"eval_redraw": eval_redraw} if redraw == "every_call" else {}), "seed": seed,
                      "projection": None if given is None else given.tolist()}
        super().__init__(d_key, self._copies(params) * m, all_params)
        self.m, self.orthogonal, self.redraw, self.redraw_every, self.seed = m, orthogonal, redraw, redraw_every, seed
        self.eval_redraw = eval_redraw
        self._generators = {}  # device -> torch.Generator, only when seed is set
        self._training_calls = 0
        self._per_element = None  # n within per_element_draws(n)
        if given is None:
            self.register_buffer("projection", torch.empty(m, d_key))
            self._draw()
        else:
            _require(
                given.shape == (m, d_key),
                f"{self.name}: projection must have shape (m, d_key) = ({m}, {d_key}), got {tuple(given.shape)}",
            )
            self.register_buffer("projection", given.clone())

    @property
    def draws_per_chunk(self):
        """Whether evaluation draws a new Omega per (sequence, query chunk)."""
        return self.redraw == "every_call" and self.eval_redraw == "per_chunk"

    @contextlib.contextmanager
    def per_element_draws(self, n):
        """Within it, a redraw draws n projections (n, m, d_key), the i-th for batch element i of
        phi's input (B = n); on exit the projection held before is back."""
        kept, self._per_element = self.projection, n
        try:
            yield
        finally:
            self.projection, self._per_element = kept, None

    def _draw(self, n=None):
        """A new Omega (m, d_key), or n of them (n, m, d_key) drawn one after the other: the
        stream of n single draws."""
        device, dtype = self.projection.device, self.projection.dtype
        if self.seed is not None and str(device) not in self._generators:
            self._generators[str(device)] = torch.Generator(device).manual_seed(self.seed)
        generator = self._generators.get(str(device))
        work = torch.float64 if dtype == torch.float64 else torch.float32

        def one():
            if self.orthogonal:
                return orthogonal_projection(self.m, self.d_key, generator, device, work)
            return torch.randn(self.m, self.d_key, generator=generator, device=device, dtype=work)

        new = one() if n is None else torch.stack([one() for _ in range(n)])
        self.projection = new.to(dtype)  # rebind, not copy_: graphs built earlier keep their Omega

    def use_generator(self, generator: torch.Generator) -> None:
        """Draw later projections from ``generator`` (a run's own stream, so that a run draws
        the same projections alone and in a pack), unless the map has its own ``seed``."""
        if self.seed is None:
            self._generators[str(self.projection.device)] = generator

    def _project(self, x, projection=None):
        """x Omega^T, (..., d_key) -> (..., m); with per-element projections, x is (B, ..., d_key)."""
        projection = self.projection if projection is None else projection
        return x @ projection.to(x.dtype).transpose(-1, -2)

    def maybe_redraw(self):
        if self.redraw == "every_call":
            self._draw(self._per_element)
        elif self.redraw == "every_n_steps" and self.training:
            if self._training_calls % self.redraw_every == 0:
                self._draw()
            self._training_calls += 1

    @classmethod
    def _copies(cls, params):
        return cls.copies

    @classmethod
    def params_for_d_dot(cls, d_dot, d_key, **params):
        copies = cls._copies(params)
        m = _count(d_dot / copies) if _count(d_dot) else None
        if m is None:
            rule = "m" if copies == 1 else f"{copies}*m"
            raise InfeasibleError(f"{cls.name} cannot reach d_dot={d_dot}: d_dot must be {rule} for an integer m >= 1")
        return {**_derive(cls.name, params, "m", m, d_dot), "d_key": d_key}


_VARIANTS = ("positive", "hyperbolic")


class Favor(_RandomFeatures):
    """FAVOR+ positive random features, §4.2 and §5.4 (orthogonal Omega by default, §5.1):

        positive:   phi(x) = exp(Omega x - |x|^2/2) / sqrt(m)                                d_dot = m
        hyperbolic: phi(x) = [exp(Omega x - |x|^2/2), exp(-Omega x - |x|^2/2)] / sqrt(2m)   d_dot = 2m

    Both are unbiased for exp(x^T y) (Lemma 1, §4.1); "hyperbolic" is the authors' two-sided
    form (task-spec). x is first multiplied by input_scale: 1.0 as the authors (phi estimates
    exp(q^T k)) or "performer" = d_key^(-1/4) (phi estimates exp(q^T k / sqrt(d_key))).

    stabilize=True subtracts a (detached) max c from the exponent, i.e. multiplies phi by the
    positive constant exp(-c): a query by its own max over the features (c_q); keys by their
    max over the last two dims, the sequence and features of one batch element (c_k, shared by
    all its keys; keys must be (..., seq, d_key)). This cancels exactly under attention
    normalisation W phi(q) / (z^T phi(q)) (c_q and c_k both divide out) and under sum
    normalisation phi / sum(phi) of the vector concerned (c_q for the query; c_k for keys
    normalised one by one, as in the delta rule). It does NOT cancel where a raw phi enters
    without such a division: raw keys in the sum rule without attention normalisation (output
    scaled by exp(-c_k)) or in the fwm rule (the state update changes); a raw query under fwm's
    LayerNorm cancels only up to its eps.
    """

    name, positive = "favor", True

    def __init__(self, d_key, m=64, variant="positive", orthogonal=True, redraw=None, redraw_every=1000,
                 eval_redraw="per_chunk", input_scale=1.0, stabilize=False, projection=None, seed=None):
        _require(variant in _VARIANTS, f"favor: variant must be one of {_VARIANTS}, got {variant!r}")
        _require(
            input_scale == "performer" or (isinstance(input_scale, (int, float)) and not isinstance(input_scale, bool)
                                           and math.isfinite(input_scale) and input_scale > 0),
            f"favor: input_scale must be a finite number > 0 or 'performer', got {input_scale!r}",
        )
        _require(isinstance(stabilize, bool), f"favor: stabilize must be true or false, got {stabilize!r}")
        super().__init__(d_key, m, orthogonal, redraw, redraw_every, eval_redraw, projection, seed,
                         variant=variant, input_scale=input_scale, stabilize=stabilize)
        self.variant, self.stabilize = variant, stabilize
        self.scale = d_key**-0.25 if input_scale == "performer" else float(input_scale)

    @classmethod
    def _copies(cls, params):
        return 2 if params.get("variant") == "hyperbolic" else 1

    def forward(self, x, is_query=False):
        return _exp(self._logits(x, is_query)) / math.sqrt(self.d_dot)

    def _logits(self, x, is_query, projection=None):
        x = x * self.scale
        wx = self._project(x, projection)
        if self.variant == "hyperbolic":
            wx = torch.cat([wx, -wx], dim=-1)
        logits = wx - (x * x).sum(-1, keepdim=True) / 2
        if self.stabilize:
            dims = (-1,) if is_query or x.dim() < 2 else (-2, -1)
            logits = logits - logits.amax(dim=dims, keepdim=True).detach()
        return logits

    def scores(self, k, q, normalise=False, eps=1e-6, key_eps=0.0):
        """The default's numbers, with the key features built, used and differentiated one
        batch slice at a time (_FavorKeyScores): B x L x d_dot floats are tens of MB at large
        n_keys and m, and one pass each over them costs more than the exps."""
        if normalise:
            return super().scores(k, q, normalise, eps, key_eps)
        return _FavorKeyScores.apply(k, self(q, is_query=True), self)


def _exp(x):
    """torch.exp(x), but also fast on the CPU where x has entries below -87: float32's vector
    exp kernel takes a 15-50x slower path for results that underflow to subnormals or 0, which
    is where unscaled FAVOR+ logits mostly lie at large n_keys (task-spec quirks). There it is
    computed as exp(x / 2)^2 (_UnderflowExp): within 2 ulp of exp(x), and 0 where exp(x) is."""
    if x.device.type != "cpu" or x.dtype != torch.float32 or x.numel() == 0:
        return torch.exp(x)
    with torch.no_grad():
        fast = bool(x.amin() > -87.0)
    return torch.exp(x) if fast else _UnderflowExp.apply(x)


class _UnderflowExp(torch.autograd.Function):
    """exp(x) as exp(x / 2)^2: exp(x / 2) stays on the fast path down to x = -174, and below
    that the float32 result is 0 anyway (it is for any x < -104), so clamping there is exact."""

    @staticmethod
    def forward(ctx, x):
        out = x.mul(0.5).clamp_(min=-87.0).exp_().square_()
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, grad):
        (out,) = ctx.saved_tensors
        return grad * out  # as torch.exp's


class _FavorKeyScores(torch.autograd.Function):
    """fq @ phi(k)^T for FAVOR+ keys k (B, L, d_key) and query features fq (B, Q, d_dot), the
    key features exp(logits) / sqrt(d_dot) made one batch slice at a time (in cache on the CPU)
    and kept, in slices, for the backward. The projection is the one of the forward pass (per
    batch element within per_element_draws)."""

    @staticmethod
    def forward(ctx, k, fq, phi):
        projection, c = phi.projection, 1 / math.sqrt(phi.d_dot)
        slices = _batch_slices(k, phi.d_dot / phi.d_key)
        out = k.new_empty(k.shape[0], fq.shape[1], k.shape[1])
        exps = []
        for b in slices:
            e = _exp(phi._logits(k[b], False, _slice_projection(projection, b)))
            torch.matmul(fq[b], e.transpose(-1, -2), out=out[b])
            if any(ctx.needs_input_grad):
                exps.append(e)
        ctx.save_for_backward(k, fq, projection)
        ctx.phi, ctx.slices, ctx.exps = phi, slices, exps
        return out.mul_(c)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        k, fq, projection = ctx.saved_tensors
        phi, m = ctx.phi, projection.shape[-2]
        grad = grad / math.sqrt(phi.d_dot)
        grad_k, grad_fq = torch.empty_like(k), torch.empty_like(fq)
        for b, e in zip(ctx.slices, ctx.exps):
            torch.matmul(grad[b], e, out=grad_fq[b])
            grad_t = grad[b].transpose(-1, -2)
            g = grad_t * fq[b] if fq.shape[1] == 1 else grad_t @ fq[b]
            g_logits = g.mul_(e)  # exp' = exp; a stabilising max is detached
            g_wx = g_logits[..., :m] - g_logits[..., m:] if phi.variant == "hyperbolic" else g_logits
            x = k[b] * phi.scale  # logits = x Omega^T (+-) - |x|^2 / 2
            omega = _slice_projection(projection, b).to(x.dtype)
            g_x = torch.addcmul(g_wx @ omega, g_logits.sum(-1, keepdim=True), x, value=-1.0)
            torch.mul(g_x, phi.scale, out=grad_k[b])
        return grad_k, grad_fq, None


def _slice_projection(projection, b):
    """The projection of batch elements b: the one (m, d_key), or per-element ones (n, m, d_key)[b]."""
    return projection[b] if projection.dim() == 3 else projection


class Trig(_RandomFeatures):
    """Trigonometric random features, §3.4: phi(x) = exp(|x|^2/2) / sqrt(m) [sin(Omega x),
    cos(Omega x)], d_dot = 2m. Unbiased for exp(x^T y), but not positive and high-variance (§3.5)."""

    name, copies = "trig", 2

    def __init__(self, d_key, m=64, orthogonal=True, redraw=None, redraw_every=1000, eval_redraw="per_chunk",
                 projection=None, seed=None):
        super().__init__(d_key, m, orthogonal, redraw, redraw_every, eval_redraw, projection, seed)

    def forward(self, x, is_query=False):
        wx = self._project(x)
        scale = torch.exp((x * x).sum(-1, keepdim=True) / 2) / math.sqrt(self.m)
        return scale * torch.cat([torch.sin(wx), torch.cos(wx)], dim=-1)


# ------------------------------------------------------------------------------------ registry

FEATURE_MAPS = {}
ENTRY_POINTS = "kernelzoo.feature_maps"  # where installed packages register their own maps


def register(cls):
    """Class decorator: add a FeatureMap subclass to the registry under its ``name``. The
    built-in maps, the wider zoo (zoo.py) and a user's own maps all register this way; a user's
    package makes its module (or class) an entry point of the group ``kernelzoo.feature_maps``
    so that kernelzoo imports it when a config names a map it does not know."""
    _require(isinstance(cls, type) and issubclass(cls, FeatureMap) and cls.name,
             f"register: {cls!r} is not a FeatureMap subclass with a name")
    _require(FEATURE_MAPS.get(cls.name, cls) is cls,
             f"register: feature map {cls.name!r} is already registered by {FEATURE_MAPS.get(cls.name)}")
    FEATURE_MAPS[cls.name] = cls
    return cls


def _load_entry_points():
    """Import every entry point of ENTRY_POINTS (a FeatureMap class is registered; a module
    registers its own maps with @register on import)."""
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINTS):
        try:
            loaded = ep.load()
        except Exception as err:
            raise ConfigError(f"feature map plugin {ep.name!r} ({ep.value}) failed to import: "
                              f"{type(err).__name__}: {err}") from None
        if isinstance(loaded, type) and issubclass(loaded, FeatureMap):
            register(loaded)


def _lookup(name, params):
    """The class registered as `name`, after checking that it takes every parameter in params."""
    if name not in FEATURE_MAPS:
        _load_entry_points()
    _require(name in FEATURE_MAPS, f"unknown feature map {name!r}; valid: {', '.join(FEATURE_MAPS)}")
    cls = FEATURE_MAPS[name]
    valid = [p for p in inspect.signature(cls.__init__).parameters if p not in ("self", "d_key")]
    for p in params:
        _require(p in valid, f"{name}: unknown parameter {p!r}; valid: {', '.join(valid) or '(none)'}")
    return cls


def resolve_params(name, d_key, d_dot, **params):
    """Constructor kwargs (including d_key) with which FEATURE_MAPS[name] has this d_dot: nu for
    dpfp, m for favor and trig, d_key itself for the elementwise maps and taylor. A sizing
    parameter given explicitly must agree with d_dot (else ConfigError); None means not given."""
    params = {k: v for k, v in params.items() if v is not None}
    cls = _lookup(name, params)
    _require(_is_count(d_key), f"{name}: d_key must be an integer >= 1, got {d_key!r}")
    return cls.params_for_d_dot(d_dot, d_key, **params)


def build_feature_map(name, *, d_key, d_dot=None, **params):
    """FEATURE_MAPS[name](d_key=d_key, **params); with d_dot, the sizing parameter is resolved
    from it first (resolve_params). A parameter given as None takes its default."""
    params = {k: v for k, v in params.items() if v is not None}
    if d_dot is None:
        return _lookup(name, params)(d_key=d_key, **params)
    return FEATURE_MAPS[name](**resolve_params(name, d_key, d_dot, **params))


for _cls in (Softmax, Identity, Relu, Elu, Tanh, DPFP, Favor, Trig, Taylor):
    register(_cls)
from . import zoo  # noqa: E402,F401  the wider zoo registers itself
