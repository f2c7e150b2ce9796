"""The associative-retrieval task (task-spec "Data"), generated on the training device.

Setting 1 (``capacity``): a sequence of length ``S`` stores every key symbol once, in random
order, each with a value from an independent random permutation. Setting 2 (``update``): keys and
values are drawn with replacement, so a key can be rewritten and the answer is the value of its
LAST occurrence. Every batch is drawn fresh from a seeded ``torch.Generator`` with batched ops.

A batch holds symbol indices, never one-hot tensors: ``keys``, ``values`` (B, L) in ``[0, S)``;
``query``, ``target`` (B, Q); ``mask`` (B, Q) marks real queries (padding when sequences of
Setting 2 hold different numbers of distinct keys).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Batch:
    keys: torch.Tensor
    values: torch.Tensor
    query: torch.Tensor
    target: torch.Tensor
    mask: torch.Tensor


class RetrievalTask:
    """Samples of Setting 1 (``replacement=False``) or Setting 2 (``replacement=True``)."""

    def __init__(self, n_keys: int, seq_len: int, eval_seq_len: int, replacement: bool,
                 seed: int, device: torch.device):
        self.n_keys, self.seq_len, self.eval_seq_len = n_keys, seq_len, eval_seq_len
        self.replacement = replacement
        self.device = device
        self.generator = torch.Generator(device=device).manual_seed(seed)
        # evaluation draws from its own stream, so eval settings never change the training data
        self.eval_generator = torch.Generator(device=device).manual_seed(seed + 1_000_003)

    def _sequences(self, batch_size: int, length: int, g: torch.Generator):
        shape, dev = (batch_size, length), self.device
        if self.replacement:
            keys = torch.randint(self.n_keys, shape, generator=g, device=dev)
            values = torch.randint(self.n_keys, shape, generator=g, device=dev)
        else:  # a random permutation per row: argsort of uniform noise
            keys = torch.rand(shape, generator=g, device=dev).argsort(dim=1)
            values = torch.rand(shape, generator=g, device=dev).argsort(dim=1)
        return keys, values

    def _last_value(self, keys: torch.Tensor, values: torch.Tensor, query: torch.Tensor):
        """Value paired with the last occurrence of each query key (B, Q); -1 where absent."""
        L = keys.shape[1]
        hit = keys.unsqueeze(2) == query.unsqueeze(1)  # (B, L, Q)
        pos = torch.arange(L, device=keys.device).view(1, L, 1)
        last = torch.where(hit, pos, -1).amax(dim=1)  # (B, Q)
        found = last >= 0
        target = values.gather(1, last.clamp(min=0))
        return torch.where(found, target, -1), found

    def train_batch(self, batch_size: int) -> Batch:
        """One query per sequence: the key at a uniformly drawn position, target its last value."""
        keys, values = self._sequences(batch_size, self.seq_len, self.generator)
        pos = torch.randint(self.seq_len, (batch_size, 1), generator=self.generator,
                            device=self.device)
        query = keys.gather(1, pos)
        target, mask = self._last_value(keys, values, query)
        return Batch(keys, values, query, target, mask)

    def eval_batch(self, n_sequences: int, max_queries: int) -> Batch:
        """Every distinct key of each sequence with key index < ``max_queries`` (authors' cap)."""
        keys, values = self._sequences(n_sequences, self.eval_seq_len, self.eval_generator)
        n_query = min(self.n_keys, max_queries)
        query = torch.arange(n_query, device=self.device).expand(n_sequences, n_query)
        target, mask = self._last_value(keys, values, query)
        return Batch(keys, values, query.contiguous(), target.clamp(min=0), mask)
