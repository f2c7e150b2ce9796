"""A pack: runs that share everything but ``seed`` and ``n_keys``, trained as one with batched ops.

Each run is built exactly as it would be alone (``RetrievalModel`` after ``torch.manual_seed``
of its seed). The pack stacks the model's own parameters (embedding, W_k, W_q, the gates W_beta,
W_alpha) along a leading run axis, padded to the pack's largest run:

- the embedding table (2S, e) becomes (2S_max, e_max): key rows [0, S) stay in place, the
  (unused) value rows move to [S_max, S_max + S), columns past e are 0;
- W_k and the gates (·, S + e) split into their value part [0, S) and embedding part, which moves
  to [S_max, S_max + e); W_q (d_key, e) keeps its first e columns.

Padded entries are 0 and stay 0: every gradient reaching them is a product with another padded
0, so Adam (elementwise) never moves them. Shorter sequences are padded with copies of key
symbol 0 and masked (``model.read_out``), padded value slots read 0, and each run's loss is its
own batch mean: the pack's objective is the *sum* of the runs' losses, so each run's gradient,
Adam state and trajectory are its own. Maps with parameters or a projection (learned maps,
FAVOR+) keep one map per run, applied to that run's slice of the batch; parameter-free maps run
once over the whole pack.

Which runs form a pack, and how many, is the packing policy (``packing.py``); this module is
the mechanics. ``Pack.losses`` is the training step's forward; ``Pack.sync`` copies a run's trained weights
back into its own model (for its evaluation and diagnostics, exactly as alone); ``Pack.drop``
compacts stopped runs out, parameters and Adam state alike; ``Pack.adam_state`` and
``load_adam_state`` take a run's Adam state out for its checkpoint and put it back.
"""

from __future__ import annotations

import logging
import sys

import torch

from kernelzoo.core import rules
from kernelzoo.core.model import EMBED_FACTOR, RetrievalModel, read_out, retrieval_loss
from kernelzoo.core.task import Batch

# What a compiled step runs eagerly (a graph break; the rest of the step compiles): a rule's
# functions whose Python loops would unroll when traced (``UpdateRule.eager``: fwm's state, over
# its writes); a map names its own (``FeatureMap.eager``)
EAGER = tuple((sys.modules[type(rule).__module__], name)
              for rule in rules.RULES.values() for name in rule.eager)

LOG = logging.getLogger("kernelzoo.train")
# A compiled step is kept only if, on its first batch, its losses and gradients are the eager
# step's within this (relative to each tensor's largest entry; float32 rounds differently)
COMPILED_TOLERANCE = {torch.float64: 1e-8, torch.float32: 1e-3, torch.bfloat16: 5e-2,
                      torch.float16: 5e-2}


def compiles(setting: str, device: torch.device) -> bool:
    """Whether ``trainer.compile`` compiles the step on ``device``: auto does on cuda, where a
    step is hundreds of tiny kernel launches; on the CPU it does not (compiling costs seconds to
    minutes per shape and map in each worker, more than short runs save, and what it gains
    depends on the CPU and the pack: ``make bench``, rows with case packed)."""
    return setting == "true" or (setting == "auto" and device.type == "cuda")


def _index(segments: list[tuple[int, int]], device) -> torch.Tensor:
    return torch.cat([torch.arange(a, a + n, device=device) for a, n in segments])


