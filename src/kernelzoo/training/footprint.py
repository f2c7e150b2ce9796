"""A run's memory estimate: ``footprint`` counts the tensors a run holds at the peak
of each phase of ``runner.fit``, from the shapes the code makes: the parameters with their copies,
gradients and Adam's moments, then the largest of what a training step, an evaluation, the final
diagnostics and a checkpoint add to them. What a feature map makes is measured once per map and
setting on a few rows (``map_costs``), since every map makes its own intermediates."""

from __future__ import annotations

import json
import math
import weakref
from dataclasses import dataclass

import torch
from torch.utils._pytree import tree_leaves
from torch.utils._python_dispatch import TorchDispatchMode

from kernelzoo.core import rules
from kernelzoo.core.model import EMBED_FACTOR
from kernelzoo.maps import base as feature_maps

I64, F64 = 8, 8  # bytes of the int64 indices and of the float64 numbers a run makes
# footprint's count leaves out a few small tensors (the query side, some operations'
# temporaries): up to 4% of a phase's tensors in the runs ``make bench`` measures; it adds
# MARGIN of them, so that it covers what it counts
MARGIN = 0.05


class _LiveBytes(TorchDispatchMode):
    """Bytes of the tensors alive while active, and their peak: each storage an operation
    returns counts from that operation until it is freed (a weak reference's callback). Only
    storages made while active count; a view or an in-place result counts once."""

    def __init__(self):
        super().__init__()
        self.live = self.peak = 0
        self._held: set[int] = set()

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        """False: nothing is compiled while it is active, and skipping Dynamo would wrap
        ``__torch_dispatch__`` in ``torch._dynamo.disable``, importing torch._dynamo (about 2 s
        in every process that plans a run)."""
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                if storage._cdata not in self._held:
                    self._held.add(storage._cdata)
                    self.live += storage.nbytes()
                    weakref.finalize(storage, self._free, storage._cdata, storage.nbytes())
        self.peak = max(self.peak, self.live)
        return out

    def _free(self, key: int, nbytes: int) -> None:
        self._held.discard(key)
        self.live -= nbytes

    def restart(self) -> int:
        """The live bytes now, from which the peak is measured again."""
        self.peak = self.live
        return self.live


