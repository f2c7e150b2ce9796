"""Feature maps phi for linear attention: phi(q)^T phi(k) replaces exp(q^T k / sqrt(d_key)).

Every map is an nn.Module that declares its own output width `d_dot`, the capacity of the
memory it feeds (reference §2.2: at most d_dot non-interfering associations). References to
"§" are to the reference document (The Kernel Zoo); "task-spec" is the authors' protocol.

    phi = catalog.build_feature_map("dpfp", d_key=64, nu=2)        # phi.d_dot == 256
    phi = catalog.build_feature_map("favor", d_key=64, d_dot=128)  # m from d_dot: m == 128
    phi.maybe_redraw()                                     # once per model forward
    k, q = phi(keys), phi(query, is_query=True)            # (..., d_key) -> (..., d_dot)
    s = phi.scores(keys, query)                            # (B, Q, L): phi(q_j) . phi(k_l)

`scores` is what the sum rule reads; DPFP and FAVOR+ compute it without materialising all the
features at once (same numbers; their fast paths are in dpfp.py and random_features.py).

This module holds the base class, the helpers the maps share, the registry and the
deterministic maps (softmax, the elementwise maps, taylor); DPFP is in dpfp.py, the random maps
(favor, trig) are in random_features.py and the wider zoo in zoo.py. Those modules import this
one; it imports none of them. ``catalog.py`` imports them all, registers the built-in maps and
builds a map by name (``catalog.build_feature_map``). This module knows no config system:
parameters are plain values.
"""

import math
import numbers

import torch
from torch import nn


class ConfigError(ValueError):
    """Invalid feature-map parameters (unknown name, out-of-range value, unknown parameter)."""


class InfeasibleError(ValueError):
    """A requested d_dot that the map cannot reach with the given d_key and parameters."""


def require(ok, message):
    if not ok:
        raise ConfigError(message)


def is_count(value):
    """True for an integer (not a bool) >= 1."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 1


def as_count(value):
    """`value` as an int if it is a whole number >= 1 (e.g. 128 or 128.0), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return int(value) if value == int(value) and value >= 1 else None


# --------------------------------------------------------------------------------- base class


class FeatureMap(nn.Module):
    """phi: (..., d_key) -> (..., d_dot). Subclasses set `name`, `positive` and implement forward.

    How a map is named is declared here too: ``label`` (its name in figures and reports; the
    analysis builds a configuration's label from ``label_of``), ``sizing_param`` (the parameter
    ``params_for_d_dot`` resolves from d_dot) and ``run_id_params`` (the parameters a run id
    shows, ``run_id_shows``)."""

    name = ""
    label = ""  # the map's name in figures and reports, e.g. "ELU+1"; ``name`` when empty
    sizing_param = None  # the parameter that sets d_dot, e.g. "nu"; None: d_dot sets d_key
    run_id_params = ()  # the parameters a run id shows, in this order
    positive = False  # all outputs >= 0 by construction
    is_softmax = False  # True only for the exact-softmax baseline

    def __init__(self, d_key, d_dot, params):
        super().__init__()
        require(is_count(d_key), f"{self.name}: d_key must be an integer >= 1, got {d_key!r}")
        self.d_key, self.d_dot = d_key, d_dot
        self._params = params

    @property
    def params(self):
        """Constructor parameters except d_key, as plain Python values (for logging)."""
        return dict(self._params)

    @classmethod
    def label_of(cls, params):
        """(The head of the label of a configuration of this map with ``params``, the
        parameters that head shows). The analysis adds the sizing parameter and the parameters
        that tell the map's configurations apart as ``k=v``, those shown here aside."""
        return cls.label or cls.name, ()

    @classmethod
    def run_id_shows(cls, params):
        """The parameters of ``params`` that a run id shows: ``run_id_params`` that are set."""
        return {k: params[k] for k in cls.run_id_params if params.get(k) is not None}

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
        """The number of independent features of queries (``query_rank_of``)."""
        return self.query_rank_of(self.d_key, self.d_dot, self._params)

    @classmethod
    def query_rank_of(cls, d_key, d_dot, params):
        """The number of independent features a query reads: the rank of the read-out, whatever
        the state's width. d_dot unless a map treats queries differently (cosformer's query
        position uses half of its features); the analysis' rank bound reads it here."""
        return d_dot

    draws_per_chunk = False  # True: evaluation draws a projection per query chunk (random maps)
    # the names of methods a compiled training step runs eagerly (a graph break; the rest of the
    # step compiles): those whose Python loops, traced, would unroll (``pack.Pack.compile``)
    eager: tuple[str, ...] = ()

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
    label = "softmax"
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


