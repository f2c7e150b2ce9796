"""Tests for kernelzoo.core.memory: the worked examples, the fast paths against the literal recurrence
(``read_reference``), fwm, delta-rule properties and the softmax baseline.

``KERNELZOO_TEST_DEVICE=cuda`` runs the fast-path-against-reference test on that device
(``scripts/gpu_check.sh`` does); everything else stays on the CPU."""

import os

import pytest
import torch
import torch.nn.functional as F

from kernelzoo.core import memory
from kernelzoo.core.rules import fwm
from kernelzoo.core.rules.base import recurrent_state
from kernelzoo.core.memory import NORMALISATIONS, read, read_reference, softmax_read

DEVICE = torch.device(os.environ.get("KERNELZOO_TEST_DEVICE", "cpu"))
RULES_FAST = ("sum", "delta")
# (B, L, Q, D, d_v, chunk_size): L not a multiple of the chunk, L < chunk, Q = 1 and Q > 1,
# D > d_v and D < d_v, B = 1 and B > 1. (1, 10, 50, 4, 3) makes the sum rule materialise W,
# the others take the scores path.
SHAPES = [
    (2, 37, 3, 8, 5, 16),
    (1, 10, 50, 4, 3, 64),
    (3, 130, 1, 6, 12, 32),
    (2, 64, 2, 16, 16, 64),
]


def _inputs(B, L, Q, D, d_v, dtype, seed=0, device="cpu"):
    """Positive features with |phi(k)|^2 ~ 1, so the raw-key delta rule stays contractive."""
    g = torch.Generator().manual_seed(seed)
    phi_k = F.softplus(torch.randn(B, L, D, generator=g, dtype=dtype)) / D**0.5
    v = torch.randn(B, L, d_v, generator=g, dtype=dtype)
    phi_q = F.softplus(torch.randn(B, Q, D, generator=g, dtype=dtype)) / D**0.5
    beta = torch.sigmoid(torch.randn(B, L, generator=g, dtype=dtype))
    return [x.to(device).requires_grad_() for x in (phi_k, v, phi_q, beta)]


def _y_and_grads(fn, inputs, w, **kw):
    y = fn(*inputs[:3], beta=inputs[3], **kw)
    grads = torch.autograd.grad((y * w).sum(), inputs, allow_unused=True)
    return [y] + [g for g in grads if g is not None]


# --- worked examples from the reference document ------------------------------------------

K14 = torch.tensor([[0.0, 1.0], [1.0, 0.0], [1.0, 1.0], [0.0, 2.0]])
V14 = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [2.0, 0.0]])
Q14 = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [2.0, 0.0]])


@pytest.mark.parametrize("fn", [read, read_reference])
def test_fast_weight_trace_section_1_4(fn):
    kw = dict(update_rule="sum", normalisation="none")
    # y^(i) = W^(i) q_i: write the first i pairs, read q_i.
    for i, expected in [(1, [0.0, 0.0]), (2, [1.0, 0.0]), (3, [3.0, 3.0]), (4, [2.0, 4.0])]:
        y = fn(K14[None, :i], V14[None, :i], Q14[None, i - 1 : i], **kw)
        torch.testing.assert_close(y[0, 0], torch.tensor(expected))
    # W^(4) read column by column with the identity queries: y[j] = W e_j.
    W4 = fn(K14[None], V14[None], torch.eye(2)[None], **kw)[0].T
    torch.testing.assert_close(W4, torch.tensor([[1.0, 6.0], [2.0, 1.0]]))


@pytest.mark.parametrize("fn", [read, read_reference])
def test_crosstalk_section_2_3(fn):
    phi_k = torch.tensor([[[1.0, 2.0], [2.0, 1.0]]])  # phi_elu(k1), phi_elu(k2)
    v = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]])
    phi_q = phi_k[:, :1]
    y = fn(phi_k, v, phi_q, update_rule="sum", normalisation="none")
    torch.testing.assert_close(y[0, 0], torch.tensor([5.0, 4.0]))
    y = fn(phi_k, v, phi_q, update_rule="sum", normalisation="attention", eps=1e-9)
    torch.testing.assert_close(y[0, 0], torch.tensor([5 / 9, 4 / 9]))
    assert y[0, 0].round(decimals=3).tolist() == pytest.approx([0.556, 0.444])


