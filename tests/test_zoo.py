"""The wider zoo (kernelzoo.maps.zoo): each map's formula and kernel on worked inputs, d_dot
resolution, gradients reaching learned parameters, and the degeneracies their docstrings state.
Shapes, positivity and the rank of the features are checked for every registered map in
test_feature_maps.py."""

from __future__ import annotations

import math
import re

import pytest
import torch

from kernelzoo.maps.catalog import (FEATURE_MAPS, ConfigError, InfeasibleError, build_feature_map,
                               resolve_params)
from kernelzoo.core.model import RetrievalModel, retrieval_loss
from kernelzoo.maps.zoo import _max_sketch, quadratic_features

X = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
Y = torch.tensor([0.5, 1.0, -1.0], dtype=torch.float64)


def kernel(phi, x, y):
    return float((phi(x[None]).squeeze() @ phi(y[None], is_query=True).squeeze()).detach())


def test_quadratic_features_give_the_squared_dot_product():
    assert quadratic_features(X).shape == (6,)
    assert float(quadratic_features(X) @ quadratic_features(Y)) == pytest.approx(float(X @ Y) ** 2)


def test_elementwise_maps():
    assert build_feature_map("squared_relu", d_key=3)(X).tolist() == [1.0, 0.0, 0.25]
    assert build_feature_map("sigmoid", d_key=3)(X).tolist() == pytest.approx(
        [1 / (1 + math.exp(-v)) for v in X.tolist()])


def test_hedgehog_is_one_softmax_over_plus_and_minus_identity_at_init():
    phi = build_feature_map("hedgehog", d_key=3).double()
    expected = torch.softmax(torch.cat([X, -X]), dim=0)
    torch.testing.assert_close(phi(X), expected)
    assert float(phi(X).sum().detach()) == pytest.approx(1.0) and phi.d_dot == 6


def test_t2r_is_relu_of_its_affine_map():
    phi = build_feature_map("t2r", d_key=3, m=4).double()
    with torch.no_grad():
        phi.linear.weight.copy_(torch.arange(12.0).reshape(4, 3) / 10 - 0.5)
        phi.linear.bias.fill_(0.1)
    expected = torch.relu(phi.linear.weight @ X + 0.1)
    torch.testing.assert_close(phi(X), expected)
    assert (phi.d_dot, phi.params) == (4, {"m": 4})


def test_rebased_kernel_is_the_square_of_its_normalised_dot_product():
    phi = build_feature_map("rebased", d_key=3).double()
    with torch.no_grad():
        phi.gamma.copy_(torch.tensor([1.0, 2.0, 0.5]))
        phi.beta.copy_(torch.tensor([0.1, -0.2, 0.3]))

    def u(v):
        n = (v - v.mean()) / torch.sqrt(v.var(unbiased=False) + 1e-5)
        return phi.gamma.detach() * n + phi.beta.detach()

    assert kernel(phi, X, Y) == pytest.approx(float(u(X) @ u(Y)) ** 2)
    assert (phi.d_dot, phi.width) == (5, 6)


def test_rebased_starts_degenerate_and_its_learned_parameters_lift_the_rank():
    """At gamma = 1, beta = 0 the features span d(d-1)/2 dimensions; moved parameters reach
    d_dot = d(d+1)/2 - 1 (the docstring's claim, measured)."""
    d, rng = 5, torch.Generator().manual_seed(3)
    phi = build_feature_map("rebased", d_key=d).double()
    # inputs of unit scale: the normalisation's eps (1e-5) loosens the tie by ~eps / variance
    x = 3 * torch.randn(200, d, dtype=torch.float64, generator=rng)
    assert torch.linalg.matrix_rank(phi(x), rtol=1e-6) == d * (d - 1) // 2
    with torch.no_grad():
        phi.gamma.add_(0.3 * torch.randn(d, dtype=torch.float64, generator=rng))
        phi.beta.add_(0.3 * torch.randn(d, dtype=torch.float64, generator=rng))
    assert torch.linalg.matrix_rank(phi(x), rtol=1e-6) == phi.d_dot == d * (d + 1) // 2 - 1


