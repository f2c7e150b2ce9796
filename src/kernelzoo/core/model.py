"""The single-layer retrieval model of task-spec "Model", on its fast path.

The spec reads ``x_l = concat(onehot(value_l), E[key_l])``, ``k_l = W_k x_l + b_k``,
``q = W_q E[query] + b_q``, ``v_l = onehot(value_l)``. Since the values are one-hot, the fast
path never builds a one-hot tensor:

- ``W_k x_l = W_k[:, value_l] + (E W_kᵉᵀ)[key_l]``: the key rows of the embedding table are
  projected once per forward (S·e·d_key multiply-adds instead of B·L·(S+e)·d_key) and gathered;
- for the ``sum`` rule with queries at the end, the state ``W = Σ v φ(k)ᵀ`` is never built:
  the scores ``φ(q)·φ(k_l)`` (``FeatureMap.scores``: DPFP by its kernel trick, FAVOR+ one
  cache-sized batch slice at a time) are scatter-added into the output slot ``value_l``;
- queries are key symbols (< n_keys): they are looked up in the key rows only, and for many
  queries (evaluation) the key rows are projected once and gathered, as for the keys.

``kernelzoo.core.reference.reference_forward`` is the literal transcription, kept as test oracle and
benchmark baseline; tests assert both compute the same function, outputs and gradients.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from kernelzoo.core import memory, rules
from kernelzoo.maps.base import FeatureMap, batched_dot

EMBED_FACTOR = 1.1  # the authors' embedding width, int(2S * 1.1)


class RetrievalModel(nn.Module):
    """Single layer, single head, no MLP, no positional encoding (task-spec "Model")."""

    def __init__(self, n_keys: int, phi: FeatureMap, update_rule: str = "sum",
                 normalisation: str = "attention", eps: float = 1e-6, key_eps: float = 0.0,
                 chunk_size: int = 64, embed_factor: float = EMBED_FACTOR):
        super().__init__()
        S, d_key = n_keys, phi.d_key
        self.n_keys, self.d_key, self.phi = S, d_key, phi
        self.update_rule, self.normalisation = update_rule, normalisation
        self.rule = rules.get(update_rule)
        self.eps, self.key_eps, self.chunk_size = eps, key_eps, chunk_size
        self.softmax = phi.is_softmax
        e = int(2 * S * embed_factor)  # the authors' width, int(2S·1.1)
        self.embedding = nn.Embedding(2 * S, e)  # init N(0, 1); rows [0, S) are the key symbols
        self.W_k = nn.Linear(S + e, d_key)
        self.W_q = nn.Linear(e, d_key)
        for lin in (self.W_k, self.W_q):
            if self.softmax:
                nn.init.xavier_uniform_(lin.weight)
            else:
                nn.init.uniform_(lin.weight, -1 / math.sqrt(d_key), 1 / math.sqrt(d_key))
        for gate in self.rule.gates:  # W_beta, W_alpha: gate_l = sigmoid(w . x_l + b)
            lin = nn.Linear(S + e, 1)
            if gate in self.rule.gate_bias:
                nn.init.constant_(lin.bias, self.rule.gate_bias[gate])
            self.add_module(f"W_{gate}", lin)

    def keys_and_query(self, keys, values, query):
        """k (B, L, d_key), q (B, Q, d_key) and the rule's gates {name: (B, L)}, without one-hot
        inputs."""
        S = self.n_keys
        table = self.embedding.weight[:S]  # key rows only
        w_val, w_emb = self.W_k.weight[:, :S], self.W_k.weight[:, S:]
        k = _gather(table @ w_emb.T + self.W_k.bias, keys) + _gather(w_val.T, values)
        if query.numel() > S:  # many queries (evaluation): project the table, then gather
            q = _gather(table @ self.W_q.weight.T, query) + self.W_q.bias
        else:
            q = F.linear(_gather(table, query), self.W_q.weight, self.W_q.bias)
        gates = {}
        for gate in self.rule.gates:
            lin = self.get_submodule(f"W_{gate}")
            w = lin.weight[0]
            gates[gate] = torch.sigmoid(_gather(table @ w[S:] + lin.bias, keys)
                                        + _gather(w[:S], values))
        return k, q, gates

    def forward(self, keys: torch.Tensor, values: torch.Tensor, query: torch.Tensor):
        """Outputs y (B, Q, S) for query keys (B, Q) after the sequence (keys, values) (B, L)."""
        k, q, gates = self.keys_and_query(keys, values, query)
        if not self.softmax:
            self.phi.maybe_redraw()  # one projection shared by keys and query in this pass
        return read_out([self.phi], k, q, gates, values, self.n_keys, self.update_rule,
                        self.normalisation, self.eps, self.key_eps, self.chunk_size)


def read_out(phis: list[FeatureMap], k, q, gates, values, n_values: int, update_rule: str,
             normalisation: str, eps: float, key_eps: float, chunk_size: int,
             mask: torch.Tensor | None = None, value_mask: torch.Tensor | None = None):
    """The read-out after the projections: y (B, Q, n_values) from k (B, L, d_key), q (B, Q,
    d_key), the rule's gates {name: (B, L)} and the values (B, L).

    ``phis`` is one map for the whole batch, or one per equal slice of it (the runs of a pack,
    ``pack.py``, when their maps hold parameters or a projection). ``mask`` (B, L) marks real
    positions and ``value_mask`` (B, n_values) real value slots when a pack pads shorter runs:
    padding then writes nothing, is read by nothing, and its outputs are 0."""
    phi = phis[0]
    if phi.is_softmax:
        logits = batched_dot(q, k) / math.sqrt(k.shape[-1])
        if mask is not None:
            logits = logits.masked_fill(~mask.unsqueeze(1), -math.inf)
        return _scatter(torch.softmax(logits, dim=-1), values, n_values)
    if not rules.get(update_rule).by_scores:
        fk = _each(phis, lambda f, x: f(x), k)
        fq = _each(phis, lambda f, x: f(x, is_query=True), q)
        v = _one_hot(values, n_values, fk.dtype)
        return memory.read(fk, v, fq, update_rule=update_rule, normalisation=normalisation,
                           eps=eps, key_eps=key_eps, chunk_size=chunk_size,
                           mask=mask, value_mask=value_mask, **gates)
    scores = _each(phis, lambda f, k_, q_: f.scores(k_, q_, normalise=normalisation == "sum",
                                                     eps=eps, key_eps=key_eps), k, q)  # (B, Q, L)
    if mask is not None:
        scores = scores * mask.unsqueeze(1).to(scores.dtype)
    y = _scatter(scores, values, n_values)
    if normalisation == "attention":
        y = y / (scores.sum(dim=-1, keepdim=True) + eps)
    return y


def _each(phis: list[FeatureMap], fn, *tensors: torch.Tensor) -> torch.Tensor:
    """fn(phi, *tensors) for one map, or each map on its own equal slice of the batch."""
    if len(phis) == 1:
        return fn(phis[0], *tensors)
    parts = zip(*(t.chunk(len(phis)) for t in tensors))
    return torch.cat([fn(phi, *part) for phi, part in zip(phis, parts)])


def _scatter(scores: torch.Tensor, values: torch.Tensor, n_values: int) -> torch.Tensor:
    """Σ_l scores[:, :, l] · onehot(value_l): a scatter-add of scores (B, Q, L) into (B, Q, n_values)."""
    B, Q, L = scores.shape
    index = values.unsqueeze(1).expand(B, Q, L)
    return scores.new_zeros(B, Q, n_values).scatter_add_(2, index, scores)


def _one_hot(values: torch.Tensor, n_values: int, dtype: torch.dtype) -> torch.Tensor:
    """onehot(values) in ``dtype``, written once: ``F.one_hot`` builds an int64 tensor of the
    same shape first (twice the bytes of a float32 result) and then casts it."""
    out = torch.zeros(*values.shape, n_values, dtype=dtype, device=values.device)
    return out.scatter_(-1, values.unsqueeze(-1), 1.0)


def _gather(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """table[index] through index_select, whose backward (index_add) is faster than indexing's."""
    return table.index_select(0, index.reshape(-1)).view(*index.shape, *table.shape[1:])


def retrieval_loss(y: torch.Tensor, target: torch.Tensor, mask: torch.Tensor | None = None):
    """Per-query loss 0.5·Σ_v (onehot(target)_v − y_v)² (task-spec "Training"), shape (B, Q)."""
    per_query = 0.5 * (y - F.one_hot(target, y.shape[-1]).to(y.dtype)).square().sum(-1)
    return per_query if mask is None else per_query.masked_fill(~mask, 0.0)