# --- fast paths equal the literal recurrence ----------------------------------------------

# float32: rtol 1e-5 and atol 1e-5 * max|reference| per tensor (observed error ~1e-6 of scale).
TOLERANCES = {torch.float32: 1e-5, torch.float64: 1e-10}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("normalisation", NORMALISATIONS)
@pytest.mark.parametrize("update_rule", RULES_FAST)
def test_read_matches_reference(update_rule, normalisation, dtype):
    tol = TOLERANCES[dtype]
    for B, L, Q, D, d_v, chunk in SHAPES:
        inputs = _inputs(B, L, Q, D, d_v, dtype, device=DEVICE)
        w = torch.randn(B, Q, d_v, dtype=dtype, generator=torch.Generator().manual_seed(1)).to(DEVICE)
        kw = dict(update_rule=update_rule, normalisation=normalisation)
        fast = _y_and_grads(read, inputs, w, chunk_size=chunk, **kw)
        ref = _y_and_grads(read_reference, inputs, w, **kw)
        assert len(fast) == len(ref) == (5 if update_rule == "delta" else 4)
        for a, b in zip(fast, ref):
            assert a.dtype == dtype and a.device.type == DEVICE.type
            torch.testing.assert_close(a, b, rtol=tol, atol=tol * b.abs().max().item())


@pytest.mark.parametrize("update_rule", RULES_FAST)
def test_zero_key_sum_normalisation_nan_or_key_eps(update_rule):
    phi_k, v, phi_q, beta = (x.detach() for x in _inputs(2, 20, 3, 6, 4, torch.float64))
    phi_k[0, 7] = 0.0
    kw = dict(update_rule=update_rule, normalisation="sum", beta=beta)
    # Faithful default key_eps = 0: 0/0 poisons the memory of that sequence in both paths.
    for y in (read(phi_k, v, phi_q, chunk_size=8, **kw), read_reference(phi_k, v, phi_q, **kw)):
        assert y[0].isnan().all() and y[1].isfinite().all()
    fast = read(phi_k, v, phi_q, chunk_size=8, key_eps=1e-6, **kw)
    ref = read_reference(phi_k, v, phi_q, key_eps=1e-6, **kw)
    assert fast.isfinite().all()
    torch.testing.assert_close(fast, ref, rtol=1e-10, atol=1e-12)


# --- fwm -------------------------------------------------------------------------------------


def _fwm_by_hand(phi_k, v, phi_q, beta):
    """The task-spec fwm rule for one sequence, written out independently."""
    W = torch.zeros(v.shape[1], phi_k.shape[1], dtype=phi_k.dtype)
    for l in range(phi_k.shape[0]):
        W = W + beta[l] * torch.outer(v[l] - W @ phi_k[l], phi_k[l])
        if l >= 1:
            W = W / max(1.0, torch.linalg.norm(W).item())
    y = phi_q @ W.T
    return (y - y.mean(-1, keepdim=True)) / torch.sqrt(y.var(-1, unbiased=False, keepdim=True) + 1e-5)


