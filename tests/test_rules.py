"""The update rules (``kernelzoo.core.rules``): every rule's production ``read`` equals its
literal ``step`` on random inputs (values and gradients, with a pack's padding), the registry
is what config offers, and the gated delta rule is the rule its paper writes."""

import math

import pytest
import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir

from kernelzoo.config import UPDATE_RULES, CONF, MemoryConf, TrainerConf
from kernelzoo.core import memory, rules
from kernelzoo.core.rules.base import recurrent_state
from kernelzoo.maps.catalog import build_feature_map
from kernelzoo.training.footprint import footprint
from kernelzoo.training.job import run

RULES = sorted(rules.RULES)
# (B, L, Q, D, d_v, chunk_size): L not a multiple of the chunk, Q = 1 and Q > 1, D > d_v and
# D < d_v; (4, 20, 3, 32, 64, 8) is a state of 8192 entries (fwm's chunked path)
SHAPES = [(2, 37, 3, 8, 5, 16), (1, 10, 50, 4, 3, 64), (3, 130, 1, 6, 12, 32), (4, 20, 3, 32, 64, 8)]


def _inputs(B, L, Q, D, d_v, seed=0):
    """float64 positive features with |phi(k)|^2 ~ 1, values, beta in (0, 1), alpha in (0.5, 1)
    (over 130 steps its product reaches ~1e-16: the decays are tested far from 1)."""
    g = torch.Generator().manual_seed(seed)
    phi_k = F.softplus(torch.randn(B, L, D, generator=g, dtype=torch.float64)) / D**0.5
    v = torch.randn(B, L, d_v, generator=g, dtype=torch.float64)
    phi_q = F.softplus(torch.randn(B, Q, D, generator=g, dtype=torch.float64)) / D**0.5
    beta = torch.sigmoid(torch.randn(B, L, generator=g, dtype=torch.float64))
    alpha = 0.5 + 0.5 * torch.sigmoid(torch.randn(B, L, generator=g, dtype=torch.float64))
    return [x.requires_grad_() for x in (phi_k, v, phi_q, beta, alpha)]


def _y_and_grads(fn, inputs, w, **kw):
    y = fn(*inputs[:3], beta=inputs[3], alpha=inputs[4], **kw)
    return [y, *torch.autograd.grad((y * w).sum(), inputs, allow_unused=True)]


def test_the_registry_is_every_module_and_what_config_offers():
    assert tuple(sorted(rules.RULES)) == UPDATE_RULES == ("delta", "fwm", "gated_delta", "sum")
    for name, rule in rules.RULES.items():
        assert rule.name == name and (CONF / "memory" / f"{name}.yaml").is_file()
        assert MemoryConf(update_rule=name).update_rule == name
    with pytest.raises(ValueError, match="unknown update_rule 'magic'; valid: delta, fwm"):
        rules.get("magic")


@pytest.mark.parametrize("normalisation", ["attention", "sum", "none"])
@pytest.mark.parametrize("name", RULES)
def test_read_equals_the_literal_steps(name, normalisation):
    """float64, within 1e-10 of the largest entry: outputs and the gradients of every input
    the rule uses (the gates it has, none it has not)."""
    rule = rules.get(name)
    for B, L, Q, D, d_v, chunk in SHAPES:
        inputs = _inputs(B, L, Q, D, d_v)
        w = torch.randn(B, Q, d_v, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
        kw = dict(update_rule=name, normalisation=normalisation)
        fast = _y_and_grads(memory.read, inputs, w, chunk_size=chunk, **kw)
        ref = _y_and_grads(memory.read_reference, inputs, w, **kw)
        used = [fast[0], *(g for g in fast[1:] if g is not None)]
        assert len(used) == 4 + len(rule.gates)
        assert [g is None for g in fast] == [g is None for g in ref]
        for a, b in zip(used, [r for r in ref if r is not None]):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10 * b.abs().max().item())


@pytest.mark.parametrize("name", RULES)
def test_a_padded_pair_writes_nothing(name):
    """A pack's padding (``mask``): the read of a shorter sequence padded with arbitrary pairs is
    the read of the shorter sequence alone, gradients of the padding 0."""
    phi_k, v, phi_q, beta, alpha = _inputs(2, 12, 3, 6, 5)
    mask = torch.ones(2, 12, dtype=torch.bool)
    mask[1, 9:] = False
    kw = dict(update_rule=name, normalisation="sum", chunk_size=4)
    y = memory.read(phi_k, v, phi_q, beta=beta, alpha=alpha, mask=mask, **kw)
    alone = memory.read_reference(phi_k[1:, :9], v[1:, :9], phi_q[1:], beta=beta[1:, :9],
                                  alpha=alpha[1:, :9], update_rule=name, normalisation="sum")
    torch.testing.assert_close(y[1:], alone, rtol=1e-10, atol=1e-12)
    grads = torch.autograd.grad(y.sum(), (phi_k, v), allow_unused=True)
    assert all(g is None or g[1, 9:].abs().max() == 0 for g in grads)


