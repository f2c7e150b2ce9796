"""Why a run fails: measurements taken once from the trained model, on evaluation sequences.

- ``phi_rank``, ``phi_effective_rank``: of the matrix of written-key features phi(k_l) of one
  sequence (L x d_dot, in float64), averaged over the sequences; ``..._initial``: the same at
  initialisation, before the first step (learned maps and trained keys change it). The rank counts singular
  values above ``RANK_RTOL`` times the largest; the effective rank is exp(entropy) of the
  singular values normalised to sum 1 (Roy & Vetterli 2007): d_dot-many equal directions give
  d_dot, a few dominant ones give about their number. Neither exists for softmax (no features).
- ``margin``, ``negative_margin_fraction``: the model's own read-out y (S outputs per query,
  whatever the update rule: for the sum rule it is the normalised crosstalk read-out, for
  delta / fwm the final state's read-out W phi(q)): margin = y[target] - max of y over the
  other values; the mean over queries, and the fraction of queries read wrong (margin < 0).
- ``dead_keys``: key symbols answered wrong in every evaluation sequence that queries them,
  each with the key it is confused with (the key paired, in that sequence, with the value most
  often answered instead); ``per_key_accuracy``: the accuracy of every key symbol.
- Why each dead key is dead (``describe_dead``): its ``margin`` (mean over its queries),
  ``outranked_by`` (mean number of values read above its right one) and
  ``feature_norm_ratio`` (||phi(k)|| of its written key over the median of its sequence's
  written keys', mean over the sequences holding it; None for softmax). ``cause``: "vanishes"
  when that ratio is below ``VANISH_RATIO`` (its features are too small to be read), else
  "spread" when ``outranked_by`` >= ``SPREAD_MIN`` (its read-out is lost among many
  near-equal scores), else "collides" (one or two values win: the key it is confused with).
- Why a run diverged (``divergence``, appended to its ``reason``): measured on the model as it
  stood at its last evaluation before the non-finite loss (at initialisation when there was
  none): non-finite parameters, written keys whose features are all 0 (with the sum
  normalisation and key_eps = 0, the authors' delta rule, such a key is 0/0), non-finite
  features (an overflowing exp); when none of these, and the update rule divides by the feature
  sum, the smallest such sum (how near a key was to underflowing to 0).
"""

from __future__ import annotations

import math
from collections import Counter

import torch


RANK_RTOL = 1e-5  # a singular value below this times the largest counts as zero
VANISH_RATIO = 0.1  # a written key's ||phi(k)|| below this times its sequence's median: vanished
SPREAD_MIN = 3  # a dead key's right value outranked by this many values or more: spread


def feature_ranks(features: torch.Tensor) -> tuple[float, float]:
    """(rank, effective rank) of a (rows, d_dot) feature matrix, in float64."""
    s = torch.linalg.svdvals(features.double())
    if s.numel() == 0 or s[0] <= 0:
        return 0.0, 0.0
    rank = int((s > RANK_RTOL * s[0]).sum())
    p = s / s.sum()
    p = p[p > 0]
    return float(rank), float(torch.exp(-(p * p.log()).sum()))