class Pack:
    """The runs' models trained as one (module docstring). ``models`` share map, d_key and
    memory; their n_keys may differ."""

    def __init__(self, models: list[RetrievalModel]):
        first = models[0]
        self.models = models
        self.sizes = [m.n_keys for m in models]
        self.S = max(self.sizes)
        self.names = [n for n, _ in first.named_parameters() if not n.startswith("phi.")]
        stateful = any(True for _ in first.phi.parameters()) or any(True for _ in first.phi.buffers())
        self.phis = [m.phi for m in models] if stateful else [first.phi]
        self.params = {n: torch.stack([self._pad(n, m, m.get_parameter(n).detach())
                                       for m in models]).requires_grad_() for n in self.names}
        self.compiled = None  # the compiled step's forward (``compile``)
        self.checked = False  # whether the compiled step was compared with the eager one

    def _segments(self, name: str, n_keys: int) -> list[list[tuple[int, int]]]:
        """Per dimension of parameter ``name``, where a run of ``n_keys`` keys sits in the
        padded tensor: (start, length) segments ([] where the dimension is not padded). The
        largest run's segments fill it, which gives the padded sizes."""
        S, e = n_keys, int(2 * n_keys * EMBED_FACTOR)
        table = {"embedding.weight": [[(0, S), (self.S, S)], [(0, e)]],
                 "W_k.weight": [[], [(0, S), (self.S, e)]],
                 "W_q.weight": [[], [(0, e)]]}
        if name.startswith("W_") and name.endswith(".weight") and name not in table:
            return [[], [(0, S), (self.S, e)]]  # a gate's, like W_k's (W_beta, W_alpha)
        return table.get(name, [])

    def _pad(self, name: str, model: RetrievalModel, t: torch.Tensor) -> torch.Tensor:
        full = self._segments(name, self.S)
        for dim, segments in enumerate(self._segments(name, model.n_keys)):
            if segments:
                shape = list(t.shape)
                shape[dim] = sum(n for _, n in full[dim])
                t = t.new_zeros(shape).index_copy(dim, _index(segments, t.device), t)
        return t

    def _unpad(self, name: str, model: RetrievalModel, t: torch.Tensor) -> torch.Tensor:
        for dim, segments in enumerate(self._segments(name, model.n_keys)):
            if segments:
                t = t.index_select(dim, _index(segments, t.device))
        return t

    def parameters(self) -> list[torch.Tensor]:
        """What the optimizer updates: the stacked parameters, then each run's map parameters."""
        return list(self.params.values()) + [p for phi in self.phis for p in phi.parameters()]

    @torch.no_grad()
    def sync(self, i: int) -> None:
        """Copy run i's trained weights from the pack into its own model."""
        model = self.models[i]
        for n in self.names:
            model.get_parameter(n).copy_(self._unpad(n, model, self.params[n][i]))

    def drop(self, leaving: list[int], opt: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """Compact the runs ``leaving`` out of the pack; the optimizer for the runs that stay,
        with their Adam state (``opt`` must hold exactly ``parameters()``)."""
        keep = [i for i in range(len(self.models)) if i not in leaving]
        if not keep:
            return opt
        index = torch.tensor(keep, dtype=torch.long, device=self.params["W_k.weight"].device)
        old = {p: opt.state.get(p, {}) for p in self.parameters()}
        stacked = {n: p.detach().index_select(0, index).requires_grad_()
                   for n, p in self.params.items()}
        moved = {stacked[n]: {k: v.index_select(0, index) if torch.is_tensor(v) and v.dim() else v
                              for k, v in old[p].items()} for n, p in self.params.items()}
        self.params, self.models = stacked, [self.models[i] for i in keep]
        self.sizes = [self.sizes[i] for i in keep]
        if len(self.phis) > 1:
            self.phis = [self.phis[i] for i in keep]
        self.checked = False  # a new shape: compiled anew, so compared with eager anew
        new = type(opt)(self.parameters(), **opt.defaults)
        for p in self.parameters():
            state = moved.get(p, old.get(p))
            if state:
                new.state[p] = state
        return new

    def adam_state(self, i: int, opt: torch.optim.Optimizer) -> dict[str, dict]:
        """Run i's Adam state by parameter name, unpadded and copied: what its checkpoint keeps.
        A map with parameters is the run's own (``self.phis``), so its model names them."""
        model, out = self.models[i], {}
        for n, p in self.params.items():
            out[n] = {k: self._unpad(n, model, v[i]) if v.dim() else v
                      for k, v in opt.state.get(p, {}).items()}
        for n, p in model.phi.named_parameters(prefix="phi"):
            out[n] = dict(opt.state.get(p, {}))
        return {n: {k: v.clone() for k, v in state.items()} for n, state in out.items()}

    def load_adam_state(self, opt: torch.optim.Optimizer, states: list[dict[str, dict]]) -> None:
        """Put each run's saved Adam state (``adam_state``) into ``opt``, which holds exactly
        ``parameters()``; the runs must share their step count, as stacked tensors share it.
        Every tensor is a new one: the optimizer updates them in place."""
        for n, p in self.params.items():
            if states[0].get(n):
                opt.state[p] = {k: torch.stack([self._pad(n, m, s[n][k]) for m, s in
                                                zip(self.models, states)]) if v.dim() else v.clone()
                                for k, v in states[0][n].items()}
        for model, state in zip(self.models, states):
            for n, p in model.phi.named_parameters(prefix="phi"):
                if state.get(n):
                    opt.state[p] = {k: v.clone() for k, v in state[n].items()}

    def losses(self, batches: list[Batch]) -> torch.Tensor:
        """Each run's training loss (R,) on its own batch (its mean over the batch)."""
        L = max(b.keys.shape[1] for b in batches)
        keys = torch.stack([_pad_positions(b.keys, L) for b in batches])      # (R, B, L)
        values = torch.stack([_pad_positions(b.values, L) for b in batches])
        query = torch.stack([b.query for b in batches])                        # (R, B, 1)
        target = torch.cat([b.target for b in batches])                        # (R B, 1)
        B, device = keys.shape[1], keys.device
        mask = value_mask = None
        if any(b.keys.shape[1] != L for b in batches):
            lengths = torch.tensor([b.keys.shape[1] for b in batches], device=device)
            mask = (torch.arange(L, device=device) < lengths[:, None]).repeat_interleave(B, 0)
        if self.models[0].rule.layer_norm and min(self.sizes) < self.S:
            sizes = torch.tensor(self.sizes, device=device)
            value_mask = (torch.arange(self.S, device=device) < sizes[:, None]).repeat_interleave(B, 0)
        if not self.models[0].softmax:
            for phi in self.phis:
                phi.maybe_redraw()
        args = (self.params, keys, values, query, target, mask, value_mask)
        if self.compiled is None:
            return self._forward(*args)
        try:
            if not self.checked:  # its gradients compile the backward too, and use up its graph
                differs = self._compiled_differs(self.compiled(*args), args)
                self.checked = True
                if differs:
                    self._eager("the compiled step differs from the eager one", differs)
                    return self._forward(*args)
            return self.compiled(*args)
        except Exception as err:  # no C++ compiler, an op the compiler cannot take, ...
            self._eager("compilation failed", str(err).splitlines()[0] if str(err) else
                        type(err).__name__)
            return self._forward(*args)

    def _compiled_differs(self, losses: torch.Tensor, args) -> str | None:
        """Where the compiled step's losses or gradients differ from the eager step's on the same
        batch (relative to each tensor's largest entry; COMPILED_TOLERANCE), or None. Runs the
        backward of ``losses``: custom autograd functions free what their backward used."""
        named = [*self.params.items(), *((f"phi.{n}", p) for phi in self.phis
                                          for n, p in phi.named_parameters())]
        names, params = zip(*[(n, p) for n, p in named if p.requires_grad])
        eager = self._forward(*args)
        pairs = [("loss", losses.detach(), eager.detach())]
        grads = torch.autograd.grad(losses.sum(), params, allow_unused=True)
        grads_eager = torch.autograd.grad(eager.sum(), params, allow_unused=True)
        pairs += [(f"gradient of {n}", g, e) for n, g, e in zip(names, grads, grads_eager)
                  if g is not None or e is not None]
        for name, got, want in pairs:
            got = torch.zeros_like(want) if got is None else got
            want = torch.zeros_like(got) if want is None else want
            scale = want.abs().max().clamp_min(torch.finfo(want.dtype).tiny)
            diff = ((got - want).abs().max() / scale).item()
            if not diff <= COMPILED_TOLERANCE[want.dtype]:
                return f"{name}: max relative difference {diff:.1e}"
        return None

    def _eager(self, why: str, detail: str) -> None:
        """Train eagerly from now on, and say so in one line."""
        LOG.warning("trainer.compile: %s (%s); training eagerly", why, detail)
        print(f"warning: trainer.compile: {why} ({detail}); training eagerly", file=sys.stderr)
        self.compiled = None

    def _forward(self, params, keys, values, query, target, mask, value_mask):
        """The step's forward on prepared tensors: what ``compile`` compiles."""
        first, R = self.models[0], keys.shape[0]
        k, q, gates = self._keys_and_query(params, keys, values, query)
        y = read_out(self.phis, k, q, gates, values.flatten(0, 1), self.S, first.update_rule,
                     first.normalisation, first.eps, first.key_eps, first.chunk_size,
                     mask=mask, value_mask=value_mask)
        return retrieval_loss(y, target).view(R, -1).mean(1)

    def compile(self) -> None:
        """Compile the step's forward (and through AOTAutograd its backward) with
        ``torch.compile``: compiled code is cached per process (a sweep worker) and shape, so a
        worker compiles once per shape and map, not per run. The first step of each shape (the
        first, and after each ``drop``) also runs eagerly and compares the two (losses and
        gradients, COMPILED_TOLERANCE): if they differ, or if compilation fails, it says so in
        one line and the pack trains eagerly."""
        _keep_eager(self.phis)
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
        self.compiled = torch.compile(self._forward)

    def _keys_and_query(self, p, keys, values, query):
        """``RetrievalModel.keys_and_query`` for every run at once: (R B, L, d_key) keys,
        (R B, 1, d_key) queries, the rule's gates {name: (R B, L)}."""
        S = self.S
        table = p["embedding.weight"][:, :S]                                  # (R, S, e)
        W_k = p["W_k.weight"]
        key_rows = table @ W_k[:, :, S:].transpose(1, 2) + p["W_k.bias"].unsqueeze(1)
        k = _rows(key_rows, keys) + _rows(W_k[:, :, :S].transpose(1, 2), values)
        # the whole table (contiguous): its key rows [0, S) are what queries index
        rows = _rows(p["embedding.weight"], query).flatten(1, 2)              # (R, B, e)
        q = torch.baddbmm(p["W_q.bias"].unsqueeze(1), rows, p["W_q.weight"].transpose(1, 2))
        q = q.unsqueeze(2)                                                     # (R, B, 1, d)
        gates = {}
        for gate in self.models[0].rule.gates:
            w = p[f"W_{gate}.weight"][:, 0]                                     # (R, S + e)
            rows = table @ w[:, S:, None] + p[f"W_{gate}.bias"][:, None]       # (R, S, 1)
            g = torch.sigmoid(_rows(rows, keys) + _rows(w[:, :S, None], values)).squeeze(-1)
            gates[gate] = g.flatten(0, 1)
        return k.flatten(0, 1), q.flatten(0, 1), gates


def _rows(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """table[r, index[r]] for every run r: tables (R, N, d), index (R, ...) -> (R, ..., d)."""
    R, N = table.shape[:2]
    offset = (torch.arange(R, device=index.device) * N).view(R, *([1] * (index.dim() - 1)))
    flat = table.reshape(R * N, *table.shape[2:])
    return flat.index_select(0, (index + offset).reshape(-1)).view(*index.shape, *table.shape[2:])


def _pad_positions(x: torch.Tensor, length: int) -> torch.Tensor:
    """(B, L) symbols padded to ``length`` with symbol 0 (a real key: masked, never 0 / 0)."""
    return torch.nn.functional.pad(x, (0, length - x.shape[1])) if x.shape[1] < length else x


def _keep_eager(phis) -> None:
    """``torch.compiler.disable`` on each function of EAGER, in its module, and on each method
    the pack's maps name (``FeatureMap.eager``), in their class, once: done when a pack first
    compiles rather than at import, as it imports ``torch._dynamo`` (seconds in every process,
    most of which never compile)."""
    for owner, name in [*EAGER, *((type(phi), name) for phi in phis for name in type(phi).eager)]:
        fn = getattr(owner, name)
        if not getattr(fn, "_torchdynamo_disable", False):
            setattr(owner, name, torch.compiler.disable(fn))