@pytest.mark.parametrize("normalisation", NORMALISATIONS)
def test_fwm(normalisation):
    phi_k, v, phi_q, beta = (x.detach() for x in _inputs(2, 30, 4, 8, 16, torch.float64))
    phi_k, phi_q = phi_k * 8, phi_q * 8  # large keys: the Frobenius renormalisation is active
    kw = dict(update_rule="fwm", normalisation=normalisation, beta=beta)
    y = read(phi_k, v, phi_q, chunk_size=8, **kw)
    torch.testing.assert_close(y, read_reference(phi_k, v, phi_q, **kw), rtol=1e-10, atol=1e-12)
    for b in range(2):  # normalisation is ignored for fwm
        torch.testing.assert_close(y[b], _fwm_by_hand(phi_k[b], v[b], phi_q[b], beta[b]))
    torch.testing.assert_close(y.mean(-1), torch.zeros(2, 4, dtype=y.dtype), atol=1e-10, rtol=0)
    torch.testing.assert_close(y.std(-1, unbiased=False), torch.ones(2, 4, dtype=y.dtype), atol=1e-3, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("key_scale", [4, 30])
def test_fwm_chunked_state_matches_the_loop(dtype, key_scale):
    """`fwm.state` (values and its hand-written gradients) against autograd through the literal
    loop, with keys large enough that the Frobenius renormalisation acts; at key_scale 30 every
    step divides by ~10-100, so a chunk of 64 scales its first write by e^-200 or less (nothing
    may overflow). float32 within 1e-4: the two round differently through up to 130
    renormalised steps. At key_scale 30 within 1e-3: there the gradient of beta passes through
    ||M_t||^2 = ||W||^2 + 2 u . v_bar + |u|^2 |k|^2, whose terms cancel to 1e-2-1e-4 of their
    size, and lands 3e-5-2.4e-4 (of its largest entry) off the float64 one; the loop's 1e-5-2e-5."""
    tol = {torch.float32: 1e-4 if key_scale < 30 else 1e-3, torch.float64: 1e-10}[dtype]
    for B, L, _, D, d_v, chunk in SHAPES:
        phi_k, v, _, beta = _inputs(B, L, 1, D, d_v, dtype, device=DEVICE)
        phi_k = (phi_k * key_scale).detach().requires_grad_()
        w = torch.randn(B, d_v, D, dtype=dtype, generator=torch.Generator().manual_seed(1)).to(DEVICE)
        results = []
        for state in (fwm.state(phi_k, v, beta, chunk),
                      recurrent_state(fwm.RULE, phi_k, v, beta, None)):
            results.append([state, *torch.autograd.grad((state * w).sum(), (phi_k, v, beta))])
        for a, b in zip(*results):
            assert torch.isfinite(a).all()
            torch.testing.assert_close(a, b, rtol=tol, atol=tol * b.abs().max().item())
        norms = torch.linalg.matrix_norm(results[1][0])  # 1 exactly: the last step renormalised
        torch.testing.assert_close(norms, torch.ones_like(norms))


def test_fwm_state_with_float32_log_scales_as_on_mps(monkeypatch):
    """MPS has no float64, so there the log-scales are float32: at keys of a realistic size the
    state and its gradients still match the literal loop within 1e-4 (float32)."""
    monkeypatch.setitem(fwm.LOG_DTYPE, DEVICE.type, torch.float32)
    for B, L, _, D, d_v, chunk in SHAPES:
        phi_k, v, _, beta = _inputs(B, L, 1, D, d_v, torch.float32, device=DEVICE)
        phi_k = (phi_k * 4).detach().requires_grad_()
        w = torch.randn(B, d_v, D, generator=torch.Generator().manual_seed(1)).to(DEVICE)
        results = []
        for state in (fwm.state(phi_k, v, beta, chunk),
                      recurrent_state(fwm.RULE, phi_k, v, beta, None)):
            results.append([state, *torch.autograd.grad((state * w).sum(), (phi_k, v, beta))])
        for a, b in zip(*results):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4 * b.abs().max().item())


def test_fwm_read_uses_the_chunked_state_for_a_large_state(monkeypatch):
    calls = []
    chunked = fwm.state
    monkeypatch.setattr(fwm, "state", lambda *a: calls.append(1) or chunked(*a))
    for B, D, d_v in ((2, 8, 16), (4, 32, 64)):  # 256 and 8192 state entries
        phi_k, v, phi_q, beta = (x.detach() for x in _inputs(B, 20, 3, D, d_v, torch.float64))
        kw = dict(update_rule="fwm", beta=beta)
        y = read(phi_k * 8, v, phi_q, chunk_size=8, **kw)
        torch.testing.assert_close(y, read_reference(phi_k * 8, v, phi_q, **kw))
    assert B * D * d_v == fwm.CHUNKED_FROM and len(calls) == 1