@pytest.mark.parametrize("degree", [2, 4])
def test_polysketch_kernel_is_the_square_of_its_sketch_dot_product(degree):
    phi = build_feature_map("polysketch", d_key=3, r=2, degree=degree).double()
    g = phi.projections.detach()

    def sketch(v):
        return torch.stack([g[p] @ v for p in range(degree // 2)]).prod(dim=0) / math.sqrt(2)

    assert kernel(phi, X, Y) == pytest.approx(float(sketch(X) @ sketch(Y)) ** 2)
    assert kernel(phi, X, Y) >= 0 and phi.d_dot == 3


def test_polysketch_width_is_capped_by_independent_products():
    assert [_max_sketch(d, 4) for d in (2, 3, 4, 16)] == [2, 5, 7, 87]
    assert [_max_sketch(d, 2) for d in (2, 3, 16)] == [2, 3, 16]
    with pytest.raises(ConfigError, match="r=6 > 5"):
        build_feature_map("polysketch", d_key=3, r=6)
    with pytest.raises(ConfigError, match="degree must be 2 or 4"):
        build_feature_map("polysketch", d_key=3, degree=3)


def test_cosformer_weights_keys_by_position_and_reads_at_the_end():
    """Keys at positions 1..L of M = L, the query at M: phi(q) . phi(k_j) =
    relu(q) . relu(k_j) cos(pi (M - j) / 2M) = relu(q) . relu(k_j) sin(pi j / 2L)."""
    phi = build_feature_map("cosformer", d_key=3).double()
    keys = torch.stack([X, Y, X + Y, -X])  # L = 4
    scores = phi(keys) @ phi(Y[None], is_query=True).squeeze()
    for j in range(4):
        expected = float(torch.relu(Y) @ torch.relu(keys[j])) * math.cos(math.pi * (4 - (j + 1)) / 8)
        assert float(scores[j]) == pytest.approx(expected, abs=1e-12)
    assert phi(Y[None], is_query=True)[0, :3].abs().sum() == 0  # the cos half is silent
    assert (phi.d_dot, phi.query_rank) == (6, 3)


LEARNED = [("hedgehog", {}, "weight"), ("t2r", {"m": 5}, "linear.weight"),
           ("rebased", {}, "beta"), ("polysketch", {"r": 3}, "projections")]


@pytest.mark.parametrize("name, params, weight", LEARNED, ids=[c[0] for c in LEARNED])
def test_learned_parameters_train_with_the_model(name, params, weight):
    """The map's parameters are model parameters and receive gradients through the loss."""
    torch.manual_seed(0)
    phi = build_feature_map(name, d_key=4, **params)
    model = RetrievalModel(6, phi)
    assert any(p is dict(phi.named_parameters())[weight] for p in model.parameters())
    keys = torch.stack([torch.randperm(6) for _ in range(3)])
    values = torch.stack([torch.randperm(6) for _ in range(3)])
    y = model(keys, values, keys[:, :1])
    retrieval_loss(y, values[:, :1]).mean().backward()
    grad = dict(phi.named_parameters())[weight].grad
    assert grad is not None and grad.abs().sum() > 0


RESOLVE = [("squared_relu", 8, 16, {}, {"d_key": 16}), ("sigmoid", 8, 5, {}, {"d_key": 5}),
           ("hedgehog", 8, 64, {}, {"d_key": 32}), ("t2r", 16, 64, {}, {"d_key": 16, "m": 64}),
           ("rebased", 8, 65, {}, {"d_key": 11}), ("cosformer", 8, 128, {}, {"d_key": 64}),
           ("polysketch", 16, 66, {}, {"d_key": 16, "r": 11}),
           ("polysketch", 16, 136, {"degree": 2}, {"d_key": 16, "r": 16, "degree": 2})]


@pytest.mark.parametrize("name, d_key, d_dot, params, expected", RESOLVE)
def test_d_dot_resolution(name, d_key, d_dot, params, expected):
    resolved = resolve_params(name, d_key, d_dot, **params)
    assert resolved == expected
    assert build_feature_map(name, **resolved).d_dot == d_dot


@pytest.mark.parametrize("name, d_key, d_dot, message", [
    ("hedgehog", 8, 63, "even"), ("cosformer", 8, 7, "even"), ("rebased", 8, 64, "5, 9, 14"),
    ("polysketch", 16, 64, "r(r+1)/2"), ("polysketch", 3, 21, "r=6 > 5"),
    ("t2r", 8, 2.5, "integer")])
def test_unreachable_d_dot(name, d_key, d_dot, message):
    with pytest.raises(InfeasibleError, match=re.escape(message)):
        resolve_params(name, d_key, d_dot)


def test_the_zoo_is_registered():
    assert {"squared_relu", "sigmoid", "hedgehog", "t2r", "rebased", "polysketch",
            "cosformer"} <= set(FEATURE_MAPS)