@dataclass(frozen=True)
class MapCost:
    """Bytes of one pass of a feature map, as (per key row, per sequence) with one query per
    sequence: ``peak`` while its forward runs (its input keys and output included), ``kept``
    after it for the backward (the output excluded), ``backward`` at the peak of its backward
    beyond what was kept and the output (the incoming gradient included); ``slice`` is the
    transient per key row of one slice of ``feature_maps.batch_slices``, beyond those, and
    ``width`` the numbers per key row by which that function sizes its slices (0: none)."""

    peak: tuple[float, float]
    kept: tuple[float, float]
    backward: tuple[float, float]
    slice: float
    width: float

    def slice_rows(self, rows: int, length: int) -> int:
        """Key rows of one slice of ``rows`` (sequences of ``length``) on the CPU, as
        ``feature_maps.batch_slices`` cuts them."""
        if not self.width:
            return 0
        per_sequence = length * self.width
        return min(rows, length * max(1, int(feature_maps.SLICE_ELEMENTS // per_sequence)))

    def at(self, field: str, rows: int, sequences: int) -> float:
        per_row, per_sequence = getattr(self, field)
        return max(0.0, per_row * rows + per_sequence * sequences)


PROBE_SEQUENCES, PROBE_ROWS = (2, 4), (16, 32)  # map_costs' inputs: sequences x key rows
_MAP_COSTS: dict[tuple, MapCost] = {}


def map_costs(phi, path: str, grad: bool, dtype: torch.dtype, sliced: bool,
              normalise: bool = False) -> MapCost:
    """What ``phi.scores(k, q, normalise)`` (``path`` "scores", one query per sequence) or
    ``phi(k)`` ("features") makes, with gradients or without, measured with ``_LiveBytes`` on
    keys of each of PROBE_SEQUENCES x PROBE_ROWS: B sequences of L rows take
    c + s L + (r L + q) B bytes, solved for the per-row r, per-sequence q and slice s. On the
    CPU (``sliced``) ``batch_slices`` makes every sequence a slice of its own, so that what a
    slice makes (bounded by the slice, not the batch) is s; elsewhere it makes one slice, as on
    that device. Inputs come from a generator of their own, no projection is redrawn and the
    map's gradients are put back: the map is as it was. Measured once per map, setting and
    dtype in a process. A map whose operations cannot be followed so (an error in the
    measurement) is taken to keep two feature-wide tensors per key row and to make three more
    while it runs."""
    key = (type(phi), phi.d_key, json.dumps(phi.params, sort_keys=True, default=str), path,
           grad, normalise, dtype, sliced)
    if key not in _MAP_COSTS:
        try:
            _MAP_COSTS[key] = _measure_map(phi, path, grad, dtype, sliced, normalise)
        except Exception:
            row = phi.width * torch.finfo(dtype).bits // 8
            _MAP_COSTS[key] = MapCost((5 * row, 5 * row), (2 * row, 2 * row),
                                      (3 * row, 3 * row), 0.0, 0)
    return _MAP_COSTS[key]


def _measure_map(phi, path, grad, dtype, sliced, normalise) -> MapCost:
    generator = torch.Generator().manual_seed(0)
    grads = [p.grad for p in phi.parameters()]
    elements = feature_maps.SLICE_ELEMENTS
    feature_maps.SLICE_ELEMENTS = 0 if sliced else 1 << 62
    feature_maps.SLICE_WIDTHS = widths = []
    try:
        taken = {}
        for B in PROBE_SEQUENCES:
            for L in PROBE_ROWS:
                k0 = torch.randn(B, L, phi.d_key, generator=generator, dtype=dtype)
                q0 = torch.randn(B, 1, phi.d_key, generator=generator, dtype=dtype)
                k0.requires_grad_(grad)
                q0.requires_grad_(grad)
                with _LiveBytes() as live, torch.set_grad_enabled(grad):
                    k, q = k0 * 1, q0 * 1  # made here: freed unless the pass keeps them
                    out = phi.scores(k, q, normalise=normalise) if path == "scores" else phi(k)
                    del k, q
                    peak, kept = live.peak, live.restart() - out.nbytes
                    backward = 0
                    if grad:  # out's gradient as out.backward(ones) gives it, without the
                        # sympy that passing a gradient imports (a second in every process)
                        total = (out * torch.ones_like(out)).sum()
                        start = live.restart()
                        total.backward()
                        backward = live.peak - start
                    del out
                taken[B, L] = (peak, kept, backward)
    finally:
        feature_maps.SLICE_ELEMENTS, feature_maps.SLICE_WIDTHS = elements, None
        for p, g in zip(phi.parameters(), grads):
            p.grad = g
    (b1, b2), (l1, l2) = PROBE_SEQUENCES, PROBE_ROWS
    fitted = []
    for i in range(3):
        slope = {L: (taken[b2, L][i] - taken[b1, L][i]) / (b2 - b1) for L in (l1, l2)}
        per_row = (slope[l2] - slope[l1]) / (l2 - l1)
        const = {L: taken[b1, L][i] - slope[L] * b1 for L in (l1, l2)}
        fitted.append(((per_row, slope[l1] - per_row * l1), (const[l2] - const[l1]) / (l2 - l1)))
    (peak, s_peak), (kept, _), (backward, s_backward) = fitted
    return MapCost(peak, kept, backward, max(0.0, s_peak, s_backward),
                   max(widths, default=0) if sliced else 0)


def parameter_count(n_keys: int, d_key: int, update_rule: str) -> tuple[int, int]:
    """(all, the embedding's) parameters of ``model.RetrievalModel`` but its map's."""
    S, e = n_keys, int(2 * n_keys * EMBED_FACTOR)
    gates = (S + e + 1) * len(rules.get(update_rule).gates)  # W_beta (and W_alpha)
    return 2 * S * e + (S + e + 1) * d_key + (e + 1) * d_key + gates, 2 * S * e


def footprint(phi, mem, tr, runs: list[tuple[int, int, int]], device_type: str = "cpu") -> dict:
    """An estimate, in bytes, of the most memory a pack of runs (a run alone: a pack of one)
    holds at once in each phase of ``runner.fit``, from the tensors its code makes (the
    functions each term follows are named beside it):

    - ``parameters``: what every phase holds, each run's model and the pack's stacked copy
      (``pack.Pack``, padded to the largest run), its gradients and Adam's two moments;
    - ``training step``: those and the larger of the forward's peak (``Pack._forward``) and the
      backward's (the gradients then grow from none);
    - ``evaluation``: an evaluation (``runner.evaluate``, one run at a time), its batch
      included; ``diagnostics``: the trained model's diagnostics (``diagnostics.measure``);
    - ``checkpoint``: a run's Adam moments taken out for its checkpoint (``Pack.adam_state``).

    ``phi`` is the map, ``mem`` and ``tr`` the memory and trainer settings, ``runs`` the
    (n_keys, seq_len, eval_seq_len) of each run; ``device_type`` "cpu" is where maps slice
    their batch (``feature_maps.batch_slices``). Beside the count, MARGIN. How close it comes to
    runs' peaks, ``python -m kernelzoo.bench --estimate`` measures and
    tests/test_memory_estimate.py holds it to."""
    dtype = getattr(torch, tr.dtype)
    b = torch.finfo(dtype).bits // 8
    rule, d, R, B = rules.get(mem.update_rule), phi.d_key, len(runs), tr.batch_size
    S, L = max(r[0] for r in runs), max(r[1] for r in runs)
    D = 0 if phi.is_softmax else phi.width
    N, NL = R * B, R * B * L
    sliced = device_type == "cpu"
    normalise = rule.divides_by_feature_sum(mem.normalisation)
    gated = len(rule.gates)  # a gate: W_beta (W_alpha), its two gathers and sigmoid
    own_map = any(True for _ in phi.parameters()) or any(True for _ in phi.buffers())
    map_numbers = sum(p.numel() for p in phi.parameters()) * (R if own_map else 1)
    padded, embedding = parameter_count(S, d, rule.name)
    models = sum(parameter_count(n, d, rule.name)[0] for n, _, _ in runs)
    models += sum(x.numel() for x in phi.buffers()) * (R if own_map else 1)
    trained = R * padded + map_numbers  # what Adam trains (Pack.parameters)
    held = (models + map_numbers + R * padded + 3 * trained) * b  # + gradients, 2 moments

    # the training step (Pack.losses and its backward) over N sequences of L keys
    ints = (6 + 2 * gated) * I64 * NL  # batches, stacked keys and values, gather indices
    kept_ints = (2 + 2 * gated + rule.by_scores) * I64 * NL  # indices its backward keeps
    beta = gated * NL * b
    gathered = 3 * NL * d * b + 2 * beta  # k = two gathers and their sum (model._gather)
    k = NL * d * b  # alive through read_out
    loss = N * S * (I64 + b)  # retrieval_loss: one_hot (int64) and its copy in dtype
    if phi.is_softmax:  # batched_dot keeps q and k, softmax its output
        kept = k + 2 * NL * b
        forward = [gathered, kept + NL * b, kept + N * S * b + loss]
        backward = [kept + k + 2 * NL * b]
    elif rule.by_scores:  # FeatureMap.scores, then the scatter of model._scatter
        cost = map_costs(phi, "scores", True, dtype, sliced, normalise)
        transient = cost.slice * cost.slice_rows(NL, L)
        kept = cost.at("kept", NL, N) + NL * b * (1 + (R > 1))
        y = N * S * b * (1 + (mem.normalisation == "attention"))
        forward = [gathered, beta + cost.at("peak", NL, N) + transient, kept + y + loss]
        backward = [kept + y + 2 * N * S * b,
                    cost.at("kept", NL, N) + cost.at("backward", NL, N) + NL * b + transient]
    else:
        cost = map_costs(phi, "features", True, dtype, sliced)
        features = cost.at("kept", NL, N) + NL * D * b  # phi(k) and what its backward keeps
        v = NL * S * b  # model._one_hot
        base = beta + features + v + (2 * NL * D * b + beta if R > 1 else 0)  # masked copies
        if normalise:
            base += (NL * D + NL) * b  # sum_normalise and its sums
        read, kept, back = rule.train_bytes(rules.Sizes(
            N=N, L=L, Q=1, D=D, S=S, b=b, chunk_size=mem.chunk_size, base=base, keys=k,
            values=v, gates=beta, features=features))
        forward = [gathered, beta + cost.at("peak", NL, N), *read, kept + N * S * b + loss]
        backward = [*back, beta + features + cost.at("backward", NL, N)]
    parameter_grads = (trained + 2 * R * embedding) * b  # the embedding's two gradients, summed
    step = max(held + ints + max(forward), held - trained * b
               + max(kept_ints + max(backward), parameter_grads))

    phases = {"parameters": held, "training step": step, "evaluation": 0, "diagnostics": 0,
              "checkpoint": 0}
    for n_keys, _, eval_len in runs:
        E, Q = tr.eval_sequences, min(n_keys, tr.eval_max_queries)
        size = min(tr.eval_query_batch or Q, Q)
        chunks = E * math.ceil(Q / size) if phi.draws_per_chunk else E  # runner._per_chunk
        batch = I64 * (2 * E * eval_len + 2 * E * Q) + E * Q  # task.eval_batch
        made = 9 * E * eval_len * Q  # _last_value's (E, L, Q) comparison and positions
        ys = E * Q * n_keys * b
        queries = size if phi.draws_per_chunk else Q
        passes = _evaluation(phi, mem, dtype, sliced, b, n_keys, eval_len, chunks, queries)
        if phi.draws_per_chunk:  # a projection per chunk; the outputs gathered back to (E, Q)
            batch += 2 * I64 * chunks * eval_len
            passes = max(passes, chunks * queries * n_keys * b + ys)
            passes += sum(x.numel() for x in phi.buffers()) * chunks * b
        evaluation = max(made, passes, ys + E * Q * n_keys * (I64 + b))
        phases["evaluation"] = max(phases["evaluation"], held + batch + evaluation)
        features = E * eval_len * D * b  # diagnostics.written_features
        diagnostics = max(_evaluation(phi, mem, dtype, sliced, b, n_keys, eval_len, E, Q),
                          # describe_dead: y.double(), _margins' copy, the (y > ...) mask
                          ys + E * Q * n_keys * (2 * F64 + 1) + features,
                          ys + E * Q * n_keys * F64 + E * eval_len * D * (b + F64))
        phases["diagnostics"] = max(phases["diagnostics"], held + batch + diagnostics)
        if tr.checkpoint_minutes is not None:
            phases["checkpoint"] = max(phases["checkpoint"],
                                       held + 4 * parameter_count(n_keys, d, rule.name)[0] * b)
    return {phase: round(held + (total - held) * (1 + MARGIN)) if total > held else round(total)
            for phase, total in phases.items()}


def _evaluation(phi, mem, dtype, sliced, b, S, L, N, Q) -> float:
    """The peak of a forward without gradients of one run's model (S keys) over N sequences of
    L keys and Q queries each (``RetrievalModel.forward``), its output included."""
    rule, d = rules.get(mem.update_rule), phi.d_key
    D = 0 if phi.is_softmax else phi.width
    NL, y = N * L, N * Q * S * b
    gathered = 3 * NL * d * b + N * Q * d * b
    k = NL * d * b + N * Q * d * b  # keys and queries, alive through read_out
    if phi.is_softmax:
        return max(gathered, k + 2 * N * Q * L * b + y)
    normalise = rule.divides_by_feature_sum(mem.normalisation)
    if rule.by_scores:
        cost = map_costs(phi, "scores", False, dtype, sliced, normalise)
        scores = N * Q * L * b
        mapped = (cost.at("peak", NL, N * Q) - NL * b + scores
                  + cost.slice * cost.slice_rows(NL, L))
        # the map's peak counts its input keys and queries
        return max(gathered, mapped, k + scores + y * (1 + (mem.normalisation == "attention")))
    cost = map_costs(phi, "features", False, dtype, sliced)
    mapped = cost.at("peak", NL, N) + cost.slice * cost.slice_rows(NL, L) + N * Q * D * b
    base = k + (NL + N * Q) * D * b + NL * S * b  # phi(k), phi(q), the one-hot values
    if normalise:
        base += (NL + N * Q) * D * b
    read = rule.eval_bytes(rules.Sizes(N=N, L=L, Q=Q, D=D, S=S, b=b, chunk_size=mem.chunk_size,
                                       base=base))
    return max(gathered, mapped + N * Q * d * b, read, base + N * S * D * b + 2 * y)
