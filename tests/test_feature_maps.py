"""Tests for the built-in maps (kernelzoo.maps.base, dpfp and random_features): golden numbers
from the reference document (§), then statistical and structural properties. Statistical tests
are float64 with fixed seeds."""

import inspect
import json
import math
import subprocess
import sys

import pytest
import torch

from kernelzoo.maps.catalog import FEATURE_MAPS, ConfigError, InfeasibleError, build_feature_map, resolve_params
from kernelzoo.maps.base import FeatureMap
from kernelzoo.maps.random_features import gram_schmidt, orthogonal_projection
from kernelzoo.maps.zoo import _max_sketch

# The running example (introduction): rows are q_1..q_4, k_1..k_4, v_1..v_4.
Q = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [2.0, 0.0]])
K = torch.tensor([[0.0, 1.0], [1.0, 0.0], [1.0, 1.0], [0.0, 2.0]])
V = Q.clone()
OMEGA = torch.tensor([[0.5, -0.3], [-0.8, 1.2], [0.1, 0.7], [-0.4, -0.9]])  # §4.3


# ------------------------------------------------------------------ golden numbers (reference)


def test_elu_running_example():
    phi = build_feature_map("elu", d_key=2)
    assert torch.equal(phi(Q), torch.tensor([[2.0, 1], [1, 2], [2, 2], [3, 1]]))
    assert torch.equal(phi(K), torch.tensor([[1.0, 2], [2, 1], [2, 2], [1, 3]]))


def test_dpfp1_examples_6_5_and_6_6():
    phi = build_feature_map("dpfp", d_key=2)
    assert phi.d_dot == 4
    out = phi(K)
    for i in (0, 1, 3):  # k_1, k_2, k_4 have no two consecutive positive entries in [k, -k]
        assert torch.equal(out[i], torch.zeros(4))
    assert torch.equal(out[2], torch.tensor([1.0, 0, 0, 0]))
    k_a, k_b = phi(torch.tensor([1.5, -0.8])), phi(torch.tensor([-0.5, 1.2]))
    torch.testing.assert_close(k_a, torch.tensor([0.0, 0, 0, 1.2]))
    torch.testing.assert_close(k_b, torch.tensor([0.0, 0.6, 0, 0]))
    assert k_a @ k_b == 0  # orthogonal although k_A . k_B = -1.71


def test_dpfp_matches_the_formula_of_6_3():
    d, nu = 4, 3  # the largest nu < d_key; shifts wrap around mod 2 d_key
    x = torch.randn(5, d, generator=torch.Generator().manual_seed(0))
    out = build_feature_map("dpfp", d_key=d, nu=nu)(x)
    r = torch.relu(torch.cat([x, -x], -1))
    for s in range(1, nu + 1):
        for i in range(2 * d):
            torch.testing.assert_close(out[:, (s - 1) * 2 * d + i], r[:, i] * r[:, (i + s) % (2 * d)])


def test_favor_positive_example_4_3():
    phi = build_feature_map("favor", d_key=2, m=4, projection=OMEGA)
    q1, k1, k2 = phi(Q[0]), phi(K[0]), phi(K[1])
    torch.testing.assert_close(q1, torch.tensor([0.500, 0.136, 0.335, 0.203]), atol=1e-3, rtol=0)
    # k1[1] = exp(0.7) / 2 = 1.0069; the document's 1.008 multiplies by the rounded exp(-0.5) = 0.607.
    torch.testing.assert_close(k1, torch.tensor([0.225, 1.008, 0.611, 0.123]), atol=1.5e-3, rtol=0)
    assert (q1 @ k1).item() == pytest.approx(0.480, abs=1e-3)
    # The document sums four products each rounded to 3 decimals: 0.421; the exact value is 0.4223.
    assert (q1 @ k2).item() == pytest.approx(0.421, abs=2e-3)


def test_gram_schmidt_example_5_3():
    omega_ort = math.sqrt(2) * gram_schmidt(OMEGA[:2])
    torch.testing.assert_close(omega_ort, torch.tensor([[1.212, -0.728], [0.728, 1.212]]), atol=2e-3, rtol=0)
    phi = build_feature_map("favor", d_key=2, m=2, projection=omega_ort)
    torch.testing.assert_close(phi(Q[0]), torch.tensor([1.442, 0.889]), atol=2e-3, rtol=0)