def test_gated_delta_is_the_delta_rule_when_nothing_decays():
    phi_k, v, phi_q, beta, _ = (x.detach() for x in _inputs(2, 30, 4, 6, 5))
    kw = dict(normalisation="sum", beta=beta, chunk_size=8)
    gated = memory.read(phi_k, v, phi_q, update_rule="gated_delta", alpha=torch.ones_like(beta),
                        **kw)
    torch.testing.assert_close(gated, memory.read(phi_k, v, phi_q, update_rule="delta", **kw),
                               rtol=1e-12, atol=1e-12)


def test_gated_delta_step_by_hand():
    """One worked step of S_t = alpha_t S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T (Yang
    et al. 2025, eq. 10; here W = S^T of shape (d_v, D))."""
    W = torch.tensor([[[1.0, 2.0], [0.0, 1.0]]], dtype=torch.float64)
    k, v = torch.tensor([[0.6, 0.8]], dtype=torch.float64), torch.tensor([[1.0, -1.0]],
                                                                          dtype=torch.float64)
    beta, alpha = torch.tensor([0.5], dtype=torch.float64), torch.tensor([0.9],
                                                                         dtype=torch.float64)
    expected = 0.9 * W[0] @ (torch.eye(2, dtype=torch.float64) - 0.5 * k.T @ k) + 0.5 * v.T @ k
    torch.testing.assert_close(rules.get("gated_delta").step(W, k, v, beta, alpha, 3)[0], expected)
    # W k = [2.2, 0.8]; 0.9 (W - 0.5 [2.2, 0.8]^T k) + 0.5 [1, -1]^T k
    assert expected.flatten().tolist() == pytest.approx([0.9 * (1 - 0.66) + 0.3, 0.9 * (2 - 0.88) + 0.4,
                                                         0.9 * (0 - 0.24) - 0.3, 0.9 * (1 - 0.32) - 0.4])


def test_gated_delta_forgets_at_the_product_of_its_decays():
    """One key written first, then nothing (beta 0): its read-out shrinks by prod alpha."""
    L = 50
    phi_k = torch.zeros(1, L, 3, dtype=torch.float64)
    phi_k[0, 0] = torch.tensor([1.0, 0.0, 0.0])
    v = torch.zeros(1, L, 2, dtype=torch.float64)
    v[0, 0] = torch.tensor([1.0, 2.0])
    beta = torch.zeros(1, L, dtype=torch.float64)
    beta[0, 0] = 1.0
    alpha = torch.full((1, L), 0.1, dtype=torch.float64)  # e^(49 log 0.1) = 1e-49: no underflow
    y = memory.read(phi_k, v, phi_k[:, :1], update_rule="gated_delta", normalisation="none",
                    beta=beta, alpha=alpha)
    torch.testing.assert_close(y[0, 0], torch.tensor([1e-49, 2e-49], dtype=torch.float64),
                               rtol=1e-9, atol=0)
    assert math.isfinite(y.sum().item())


def test_a_rule_without_its_gates_is_refused():
    phi_k, v, phi_q, beta, _ = (x.detach() for x in _inputs(1, 5, 1, 3, 2))
    with pytest.raises(ValueError, match="'gated_delta' needs alpha"):
        memory.read(phi_k, v, phi_q, update_rule="gated_delta", beta=beta)


@pytest.mark.parametrize("name", RULES)
def test_the_memory_estimate_asks_the_rule(name):
    """Every rule has an estimate, growing with the batch and n_keys (check_memory's bisection)."""
    phi = build_feature_map("dpfp", d_key=16, nu=1)
    mem = MemoryConf(update_rule=name, normalisation="sum" if rules.get(name).erases else "attention")
    peaks = [max(footprint(phi, mem, TrainerConf(batch_size=b), [(n, n, n)]).values())
             for b, n in ((8, 20), (32, 20), (32, 64))]
    assert peaks == sorted(peaks) and peaks[0] > 0


def test_a_gated_delta_run_trains_alone_and_in_a_pack(tmp_path):
    """A smoke run of memory=gated_delta through the trainer: 8 keys learnt alone (0.69 of the
    queries right after 300 steps, chance 1/8; its summary names the rule), and two seeds in one pack reach the same summaries as alone (a pack pads
    the gates like W_k, and its runs stay independent)."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        common = ["d_key=8", "n_keys=8", "logger=none", "trainer=smoke", "trainer.max_steps=300",
                  "trainer.progress=false", "memory=gated_delta", f"results_dir={tmp_path}"]
        (_, alone), = run(compose("config", overrides=common), echo=lambda line: None)
        assert alone["update_rule"] == "gated_delta" and alone["status"] in ("converged", "max_steps")
        assert alone["final_eval_accuracy"] >= 0.5, alone  # chance: 1/8
        cfg = compose("config", overrides=[*common, "results_dir=" + str(tmp_path / "pack"),
                                           "pack_members=[[6,2]]", "trainer.pack=2"])
        packed = run(cfg, echo=lambda line: None)
    assert len(packed) == 2
    assert packed[0][1]["final_eval_loss"] == alone["final_eval_loss"]