class Elementwise(FeatureMap):
    """phi(x) = fn(x) elementwise, so d_dot = d_key; reaching a d_dot means setting d_key = d_dot."""

    fn = None

    def __init__(self, d_key):
        super().__init__(d_key, d_key, {})

    def forward(self, x, is_query=False):
        return self.fn(x)

    @classmethod
    def params_for_d_dot(cls, d_dot, d_key, **params):
        if as_count(d_dot) is None:
            raise InfeasibleError(f"{cls.name} cannot reach d_dot={d_dot}: d_dot = d_key must be an integer >= 1")
        return {**params, "d_key": as_count(d_dot)}


class Identity(Elementwise):
    """phi(x) = x: the plain fast weight programmer of §1.3."""

    name = "identity"
    label = "identity"
    fn = staticmethod(lambda x: x)


class Relu(Elementwise):
    """phi(x) = max(0, x)."""

    name, positive = "relu", True
    label = "ReLU"
    fn = staticmethod(torch.relu)


class Elu(Elementwise):
    """phi(x) = elu(x) + 1 ("Linear" in Figure 2; the running example of the introduction).
    Eager steps take _EluPlusOne; a compiled step (trainer.compile) takes the plain
    ``F.elu(x) + 1``, which the compiler differentiates itself: compiled on cuda, the custom
    Function's gradient is wrong (``scripts/gpu_check.sh`` compares compiled with eager steps
    for every map)."""

    name, positive = "elu", True
    label = "ELU+1"
    fn = staticmethod(lambda x: nn.functional.elu(x) + 1 if torch.compiler.is_compiling()
                      else _EluPlusOne.apply(x))


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


class Tanh(Elementwise):
    """phi(x) = tanh(x) (paired with the fwm update rule in Figure 3)."""

    name = "tanh"
    label = "tanh"
    fn = staticmethod(torch.tanh)


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
    label = "Taylor"

    def __init__(self, d_key):
        super().__init__(d_key, _taylor_d_dot(d_key), {})

    def forward(self, x, is_query=False):
        d = self.d_key
        i, j = torch.triu_indices(d, d, device=x.device)  # row by row: (0, 0), (0, 1), ...
        scale = x.new_full(i.shape, 1 / math.sqrt(d)).masked_fill_(i == j, 1 / math.sqrt(2 * d))
        return torch.cat([torch.ones_like(x[..., :1]), x / d**0.25, x[..., i] * x[..., j] * scale], dim=-1)

    @classmethod
    def params_for_d_dot(cls, d_dot, d_key, **params):
        n = as_count(d_dot)
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


def derive(name, params, key, value, d_dot):
    """params with params[key] = value; an explicitly given, different value is a ConfigError."""
    require(
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


SLICE_ELEMENTS = 1 << 18  # batch_slices: entries of an intermediate of one slice (the CPU's cache)
SLICE_WIDTHS: list | None = None  # set to a list, batch_slices appends each call's row width


def batch_slices(x, widen=2, elements=None):
    """Slices of x's first dim such that intermediates `widen` times the size of x[slice] have
    about `elements` (default SLICE_ELEMENTS, read at the call) entries on the CPU and stay in
    cache; one slice on other devices. ``footprint.map_costs`` measures a map with 0 (every
    batch element a slice of its own) and SLICE_WIDTHS a list, which gets the width of those
    intermediates per row of x[0] (x[0, 0].numel() * widen)."""
    elements = SLICE_ELEMENTS if elements is None else elements
    if SLICE_WIDTHS is not None:
        SLICE_WIDTHS.append(x[:1, :1].numel() * widen)
    per_item = max(1, int(x[:1].numel() * widen))
    step = x.shape[0] if x.device.type != "cpu" else max(1, elements // per_item)
    return [slice(i, i + step) for i in range(0, x.shape[0], step)]


# ------------------------------------------------------------------------------------ registry

FEATURE_MAPS = {}
ENTRY_POINTS = "kernelzoo.feature_maps"  # where installed packages register their own maps
OLD_ENTRY_POINTS = "kernelzoo.maps.base"  # its former name (a module path), still read


def register(cls):
    """Class decorator: add a FeatureMap subclass to the registry under its ``name``. The
    catalog registers the built-in maps this way, and a user's own maps register themselves; a
    user's package makes its module (or class) an entry point of the group
    ``kernelzoo.feature_maps`` so that the catalog imports it when a config names a map it does
    not know."""
    require(isinstance(cls, type) and issubclass(cls, FeatureMap) and cls.name,
             f"register: {cls!r} is not a FeatureMap subclass with a name")
    require(FEATURE_MAPS.get(cls.name, cls) is cls,
             f"register: feature map {cls.name!r} is already registered by {FEATURE_MAPS.get(cls.name)}")
    FEATURE_MAPS[cls.name] = cls
    return cls
