"""The retrieval model exactly as task-spec.md reads, one line per sentence of the spec.

Kept as the test oracle of ``model.RetrievalModel`` (same parameters, same function) and as the
benchmark baseline: one-hot concatenation, the full state built by einsum, the delta rule as a
loop over time steps, and evaluation by replicating each sequence once per query as the authors
do. Slow on purpose; never used for training.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from kernelzoo.core import memory
from kernelzoo.core.model import RetrievalModel


def reference_forward(model: RetrievalModel, keys, values, query):
    """y (B, Q, S) from the spec's formulas, reading the parameters of ``model``."""
    S = model.n_keys
    x = torch.cat([F.one_hot(values, S).to(model.embedding.weight.dtype),
                   model.embedding(keys)], dim=-1)  # x_l = concat(onehot(value_l), E[key_l])
    k = model.W_k(x)  # k_l = W_k x_l + b_k
    q = model.W_q(model.embedding(query))  # q = W_q E[query_key] + b_q
    v = F.one_hot(values, S).to(k.dtype)  # v_l = onehot(value_l)
    if model.softmax:
        a = torch.softmax(torch.einsum("bld,bqd->bql", k, q) / math.sqrt(model.d_key), dim=-1)
        return torch.einsum("bql,blv->bqv", a, v)
    model.phi.maybe_redraw()
    fk, fq = model.phi(k), model.phi(q, is_query=True)
    if model.rule.by_scores:  # the sum rule, as the spec writes it
        if model.normalisation == "sum":
            fk = fk / (fk.sum(-1, keepdim=True) + model.key_eps)
            fq = fq / (fq.sum(-1, keepdim=True) + model.eps)
        W = torch.einsum("blv,bld->bvd", v, fk)  # W = Σ_l v_l φ(k_l)ᵀ
        y = torch.einsum("bvd,bqd->bqv", W, fq)
        if model.normalisation == "attention":
            z = fk.sum(dim=1)  # z = Σ_l φ(k_l)
            y = y / (torch.einsum("bd,bqd->bq", z, fq).unsqueeze(-1) + model.eps)
        return y
    gates = {g: torch.sigmoid(model.get_submodule(f"W_{g}")(x)).squeeze(-1)  # sigmoid(w · x_l + b)
             for g in model.rule.gates}
    return memory.read_reference(fk, v, fq, update_rule=model.update_rule,
                                 normalisation=model.normalisation, eps=model.eps,
                                 key_eps=model.key_eps, **gates)


def reference_eval_forward(model: RetrievalModel, keys, values, query):
    """The authors' evaluation: each sequence replicated once per query, one query each."""
    B, Q = query.shape
    rep = lambda t: t.repeat_interleave(Q, dim=0)  # noqa: E731
    y = reference_forward(model, rep(keys), rep(values), query.reshape(B * Q, 1))
    return y.reshape(B, Q, -1)