def test_gram_schmidt_is_classical_and_orthonormal():
    rows = torch.randn(4, 6, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    e = gram_schmidt(rows)
    torch.testing.assert_close(e @ e.T, torch.eye(4, dtype=torch.float64))
    torch.testing.assert_close(e[0], rows[0] / rows[0].norm())
    torch.testing.assert_close(torch.linalg.matrix_rank(torch.cat([rows[:2], e[:2]])), torch.tensor(2))
    with pytest.raises(ConfigError):
        gram_schmidt(torch.randn(3, 2))


def test_trig_single_draw_3_5():
    phi = build_feature_map("trig", d_key=2, m=1, projection=OMEGA[:1])
    estimate = (phi(Q[0]) @ phi(K[3])).item()
    # sin a sin b + cos a cos b = cos(a - b): the estimate is exp(0.5 + 2) cos(0.5 + 0.6) = 5.526.
    # The document prints 5.516 because it rounds exp(2) cos(0.6) = 6.098 down to 6.089.
    assert estimate == pytest.approx(math.exp(2.5) * math.cos(1.1), abs=1e-5)
    assert estimate == pytest.approx(5.526, abs=2e-3)
    assert estimate == pytest.approx(5.516, abs=1.5e-2)


def test_taylor_is_exactly_the_second_order_expansion():
    d = 5
    g = torch.Generator().manual_seed(2)
    q, k = torch.randn(7, d, generator=g, dtype=torch.float64), torch.randn(7, d, generator=g, dtype=torch.float64)
    phi = build_feature_map("taylor", d_key=d)
    assert phi.d_dot == 1 + d + d * (d + 1) // 2 and not phi.positive
    t = (q * k).sum(-1)
    torch.testing.assert_close((phi(q) * phi(k)).sum(-1), 1 + t / math.sqrt(d) + t**2 / (2 * d))

    def full(x):  # [1, x / d^(1/4), vec(x x^T) / sqrt(2d)]: the same kernel in 1 + d + d^2 features
        outer = (x.unsqueeze(-1) * x.unsqueeze(-2)).flatten(-2) / math.sqrt(2 * d)
        return torch.cat([torch.ones_like(x[..., :1]), x / d**0.25, outer], dim=-1)

    torch.testing.assert_close(phi(q) @ phi(k).T, full(q) @ full(k).T, rtol=1e-12, atol=1e-12)


def test_favor_hyperbolic_and_input_scale_follow_their_formulas():
    x = torch.randn(3, 2, generator=torch.Generator().manual_seed(3))
    hyp = build_feature_map("favor", d_key=2, m=4, variant="hyperbolic", projection=OMEGA)
    wx, half = x @ OMEGA.T, (x * x).sum(-1, keepdim=True) / 2
    torch.testing.assert_close(hyp(x), torch.cat([torch.exp(wx - half), torch.exp(-wx - half)], -1) / math.sqrt(8))
    performer = build_feature_map("favor", d_key=2, m=4, input_scale="performer", projection=OMEGA)
    explicit = build_feature_map("favor", d_key=2, m=4, input_scale=2**-0.25, projection=OMEGA)
    torch.testing.assert_close(performer(x), explicit(x))


# ------------------------------------------------------------------------ memory-level examples


def test_capacity_orthonormal_keys_retrieve_exactly_and_one_more_key_interferes():
    d = 8
    keys = torch.linalg.qr(torch.randn(d, d, generator=torch.Generator().manual_seed(4), dtype=torch.float64))[0].T
    phi = build_feature_map("identity", d_key=d)
    values = torch.eye(d, dtype=torch.float64)  # one-hot v_i
    W = values.T @ phi(keys)  # sum_i v_i phi(k_i)^T, (d_v, d_dot)
    torch.testing.assert_close(phi(keys) @ W.T, values)  # W phi(k_i) == v_i for every i
    extra = torch.randn(1, d, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    keys9, values9 = torch.cat([keys, extra / extra.norm()]), torch.eye(d + 1, dtype=torch.float64)
    W9 = values9.T @ phi(keys9)
    assert (phi(keys9) @ W9.T - values9).abs().max() > 0.1  # d_dot + 1 keys cannot be orthonormal


def test_crosstalk_example_2_3():
    phi = build_feature_map("elu", d_key=2)
    S2 = phi(K[:2]).T @ V[:2]  # phi(k_1) v_1^T + phi(k_2) v_2^T
    retrieved = S2.T @ phi(K[0])
    assert torch.equal(retrieved, torch.tensor([5.0, 4.0]))
    z = phi(K[:2]).sum(0)
    torch.testing.assert_close(retrieved / (z @ phi(K[0])), torch.tensor([0.556, 0.444]), atol=1e-3, rtol=0)


def test_sum_normalisation_example_7_3():
    phi = build_feature_map("elu", d_key=2)
    q, k = phi(Q[0]), phi(K[0])
    assert (q / q.sum()) @ (k / k.sum()) == pytest.approx(4 / 9)


# ---------------------------------------------------------------------- statistical properties


@pytest.mark.parametrize(
    "name, params",
    [
        ("favor", dict(variant="positive", orthogonal=True)),
        ("favor", dict(variant="positive", orthogonal=False)),
        ("favor", dict(variant="hyperbolic")),
        ("trig", dict()),
    ],
)
def test_random_features_are_unbiased_for_exp_dot(name, params):
    d, draws = 4, 2000
    g = torch.Generator().manual_seed(6)
    x, y = torch.randn(3, d, generator=g, dtype=torch.float64), torch.randn(3, d, generator=g, dtype=torch.float64)
    x, y = 0.5 * x / x.norm(dim=1, keepdim=True), 0.5 * y / y.norm(dim=1, keepdim=True)
    y[2] = -x[2]  # anti-aligned: x + y = 0, so favor's estimate is exact (zero variance)
    phi = build_feature_map(name, d_key=d, m=d, seed=7, **params).double()
    estimates = []
    for _ in range(draws):
        phi.maybe_redraw()
        estimates.append((phi(x) * phi(y)).sum(-1))
    estimates = torch.stack(estimates)
    standard_error = estimates.std(0) / math.sqrt(draws)
    assert ((estimates.mean(0) - torch.exp((x * y).sum(-1))).abs() < 4 * standard_error + 1e-12).all()


def test_orthogonal_favor_has_lower_mse_than_iid_theorem_2():
    d = m = 16
    draws, r = 1500, 0.5
    x = torch.randn(16, d, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    x = r * x / x.norm(dim=1, keepdim=True)  # pairs (x, x): x.y = r^2, SM = exp(r^2)
    sm = torch.exp((x * x).sum(-1))
    mse, se = {}, {}
    for orthogonal in (True, False):
        phi = build_feature_map("favor", d_key=d, m=m, orthogonal=orthogonal, seed=9).double()
        errors = []
        for _ in range(draws):
            phi.maybe_redraw()
            errors.append((((phi(x) * phi(x)).sum(-1) - sm) ** 2).mean())
        errors = torch.stack(errors)
        mse[orthogonal], se[orthogonal] = errors.mean().item(), errors.std().item() / math.sqrt(draws)
    se_diff = math.hypot(se[True], se[False])
    assert mse[False] - mse[True] > 3 * se_diff
    # Theorem 2 (§5.2): the gain is at least 2(m-1)/(m(d+2)) (SM - exp(-(|x|^2+|y|^2)/2))^2.
    bound = 2 * (m - 1) / (m * (d + 2)) * (math.exp(r**2) - math.exp(-(r**2))) ** 2
    assert mse[False] - mse[True] > bound - 3 * se_diff
    # iid MSE (Lemma 2 of the Performers paper) is exp(|x+y|^2) SM^2 (1 - exp(-|x+y|^2)) / m; §4.4
    # prints |x-y| in the last factor, a typo (it would make the MSE 0 for x = y).
    lemma2 = math.exp(4 * r**2) * math.exp(2 * r**2) * (1 - math.exp(-4 * r**2)) / m
    assert mse[False] == pytest.approx(lemma2, abs=4 * se[False])


def test_orthogonal_projection_rows():
    g = torch.Generator().manual_seed(10)
    omega = orthogonal_projection(10, 4, generator=g, dtype=torch.float64, scaling="sqrt_d")
    assert omega.shape == (10, 4)
    torch.testing.assert_close(omega.norm(dim=1), torch.full((10,), 2.0, dtype=torch.float64))
    for block in (omega[:4], omega[4:8]):  # full blocks are orthogonal: Omega Omega^T = d I
        torch.testing.assert_close(block @ block.T, 4 * torch.eye(4, dtype=torch.float64))
    chi = orthogonal_projection(4, 4, generator=g, dtype=torch.float64)
    directions = chi / chi.norm(dim=1, keepdim=True)
    torch.testing.assert_close(directions @ directions.T, torch.eye(4, dtype=torch.float64))
    assert chi.norm(dim=1).std() > 0  # chi norms vary from row to row
    with pytest.raises(ConfigError):
        orthogonal_projection(4, 4, scaling="unit")


# ------------------------------------------------------------------------ structural properties

SHAPE_CASES = [
    ("softmax", 5, {}),
    ("identity", 5, {}),
    ("relu", 3, {}),
    ("elu", 7, {}),
    ("tanh", 4, {}),
    ("dpfp", 3, {}),
    ("dpfp", 5, {"nu": 4}),
    ("dpfp", 6, {"nu": 2}),
    ("favor", 5, {}),
    ("favor", 5, {"m": 12}),
    ("favor", 3, {"m": 7, "variant": "hyperbolic", "orthogonal": False}),
    ("trig", 5, {"m": 3}),
    ("trig", 2, {"m": 9}),
    ("taylor", 3, {}),
    ("taylor", 6, {}),
    ("squared_relu", 4, {}),
    ("sigmoid", 3, {}),
    ("hedgehog", 5, {}),
    ("t2r", 4, {}),
    ("t2r", 3, {"m": 7}),
    ("rebased", 4, {}),
    ("polysketch", 4, {}),
    ("polysketch", 3, {"r": 2, "degree": 2}),
    ("cosformer", 5, {}),
]
EXPECTED_D_DOT = [math.inf, 5, 3, 7, 4, 6, 40, 24, 64, 12, 14, 6, 18, 10, 28,
                  4, 3, 10, 4, 7, 9, 10, 3, 10]
POSITIVE = {"relu", "elu", "dpfp", "favor", "squared_relu", "sigmoid", "hedgehog", "t2r",
            "cosformer"}


def test_every_registered_map_is_covered():
    assert set(FEATURE_MAPS) == {name for name, _, _ in SHAPE_CASES}
    assert all(issubclass(cls, FeatureMap) and cls.name == name for name, cls in FEATURE_MAPS.items())


def test_each_map_declares_its_label_sizing_and_run_id_parameters():
    """How a map is named lives on its class: a label, the parameter params_for_d_dot resolves
    (shown in run ids), the run id's parameters among the map's own."""
    for name, cls in FEATURE_MAPS.items():
        takes = set(inspect.signature(cls.__init__).parameters) - {"self", "d_key"}
        assert cls.label and set(cls.run_id_params) <= takes, name
        if cls.sizing_param is not None:
            assert cls.sizing_param in cls.run_id_params, name
            d_dot = build_feature_map(name, d_key=16).d_dot
            assert cls.sizing_param in resolve_params(name, 16, d_dot), name
    assert FEATURE_MAPS["elu"].label_of({}) == ("ELU+1", ())
    assert FEATURE_MAPS["dpfp"].label_of({"nu": 2}) == ("DPFP-2", ("nu",))
    assert FEATURE_MAPS["favor"].run_id_shows({"m": 64, "variant": "positive", "seed": None}) \
        == {"m": 64, "variant": "positive"}
    assert FEATURE_MAPS["dpfp"].run_id_shows({"nu": None}) == {}


def test_the_maps_import_the_base_and_the_base_imports_no_map():
    """feature_maps (base class, helpers, registry) is imported by the maps and by the catalog,
    and imports none of them: alone it registers nothing; the catalog registers the built-ins
    in the order of the "valid:" lists."""
    code = ("import sys, kernelzoo.maps.base as f; "
            "print(sorted(m for m in sys.modules if m.startswith('kernelzoo')), len(f.FEATURE_MAPS))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["['kernelzoo',", "'kernelzoo.maps',", "'kernelzoo.maps.base']", "0"]
    assert list(FEATURE_MAPS)[:9] == ["softmax", "identity", "relu", "elu", "tanh", "dpfp", "favor",
                                      "trig", "taylor"]


@pytest.mark.parametrize("case, d_dot", list(zip(SHAPE_CASES, EXPECTED_D_DOT)), ids=[c[0] for c in SHAPE_CASES])
def test_declared_d_dot_shape_and_positivity(case, d_dot):
    name, d_key, params = case
    phi = build_feature_map(name, d_key=d_key, **params)
    assert isinstance(phi, torch.nn.Module) and phi.name == name and phi.d_key == d_key
    assert phi.d_dot == d_dot and phi.is_softmax == (name == "softmax") and phi.positive == (name in POSITIVE)
    x = 2 * torch.randn(2, 3, d_key, generator=torch.Generator().manual_seed(11))
    phi.maybe_redraw()
    out_keys, out_query = phi(x), phi(x[:, -1], is_query=True)
    width = d_key if phi.is_softmax else phi.width
    assert out_keys.shape == (2, 3, width) and out_query.shape == (2, width)
    if phi.positive:
        assert (out_keys >= 0).all() and (out_query >= 0).all()
    elif name not in ("softmax", "identity"):
        assert (out_keys < 0).any()  # positive=False is not a false alarm
    assert json.loads(json.dumps(phi.params)) == phi.params  # plain python values
    assert build_feature_map(name, d_key=d_key, **phi.params).params == phi.params


def test_softmax_is_the_identity_with_infinite_d_dot():
    phi = build_feature_map("softmax", d_key=2)
    assert phi(Q) is Q and phi.d_dot == math.inf and phi.is_softmax


def _projections_after_calls(phi, calls):
    """For each maybe_redraw() call: whether the projection changed."""
    changed = []
    for _ in range(calls):
        before = phi.projection.clone()
        phi.maybe_redraw()
        changed.append(not torch.equal(before, phi.projection))
    return changed


@pytest.mark.parametrize("name", ["favor", "trig"])
def test_redraw_policies(name):
    assert all(_projections_after_calls(build_feature_map(name, d_key=3, m=3, seed=0), 4))  # every_call
    never = build_feature_map(name, d_key=3, m=3, redraw="never", seed=0)
    assert not any(_projections_after_calls(never, 4) + _projections_after_calls(never.eval(), 2))
    periodic = build_feature_map(name, d_key=3, m=3, redraw="every_n_steps", redraw_every=3, seed=0)
    assert not any(_projections_after_calls(periodic.eval(), 2))  # eval calls neither redraw nor count
    assert _projections_after_calls(periodic.train(), 7) == [True, False, False, True, False, False, True]
    fixed = build_feature_map(name, d_key=2, m=4, projection=OMEGA)
    assert not any(_projections_after_calls(fixed, 3)) and torch.equal(fixed.projection, OMEGA)


@pytest.mark.parametrize("name", ["favor", "trig"])
def test_only_every_call_with_per_chunk_draws_per_chunk(name):
    assert build_feature_map(name, d_key=3, m=3).draws_per_chunk  # the defaults: the authors'
    assert not build_feature_map(name, d_key=3, m=3, eval_redraw="once").draws_per_chunk
    for redraw in ("never", "every_n_steps"):
        assert not build_feature_map(name, d_key=3, m=3, redraw=redraw).draws_per_chunk
    assert not build_feature_map("elu", d_key=3).draws_per_chunk


@pytest.mark.parametrize("name, params", [("favor", {"variant": "hyperbolic"}), ("trig", {})])
def test_per_element_draws_give_each_batch_element_its_own_projection(name, params):
    """Within per_element_draws(n) one redraw draws what n redraws would, element i of the
    input sees the i-th, and scores and their gradients are those of n separate maps."""
    phi, twin = (build_feature_map(name, d_key=3, m=4, seed=5, **params).double() for _ in range(2))
    kept = phi.projection
    g = torch.Generator().manual_seed(12)
    k = torch.randn(3, 5, 3, generator=g, dtype=torch.float64, requires_grad=True)
    q = torch.randn(3, 2, 3, generator=g, dtype=torch.float64)
    with phi.per_element_draws(3):
        phi.maybe_redraw()
        drawn = phi.projection
        scores = phi.scores(k, q)
        (grad,) = torch.autograd.grad(scores.square().sum(), k)
    assert phi.projection is kept and drawn.shape == (3, 4, 3)  # kept is back on exit
    for i in range(3):
        twin.maybe_redraw()
        assert torch.equal(twin.projection, drawn[i])
        k_i = k[i:i + 1].detach().requires_grad_()
        expected = twin.scores(k_i, q[i:i + 1])
        torch.testing.assert_close(scores[i:i + 1], expected, rtol=1e-12, atol=0)
        (expected_grad,) = torch.autograd.grad(expected.square().sum(), k_i)
        torch.testing.assert_close(grad[i:i + 1], expected_grad, rtol=1e-12, atol=1e-15)


def test_seeded_draws_are_reproducible_and_follow_the_buffer_dtype():
    a, b = (build_feature_map("favor", d_key=4, m=6, seed=3) for _ in range(2))
    for _ in range(3):
        a.maybe_redraw(), b.maybe_redraw()
    assert torch.equal(a.projection, b.projection)
    assert not torch.equal(a.projection, build_feature_map("favor", d_key=4, m=6, seed=4).projection)
    a.double().maybe_redraw()
    assert a.projection.dtype == torch.float64 and a.projection.shape == (6, 4)


def test_redraw_does_not_break_a_pending_backward():
    phi = build_feature_map("favor", d_key=3, m=4)
    x = torch.randn(2, 3, requires_grad=True)
    loss = phi(x).sum()
    phi.maybe_redraw()  # e.g. a second forward before this backward
    loss.backward()
    assert x.grad is not None


@pytest.mark.parametrize("variant", ["positive", "hyperbolic"])
def test_favor_stabilize_cancels_under_both_normalisations_and_avoids_underflow(variant):
    g = torch.Generator().manual_seed(12)
    shapes = [(2, 6, 4), (2, 4), (2, 6, 3)]  # keys (batch, seq, d_key), query, values
    keys, query, values = (torch.randn(*shape, generator=g, dtype=torch.float64) for shape in shapes)

    def outputs(phi, keys, query):
        k, q, values_ = phi(keys), phi(query, is_query=True), values.to(keys.dtype)
        attention = torch.einsum("bld,blv,bd->bv", k, values_, q) / torch.einsum("bld,bd->b", k, q)[:, None]
        k_sum, q_sum = k / k.sum(-1, keepdim=True), q / q.sum(-1, keepdim=True)
        return attention, torch.einsum("bld,blv,bd->bv", k_sum, values_, q_sum)

    common = dict(d_key=4, m=8, variant=variant, redraw="never", seed=13)
    plain = build_feature_map("favor", **common).double()
    stable = build_feature_map("favor", stabilize=True, **common).double()
    for a, b in zip(outputs(plain, keys, query), outputs(stable, keys, query)):
        torch.testing.assert_close(a, b)
    big_keys, big_query = 30 * keys, 30 * query  # |x|^2 / 2 ~ 2000: every exp underflows in float32
    plain, stable = plain.float(), stable.float()
    assert (plain(big_query.float(), is_query=True) == 0).all() and (plain(big_keys.float()) == 0).all()
    reference = outputs(stable.double(), big_keys, big_query)[0]
    assert reference.isfinite().all()
    result = outputs(stable.float(), big_keys.float(), big_query.float())[0]
    torch.testing.assert_close(result.double(), reference, atol=1e-4, rtol=1e-3)


# ------------------------------------------------------------------ declared d_dot is the rank

# Sizes per map at each d_key (a map not named here is checked with its defaults): every valid
# nu of dpfp; favor one- and two-sided, with m = 1 and m = d_key + 1 (two orthogonal blocks),
# iid, and stabilised (its queries then scaled by their own max); trig likewise.
RANK_PARAMS = {
    "dpfp": lambda d: [{"nu": nu} for nu in range(1, d)],
    "favor": lambda d: [{"m": 1}, {"m": d + 1}, {"m": d + 1, "variant": "hyperbolic"},
                        {"m": 2, "orthogonal": False},
                        {"m": d, "variant": "hyperbolic", "stabilize": True, "input_scale": "performer"}],
    "trig": lambda d: [{"m": 1}, {"m": d + 1}, {"m": 2, "orthogonal": False}],
    "t2r": lambda d: [{"m": 1}, {"m": d + 2}],
    "polysketch": lambda d: [{"r": 1}, {"r": d, "degree": 2}, {"r": _max_sketch(d, 4)}],
}
RANK_CASES = [
    (name, d_key, params)
    for name, cls in FEATURE_MAPS.items() if not cls.is_softmax  # softmax: d_dot = inf, phi = identity
    for d_key in (2, 3, 4, 6) if not (name == "rebased" and d_key < 3)
    for params in RANK_PARAMS.get(name, lambda d: [{}])(d_key)
]
RANK_IDS = ["-".join([name, f"d_key={d_key}", *(f"{k}={v}" for k, v in params.items())])
            for name, d_key, params in RANK_CASES]
# A singular value below RANK_RTOL times the largest counts as zero. Measured over these cases
# (float64, standard normal inputs, 4 d_dot rows): the d_dot-th is >= 1.7e-3 times the largest
# (least for rebased at d_key 4; 8e-3 for two-sided favor at d_key 2, m 3), while the features a
# declaration would overcount give <= 1.5e-7: the repeated x_i x_j of a full vec(x x^T) and dpfp
# shifts >= d_key 3e-16, rebased's direction tied by its layer normalisation 1e-11 to 1.5e-7
# (not 0: the normalisation's eps 1e-5 loosens the tie).
RANK_RTOL = 1e-6


@pytest.mark.parametrize("name, d_key, params", RANK_CASES, ids=RANK_IDS)
def test_declared_d_dot_is_the_rank_of_the_features(name, d_key, params):
    """d_dot is the capacity of the memory (§2.2) only if the features span d_dot dimensions:
    phi(X) for 4 d_dot random keys must have rank exactly d_dot, and as queries its declared
    query_rank (d_dot but for cosformer). Learned maps are checked at perturbed parameters (the
    rank they can reach: rebased starts lower, see test_zoo)."""
    with torch.random.fork_rng():  # a random map draws its projection from the global RNG
        torch.manual_seed(14)
        phi = build_feature_map(name, d_key=d_key, **params).double()
        with torch.no_grad():  # learned maps: generic parameters, not their initial point
            for w in phi.parameters():
                w.add_(0.1 * torch.randn_like(w))
    assert math.isfinite(phi.d_dot)
    x = torch.randn(4 * phi.d_dot, d_key, generator=torch.Generator().manual_seed(14), dtype=torch.float64)
    for is_query, rank in ((False, phi.d_dot), (True, phi.query_rank)):
        features = phi(x, is_query=is_query)
        assert features.shape == (4 * phi.d_dot, phi.width)
        assert torch.linalg.matrix_rank(features, rtol=RANK_RTOL) == rank, f"is_query={is_query}"


# ---------------------------------------------------------------------------- d_dot resolution

ROUND_TRIPS = [
    ("softmax", 8, math.inf, {}, {"d_key": 8}),
    ("identity", 8, 16, {}, {"d_key": 16}),
    ("relu", 8, 16, {}, {"d_key": 16}),
    ("elu", 64, 64, {}, {"d_key": 64}),
    ("tanh", 8, 5, {}, {"d_key": 5}),
    ("dpfp", 64, 256, {}, {"d_key": 64, "nu": 2}),
    ("dpfp", 8, 48, {}, {"d_key": 8, "nu": 3}),
    ("favor", 8, 32, {}, {"d_key": 8, "m": 32}),
    ("favor", 8, 32, {"variant": "hyperbolic"}, {"d_key": 8, "m": 16, "variant": "hyperbolic"}),
    ("trig", 8, 32, {"seed": 1}, {"d_key": 8, "m": 16, "seed": 1}),
    ("taylor", 8, 15, {}, {"d_key": 4}),
]


@pytest.mark.parametrize("name, d_key, d_dot, params, expected", ROUND_TRIPS, ids=[r[0] for r in ROUND_TRIPS])
def test_resolve_params_round_trips(name, d_key, d_dot, params, expected):
    assert resolve_params(name, d_key, d_dot, **params) == expected
    assert build_feature_map(name, d_key=d_key, d_dot=d_dot, **params).d_dot == d_dot


INFEASIBLE = [
    ("dpfp", 64, 100, {}),
    ("dpfp", 2, 16, {}),  # would need nu = 4 >= d_key
    ("dpfp", 4, 32, {}),  # would need nu = d_key: shift d_key pairs x with -x
    ("softmax", 64, 128, {}),
    ("favor", 8, 33, {"variant": "hyperbolic"}),
    ("favor", 8, 0, {}),
    ("trig", 8, 31, {}),
    ("taylor", 8, 20, {}),
    ("taylor", 8, 13, {}),  # 1 + d + d^2 for d = 3: the full vec(x x^T) counts x_i x_j twice
    ("elu", 8, 12.5, {}),
]


@pytest.mark.parametrize("name, d_key, d_dot, params", INFEASIBLE, ids=[f"{c[0]}-{c[2]}" for c in INFEASIBLE])
def test_unreachable_d_dot_is_infeasible(name, d_key, d_dot, params):
    with pytest.raises(InfeasibleError) as error:
        build_feature_map(name, d_key=d_key, d_dot=d_dot, **params)
    assert name in str(error.value) and str(d_dot) in str(error.value)


def test_dpfp_infeasible_message_lists_reachable_values():
    with pytest.raises(InfeasibleError, match=r"dpfp cannot reach d_dot=100 with d_key=64: .*128, 256, \.\.\., 8064"):
        resolve_params("dpfp", 64, 100)
    with pytest.raises(InfeasibleError, match=r"d_dot=32 with d_key=4: nu=4 >= d_key=4 repeats or zeroes .*8, 16, 24$"):
        resolve_params("dpfp", 4, 32)


CONFIG_ERRORS = [
    ("nope", dict(d_key=4), r"'nope'.*softmax, identity, relu, elu, tanh, dpfp, favor, trig, taylor"),
    ("dpfp", dict(d_key=4, nu=0), r"nu .*\[1, 3\].* 0"),
    ("dpfp", dict(d_key=4, nu=4), r"nu=4 >= d_key=4 repeats or zeroes features \(shift d_key pairs x with -x.*\[1, 3"),
    ("dpfp", dict(d_key=1), r"d_key must be >= 2 .*got 1"),
    ("dpfp", dict(d_key=4, nu=1.5), r"nu"),
    ("favor", dict(d_key=4, m=0), r"m must be .* 0"),
    ("trig", dict(d_key=4, m=0), r"m must be .* 0"),
    ("elu", dict(d_key=0), r"d_key .* 0"),
    ("elu", dict(d_key=4.0), r"d_key .* 4.0"),
    ("favor", dict(d_key=4, m=True), r"m must be .* True"),
    ("favor", dict(d_key=0), r"d_key .* 0"),
    ("dpfp", dict(d_key=4, m=3), r"unknown parameter 'm'.*nu"),
    ("elu", dict(d_key=4, nu=1), r"unknown parameter 'nu'"),
    ("trig", dict(d_key=4, variant="positive"), r"unknown parameter 'variant'.*m, orthogonal"),
    ("favor", dict(d_key=4, variant="cosh"), r"variant .*'cosh'"),
    ("favor", dict(d_key=4, redraw="sometimes"), r"redraw .*'sometimes'"),
    ("favor", dict(d_key=4, redraw="every_n_steps", redraw_every=0), r"redraw_every"),
    ("favor", dict(d_key=4, eval_redraw="per_sequence"),
     r"^favor: eval_redraw must be one of \('per_chunk', 'once'\), got 'per_sequence'$"),
    ("trig", dict(d_key=4, eval_redraw="always"), r"^trig: eval_redraw must be one of .*'once'\), got 'always'$"),
    ("favor", dict(d_key=4, input_scale="huge"), r"input_scale"),
    ("favor", dict(d_key=2, m=3, projection=OMEGA), r"shape .*\(3, 2\).*\(4, 2\)"),
    ("favor", dict(d_key=2, m=4, projection=OMEGA, redraw="every_call"), r"never"),
    ("dpfp", dict(d_key=64, d_dot=128, nu=2), r"nu=2 contradicts d_dot=128"),
    ("favor", dict(d_key=64, d_dot=128, m=64), r"m=64 contradicts d_dot=128"),
]


@pytest.mark.parametrize("name, kwargs, message", CONFIG_ERRORS)
def test_config_errors(name, kwargs, message):
    with pytest.raises(ConfigError, match=message):
        build_feature_map(name, **kwargs)


def test_none_means_default_and_errors_are_value_errors():
    assert build_feature_map("dpfp", d_key=64, d_dot=256, nu=None).params == {"nu": 2}
    assert resolve_params("favor", 8, 16, m=None, seed=None) == {"d_key": 8, "m": 16}
    assert issubclass(ConfigError, ValueError) and issubclass(InfeasibleError, ValueError)