def _margins(y: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """y[target] - max over the other values, per query (B, Q)."""
    correct = y.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    return correct - y.scatter(-1, target.unsqueeze(-1), -math.inf).amax(-1)


def read_margins(y: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """margin = y[target] - max over the other values, for the real queries (flat)."""
    return _margins(y, target)[mask]


def dead_keys(query, target, predicted, values, keys, mask) -> tuple[list[dict], dict]:
    """Key symbols never answered right, with what they are confused with, and per-key accuracy.

    All tensors are (B, Q) except values and keys (B, L). The confused key is the key that, in
    the same sequence, holds the value most often answered instead (or None if none does)."""
    right: Counter = Counter()
    asked: Counter = Counter()
    wrong_with: dict[int, Counter] = {}
    for b in range(query.shape[0]):
        holder = {int(v): int(k) for k, v in zip(keys[b].tolist(), values[b].tolist())}
        for j in torch.nonzero(mask[b]).flatten().tolist():
            key = int(query[b, j])
            asked[key] += 1
            if predicted[b, j] == target[b, j]:
                right[key] += 1
            else:
                wrong_with.setdefault(key, Counter())[holder.get(int(predicted[b, j]))] += 1
    accuracy = {key: right[key] / asked[key] for key in sorted(asked)}
    dead = [{"key": key, "confused_with": wrong_with[key].most_common(1)[0][0],
             "sequences": asked[key]} for key in sorted(asked) if right[key] == 0]
    return dead, accuracy


def describe_dead(dead: list[dict], y, target, query, mask, keys, features) -> list[dict]:
    """``dead`` (from ``dead_keys``) with margin, outranked_by, feature_norm_ratio and cause
    (module docstring). y (B, Q, S); target, query, mask (B, Q); keys (B, L); features
    (B, L, d_dot) from ``written_features``, or None (softmax)."""
    margins = _margins(y, target)
    outranked = (y > y.gather(-1, target.unsqueeze(-1))).sum(-1).double()
    relative = None
    if features is not None:
        norms = features.double().norm(dim=-1)
        median = norms.median(dim=1, keepdim=True).values
        relative = torch.where(median > 0, norms / median.clamp(min=1e-300), math.nan)
    described = []
    for entry in dead:
        asked, held = (query == entry["key"]) & mask, keys == entry["key"]
        ratio = float(relative[held].mean()) if relative is not None and held.any() else None
        ratio = ratio if ratio is not None and math.isfinite(ratio) else None
        behind = float(outranked[asked].mean())
        cause = ("vanishes" if ratio is not None and ratio < VANISH_RATIO
                 else "spread" if behind >= SPREAD_MIN else "collides")
        described.append({**entry, "margin": float(margins[asked].mean()), "outranked_by": behind,
                          "feature_norm_ratio": ratio, "cause": cause})
    return described


@torch.no_grad()
def written_features(model, batch) -> torch.Tensor | None:
    """phi(k_l) of every written key (B, L, d_dot), one sequence at a time; None for softmax.
    Draws nothing: no projection is redrawn, no generator advanced."""
    if model.softmax:
        return None
    k, _, _ = model.keys_and_query(batch.keys, batch.values, batch.query[:, :1])
    return torch.cat([model.phi(k[b:b + 1]) for b in range(k.shape[0])])


def mean_ranks(features: torch.Tensor | None) -> tuple[float | None, float | None]:
    """Mean (rank, effective rank) over the sequences of ``written_features``; None, None for
    softmax (None) and for features that are not finite (the run is recorded diverged)."""
    if features is None or not torch.isfinite(features).all():  # a diverging map: no rank
        return None, None
    ranks = [feature_ranks(f) for f in features]
    return sum(r for r, _ in ranks) / len(ranks), sum(e for _, e in ranks) / len(ranks)


def feature_ranks_of(model, batch) -> tuple[float | None, float | None]:
    """Mean (rank, effective rank) of the written keys' features over the batch's sequences;
    None for softmax."""
    return mean_ranks(written_features(model, batch))


@torch.no_grad()
def divergence(model, batch, step: int) -> str:
    """Why ``model``, as it stood at ``step`` (its last evaluation), could go non-finite: one
    clause for the run's ``reason`` (see the module docstring)."""
    when = f"at step {step}" if step else "at initialisation"
    bad = [n for n, p in model.named_parameters() if not torch.isfinite(p).all()]
    if bad:
        return f"{when} parameters were already non-finite: {', '.join(bad)}"
    features = written_features(model, batch)
    if features is None:
        return f"{when} its parameters were finite (softmax: no features to check)"
    flat = features.reshape(-1, features.shape[-1])
    zero = float((flat == 0).all(-1).double().mean())
    overflow = float((~torch.isfinite(flat)).any(-1).double().mean())
    found = []
    if zero:
        divides = model.rule.divides_by_feature_sum(model.normalisation) and model.key_eps == 0
        found.append(f"{zero:.1%} of written keys had all-zero features"
                     + (" (the sum normalisation with key_eps = 0 makes each 0/0)"
                        if divides else ""))
    if overflow:
        found.append(f"{overflow:.1%} of written keys had non-finite features")
    if found:
        return f"{when} " + "; ".join(found)
    smallest = ""
    if model.rule.divides_by_feature_sum(model.normalisation):
        smallest = (f" (the smallest sum of a written key's features, which the sum "
                    f"normalisation divides by, was {float(flat.sum(-1).min()):.1e})")
    return (f"{when} parameters and written keys' features were finite and nonzero{smallest}: "
            "the loss went non-finite during the steps after it")


@torch.no_grad()
def measure(model, batch, initial=(None, None)) -> tuple[dict, dict]:
    """(its summary fields: the diagnostics ``records/summary.py`` declares, per-key details)
    of a trained RetrievalModel on one evaluation batch, with ``initial`` = feature_ranks_of(the
    model at initialisation, the same batch); the details go to the run's ``diagnostics.json``."""
    was_training = model.training
    model.eval()
    y = model(batch.keys, batch.values, batch.query)
    margins = read_margins(y.double(), batch.target, batch.mask)
    features = written_features(model, batch)
    rank, effective = mean_ranks(features)
    fields = {"phi_rank": rank, "phi_effective_rank": effective,
              "phi_rank_initial": initial[0], "phi_effective_rank_initial": initial[1],
              "margin": float(margins.mean()) if margins.numel() else None,
              "negative_margin_fraction": float((margins < 0).double().mean())
              if margins.numel() else None}
    dead, accuracy = dead_keys(batch.query, batch.target, y.argmax(-1), batch.values,
                               batch.keys, batch.mask)
    dead = describe_dead(dead, y.double(), batch.target, batch.query, batch.mask, batch.keys,
                         features)
    fields["dead_keys"] = len(dead)
    model.train(was_training)
    return fields, {"dead_keys": dead, "per_key_accuracy": accuracy,
                    "rank_rtol": RANK_RTOL}
