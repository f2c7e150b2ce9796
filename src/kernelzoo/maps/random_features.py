"""Random-feature maps: FAVOR+ positive random features (reference §4.1-4.2, §5.4) and
trigonometric random features (§3.4-3.5), with their orthogonal projections (§5.1, §5.3).

Random maps (favor, trig) hold their projection Omega (m, d_key) as a buffer; `maybe_redraw`
applies the redraw policy, and the caller must apply phi to keys AND queries between two calls
so that both share one Omega. Within `per_element_draws(n)` (evaluation, see runner.evaluate)
a redraw draws n projections at once, (n, m, d_key), one per batch element of phi's input.
``catalog.py`` registers both maps.
"""

import contextlib
import math
import numbers

import torch
from torch.autograd.function import once_differentiable

from kernelzoo.maps.base import (ConfigError, FeatureMap, InfeasibleError, as_count, batch_slices, derive,
                           is_count, require)


def gram_schmidt(rows):
    """Classical Gram-Schmidt on the rows (m <= d) of a (m, d) tensor: orthonormal rows with
    out[0] = rows[0] / |rows[0]| (§5.3; the example there is sqrt(2) * gram_schmidt(omega[:2]))."""
    require(rows.shape[0] <= rows.shape[1], f"gram_schmidt: needs m <= d rows, got shape {tuple(rows.shape)}")
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
    require(scaling in ("chi", "sqrt_d"), f"orthogonal_projection: scaling must be 'chi' or 'sqrt_d', got {scaling!r}")
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
    """Shared by favor and trig: the projection Omega (m, d_key) and its redraw policy; m sets
    d_dot (``params_for_d_dot``) and is shown in run ids.

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
    per_element_draws), or "once", one Omega for the whole evaluation (fewer draws average
    into the eval loss, so it is noisier).
    """

    copies = 1  # d_dot = copies * m
    sizing_param, run_id_params = "m", ("m",)

    def __init__(self, d_key, m, orthogonal, redraw, redraw_every, eval_redraw, projection, seed, **params):
        require(is_count(m), f"{self.name}: m must be an integer >= 1, got {m!r}")
        require(is_count(redraw_every), f"{self.name}: redraw_every must be an integer >= 1, got {redraw_every!r}")
        require(isinstance(orthogonal, bool), f"{self.name}: orthogonal must be true or false, got {orthogonal!r}")
        require(seed is None or (isinstance(seed, numbers.Integral) and not isinstance(seed, bool)
                                  and 0 <= seed < 2**63),
                 f"{self.name}: seed must be null or an integer from 0 to 2**63 - 1, got {seed!r}")
        redraw = redraw or ("never" if projection is not None else "every_call")
        require(redraw in _REDRAWS, f"{self.name}: redraw must be one of {_REDRAWS}, got {redraw!r}")
        require(eval_redraw in _EVAL_REDRAWS,
                 f"{self.name}: eval_redraw must be one of {_EVAL_REDRAWS}, got {eval_redraw!r}")
        require(
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
            require(
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

    def get_extra_state(self):
        """What the state dict holds beyond the projection (a run's checkpoint, ``checkpoint.py``):
        the training calls counted for redraw=every_n_steps and the generators' states."""
        return {"training_calls": self._training_calls,
                "generators": {device: g.get_state() for device, g in self._generators.items()}}

    def set_extra_state(self, state):
        self._training_calls = state["training_calls"]
        for device, value in state["generators"].items():
            self._generators.setdefault(device, torch.Generator(device)).set_state(value.cpu())

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
        m = as_count(d_dot / copies) if as_count(d_dot) else None
        if m is None:
            rule = "m" if copies == 1 else f"{copies}*m"
            raise InfeasibleError(f"{cls.name} cannot reach d_dot={d_dot}: d_dot must be {rule} for an integer m >= 1")
        return {**derive(cls.name, params, "m", m, d_dot), "d_key": d_key}


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
    label, run_id_params = "FAVOR+", ("m", "variant")

    def __init__(self, d_key, m=64, variant="positive", orthogonal=True, redraw=None, redraw_every=1000,
                 eval_redraw="per_chunk", input_scale=1.0, stabilize=False, projection=None, seed=None):
        require(variant in _VARIANTS, f"favor: variant must be one of {_VARIANTS}, got {variant!r}")
        require(
            input_scale == "performer" or (isinstance(input_scale, (int, float)) and not isinstance(input_scale, bool)
                                           and math.isfinite(input_scale) and input_scale > 0),
            f"favor: input_scale must be a finite number > 0 or 'performer', got {input_scale!r}",
        )
        require(isinstance(stabilize, bool), f"favor: stabilize must be true or false, got {stabilize!r}")
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
        return self.key_scores(k, self(q, is_query=True))

    eager = ("key_scores",)  # traced, its loop over batch slices unrolls, again per n_keys

    def key_scores(self, k, fq):
        """_FavorKeyScores of keys ``k`` against query features ``fq``; eager inside a
        compiled step (``eager``)."""
        return _FavorKeyScores.apply(k, fq, self)


def _exp(x):
    """torch.exp(x), but also fast on the CPU where x has entries below -87: float32's vector
    exp kernel takes a much slower path for results that underflow to subnormals or 0, which
    is where unscaled FAVOR+ logits mostly lie at large n_keys (task-spec quirks). There it is
    computed as exp(x / 2)^2 (_UnderflowExp): within 2 ulp of exp(x), and 0 where exp(x) is.
    A compiled step (trainer.compile) takes that form always: the test on x would break its graph."""
    if x.device.type != "cpu" or x.dtype != torch.float32 or x.numel() == 0:
        return torch.exp(x)
    if torch.compiler.is_compiling():
        return _UnderflowExp.apply(x)
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
        slices = batch_slices(k, phi.d_dot / phi.d_key)
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
        # the key features are held by ctx, not saved tensors, which autograd frees after the
        # backward: released here, or they stay with the graph for as long as its output lives
        # (the trainer keeps a step's losses through the next forward and an evaluation)
        ctx.exps = None
        return grad_k, grad_fq, None


def _slice_projection(projection, b):
    """The projection of batch elements b: the one (m, d_key), or per-element ones (n, m, d_key)[b]."""
    return projection[b] if projection.dim() == 3 else projection


class Trig(_RandomFeatures):
    """Trigonometric random features, §3.4: phi(x) = exp(|x|^2/2) / sqrt(m) [sin(Omega x),
    cos(Omega x)], d_dot = 2m. Unbiased for exp(x^T y), but not positive and high-variance (§3.5)."""

    name, copies = "trig", 2
    label = "trig"

    def __init__(self, d_key, m=64, orthogonal=True, redraw=None, redraw_every=1000, eval_redraw="per_chunk",
                 projection=None, seed=None):
        super().__init__(d_key, m, orthogonal, redraw, redraw_every, eval_redraw, projection, seed)

    def forward(self, x, is_query=False):
        wx = self._project(x)
        scale = torch.exp((x * x).sum(-1, keepdim=True) / 2) / math.sqrt(self.m)
        return scale * torch.cat([torch.sin(wx), torch.cos(wx)], dim=-1)
