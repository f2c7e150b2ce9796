"""What an update rule of the fast-weight memory is: the contract every file of this package
fills (reference document §1.2, the fast weight programmer; task spec "Model").

A rule programs the state W (B, d_v, D), W^(0) = 0, with one instruction per written pair
(phi(k_l), v_l) and its per-step gates, and is read by the Q queries against the final state.
The keys and queries a rule receives are already normalised (``memory.read``) and masked (a
pack's padding writes nothing: its k, beta are 0 and its alpha 1). Each rule gives:

- ``step``: the literal instruction, W^(l) from W^(l-1) (the reference recurrence,
  ``memory.read_reference``, and the test oracle of ``read``);
- ``read``: the production path, y = W^(L) phi(q) for every query, however it is computed;
- ``finish``: the output head (default: the attention denominator where normalisation asks);
- the facts other layers ask instead of its name: its gates, whether ``normalisation`` applies,
  the extra rank of its read-out (``analysis.rank_bound``), whether the read-out is a LayerNorm
  over the value slots (a pack then masks padded slots), whether training flushes denormals
  (``training.devices``), and the bytes its read holds (``training.footprint``).
"""

from __future__ import annotations

from dataclasses import dataclass

@dataclass(frozen=True)
class Sizes:
    """What the memory estimate knows of one read: N sequences of L written pairs, Q queries each,
    D features, S value slots, b bytes a number, the rule's chunk_size; and the bytes already
    held when the read starts (``base``: features, sum-normalised copies where they are made,
    one-hot values, gates and masks; ``keys``: the projected keys and queries, alive through
    the read-out; ``values``: the one-hot values alone; ``gates``: beta (and alpha)'s bytes;
    ``features``: what phi(k) and its backward keep)."""

    N: int
    L: int
    Q: int
    D: int
    S: int
    b: int
    chunk_size: int
    base: float = 0.0
    keys: float = 0.0
    values: float = 0.0
    gates: float = 0.0
    features: float = 0.0

    @property
    def state(self) -> int:
        return self.N * self.S * self.D * self.b


class UpdateRule:
    """The contract (module docstring). Subclasses set the facts and implement ``step`` and
    ``read``; the defaults describe a rule read through the attention denominator."""

    name: str = ""
    gates: tuple[str, ...] = ()      # per-step scalars in (0, 1) made from x_l: "beta", "alpha"
    normalised: bool = True          # whether memory.normalisation applies to its keys
    extra_rank: int | None = 0       # the read-out's rank beyond d_dot; None: no bound
    layer_norm: bool = False         # the output is a LayerNorm over the value slots
    by_scores: bool = False          # read through FeatureMap.scores, no features formed
    gate_bias: dict[str, float] = {}  # a gate's initial bias, where not nn.Linear's
    eager: tuple[str, ...] = ()      # functions of its module a compiled step runs eagerly

    @property
    def erases(self) -> bool:
        """Whether a write can overwrite what a key held (a beta gate), not only add to it."""
        return "beta" in self.gates

    def step(self, W, k_l, v_l, beta_l, alpha_l, l: int):
        """W^(l) (B, d_v, D) from W^(l-1), key k_l (B, D), value v_l (B, d_v), gates (B,)."""
        raise NotImplementedError

    def read(self, k, v, q, beta, alpha, chunk_size: int):
        """y (B, Q, d_v) = W^(L) q for keys k (B, L, D), values v (B, L, d_v), queries q
        (B, Q, D), gates (B, L) or None: the production path."""
        raise NotImplementedError

    def finish(self, y, phi_k, q, normalisation: str, eps: float, value_mask=None):
        """The output head: y / (z . phi(q) + eps), z = sum_l phi(k_l), under the attention
        normalisation (Katharopoulos et al. 2020; reference §1.3), else y as it is."""
        if normalisation == "attention":
            z = phi_k.sum(1)  # (B, D)
            return y / ((q @ z.unsqueeze(-1)) + eps)
        return y

    def divides_by_feature_sum(self, normalisation: str) -> bool:
        """Whether keys and queries are divided by the sum of their features (§7.2)."""
        return self.normalised and normalisation == "sum"

    def has_denominator(self, normalisation: str) -> bool:
        """Whether the read-out divides by a sum of features that can come near zero: the
        attention denominator, or the sum normalisation's feature sums."""
        return self.normalised and normalisation in ("attention", "sum")

    def flushes_denormals(self, training: bool, normalisation: str) -> bool:
        """Whether ``devices.flush_denormals`` "auto" flushes here (its docstring says why)."""
        return False

    def train_bytes(self, s: Sizes) -> tuple[list[float], float, list[float]]:
        """The memory estimate of ``read`` in a training step (``training.footprint``), in
        bytes: the peaks of its forward, what it keeps for the backward, and the peaks of its
        backward, each counting what ``s`` holds (``s.base``, ``s.keys``: as the terms say)."""
        raise NotImplementedError

    def eval_bytes(self, s: Sizes) -> float:
        """The peak of ``read`` without gradients (an evaluation), in bytes, ``s.base``
        included."""
        raise NotImplementedError


def recurrent_state(rule: UpdateRule, k, v, beta, alpha):
    """Final fast weights W (B, d_v, D) by ``rule.step``, one literal update per written pair."""
    B, L, D = k.shape
    W = k.new_zeros(B, v.shape[-1], D)
    for l in range(L):
        W = rule.step(W, k[:, l], v[:, l], None if beta is None else beta[:, l],
                      None if alpha is None else alpha[:, l], l)
    return W


def delta_step(W, k_l, v_l, beta_l):
    """The delta instruction: v_bar = W k_l; W + beta_l (v_l - v_bar) k_l^T."""
    v_bar = (W @ k_l[:, :, None]).squeeze(-1)
    return W + beta_l[:, None, None] * (v_l - v_bar)[:, :, None] * k_l[:, None, :]