# --- delta-rule properties -----------------------------------------------------------------


@pytest.mark.parametrize("fn", [read, read_reference])
def test_delta_orthonormal_keys_exact_retrieval(fn):
    D, d_v = 8, 5
    keys = torch.linalg.qr(torch.randn(D, D, dtype=torch.float64))[0].T[None]  # rows orthonormal
    v = torch.randn(1, D, d_v, dtype=torch.float64)
    y = fn(keys, v, keys, update_rule="delta", normalisation="none", beta=torch.ones(1, D, dtype=torch.float64))
    torch.testing.assert_close(y, v)


@pytest.mark.parametrize("fn", [read, read_reference])
def test_delta_rewrite_last_value_wins(fn):
    # Setting 2: one-hot keys (already sum-normalised) drawn with replacement, beta = 1.
    S, L = 5, 23
    g = torch.Generator().manual_seed(3)
    key_ids = torch.randint(S, (L,), generator=g)
    value_ids = torch.randint(S, (L,), generator=g)
    phi_k, v = F.one_hot(key_ids, S).double()[None], F.one_hot(value_ids, S).double()[None]
    last = {int(k): int(val) for k, val in zip(key_ids, value_ids)}
    queries = sorted(last)
    phi_q = F.one_hot(torch.tensor(queries), S).double()[None]
    y = fn(phi_k, v, phi_q, update_rule="delta", normalisation="sum", beta=torch.ones(1, L, dtype=torch.float64),
           eps=0.0, **({"chunk_size": 4} if fn is read else {}))
    expected = F.one_hot(torch.tensor([last[k] for k in queries]), S).double()[None]
    torch.testing.assert_close(y, expected)
    # The sum rule, by contrast, superposes every value ever written under a key.
    y_sum = fn(phi_k, v, phi_q, update_rule="sum", normalisation="none")
    counts = torch.stack([v[0, key_ids == k].sum(0) for k in queries])[None]
    torch.testing.assert_close(y_sum, counts)


# --- softmax baseline ----------------------------------------------------------------------


def test_softmax_read_explicit():
    g = torch.Generator().manual_seed(4)
    k, v, q = torch.randn(2, 7, 4, generator=g), torch.randn(2, 7, 3, generator=g), torch.randn(2, 5, 4, generator=g)
    expected = torch.empty(2, 5, 3)
    for b in range(2):
        for i in range(5):
            e = torch.exp(torch.stack([k[b, l] @ q[b, i] / 2.0 for l in range(7)]))  # 1/sqrt(4)
            expected[b, i] = (e / e.sum()) @ v[b]
    torch.testing.assert_close(softmax_read(k, v, q), expected)
    y = softmax_read(k, v, q, scale=0.3)
    torch.testing.assert_close(y, torch.softmax(q @ k.transpose(1, 2) * 0.3, -1) @ v)


def test_softmax_read_large_scale_retrieves_matching_value():
    L = 6
    keys = torch.eye(L)[None]
    v = torch.randn(1, L, 3)
    perm = torch.tensor([4, 0, 5, 2])
    y = softmax_read(keys, v, keys[:, perm], scale=100.0)
    torch.testing.assert_close(y, v[:, perm])


# --- validation ----------------------------------------------------------------------------


@pytest.mark.parametrize("fn", [read, read_reference])
def test_invalid_strings_raise(fn):
    phi_k, v, phi_q, beta = (x.detach() for x in _inputs(1, 4, 1, 3, 2, torch.float32))
    with pytest.raises(ValueError, match="'hebb'.*delta, fwm, gated_delta, sum"):
        fn(phi_k, v, phi_q, update_rule="hebb")
    with pytest.raises(ValueError, match="'softmax'.*attention.*sum.*none"):
        fn(phi_k, v, phi_q, normalisation="softmax")
    with pytest.raises(ValueError, match="beta"):
        fn(phi_k, v, phi_q, update_rule="delta")
