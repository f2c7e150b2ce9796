"""Tests for kernelzoo.core.task: the associative-retrieval data of task-spec "Data".

Setting 1 (capacity, no replacement) and Setting 2 (update rule, with replacement), training and
evaluation batches, the authors' query cap, seeding, device and dtype. Every expected value is
recomputed with plain Python loops over the batch tensors.
"""

import pytest
import torch

from kernelzoo.core.task import Batch, RetrievalTask

torch.set_num_threads(1)

CPU = torch.device("cpu")


def setting1(S=10, seed=1):
    return RetrievalTask(S, S, S, replacement=False, seed=seed, device=CPU)


def setting2(S=10, seed=1, eval_seq_len=None):
    return RetrievalTask(S, 2 * S, eval_seq_len or S, replacement=True, seed=seed, device=CPU)


def last_value(keys_row, values_row, key):
    """Value at the LAST occurrence of key in the row, None when absent (plain Python)."""
    answer = None
    for k, v in zip(keys_row.tolist(), values_row.tolist()):
        if k == key:
            answer = v
    return answer


def same_batch(a: Batch, b: Batch) -> bool:
    return all(torch.equal(getattr(a, f), getattr(b, f))
               for f in ("keys", "values", "query", "target", "mask"))


def assert_shapes(batch: Batch, B: int, L: int, Q: int):
    assert batch.keys.shape == batch.values.shape == (B, L)
    assert batch.query.shape == batch.target.shape == batch.mask.shape == (B, Q)


# ---------------------------------------------------------------------------- Setting 1


@pytest.mark.parametrize("S", [1, 7, 20])
def test_setting1_train_sequences_are_permutations(S):
    task = setting1(S)
    assert task.seq_len == S
    batch = task.train_batch(16)
    assert_shapes(batch, 16, S, 1)
    for b in range(16):
        assert sorted(batch.keys[b].tolist()) == list(range(S))
        assert sorted(batch.values[b].tolist()) == list(range(S))


def test_setting1_keys_and_values_are_independent_permutations():
    """Values are an independent permutation, not a copy of the keys' order (and not sorted)."""
    batch = setting1(12).train_batch(64)
    assert not torch.equal(batch.keys, batch.values)
    assert not (batch.keys == torch.arange(12)).all(dim=1).any()
    # the pairing key -> value differs across rows
    pairs = {tuple(batch.values[b][batch.keys[b].argsort()].tolist()) for b in range(64)}
    assert len(pairs) > 1


def test_setting1_train_target_is_the_paired_value():
    S, B = 9, 32
    batch = setting1(S).train_batch(B)
    assert batch.mask.all()
    for b in range(B):
        q = batch.query[b, 0].item()
        assert q in batch.keys[b].tolist()  # the query key is in the sequence
        pos = batch.keys[b].tolist().index(q)
        assert batch.target[b, 0].item() == batch.values[b, pos].item()


def test_setting1_train_queries_cover_many_keys():
    """The query is drawn from the sequence, not a fixed key or position."""
    batch = setting1(10).train_batch(200)
    assert len(set(batch.query[:, 0].tolist())) == 10
    positions = [batch.keys[b].tolist().index(batch.query[b, 0].item()) for b in range(200)]
    assert len(set(positions)) == 10


def test_setting1_eval_batch():
    S, n = 11, 5
    task = setting1(S)
    batch = task.eval_batch(n, max_queries=200)
    assert_shapes(batch, n, S, S)
    assert batch.mask.all()
    for b in range(n):
        assert sorted(batch.keys[b].tolist()) == list(range(S))
        assert sorted(batch.values[b].tolist()) == list(range(S))
        assert batch.query[b].tolist() == list(range(S))  # every key of the sequence
        for j in range(S):
            assert batch.target[b, j].item() == last_value(batch.keys[b], batch.values[b], j)


# ---------------------------------------------------------------------------- Setting 2


def test_setting2_train_sequences_with_replacement():
    S, B = 10, 64
    task = setting2(S)
    assert task.seq_len == 2 * S
    batch = task.train_batch(B)
    assert_shapes(batch, B, 2 * S, 1)
    assert batch.keys.min() >= 0 and batch.keys.max() < S
    assert batch.values.min() >= 0 and batch.values.max() < S
    # L = 2S > S forces repeats in every row; values repeat as well (drawn with replacement)
    for b in range(B):
        assert len(set(batch.keys[b].tolist())) < 2 * S
    assert any(len(set(batch.values[b].tolist())) < S for b in range(B))
    # draws are not permutations: some key is missing from some sequence
    assert any(len(set(batch.keys[b].tolist())) < S for b in range(B))


def test_setting2_train_target_is_value_of_last_occurrence():
    S, B = 6, 256
    batch = setting2(S).train_batch(B)
    assert batch.mask.all()
    first_differs = 0
    for b in range(B):
        keys, values = batch.keys[b].tolist(), batch.values[b].tolist()
        q = batch.query[b, 0].item()
        assert q in keys
        expected = last_value(batch.keys[b], batch.values[b], q)
        assert batch.target[b, 0].item() == expected
        first_differs += values[keys.index(q)] != expected
    # the test discriminates: for many samples the first occurrence has another value
    assert first_differs > B // 10


def test_setting2_eval_batch():
    S, n, eval_len = 12, 8, 12
    task = setting2(S, eval_seq_len=eval_len)
    batch = task.eval_batch(n, max_queries=200)
    assert_shapes(batch, n, eval_len, S)
    absent = 0
    for b in range(n):
        assert batch.query[b].tolist() == list(range(S))
        for j in range(S):
            expected = last_value(batch.keys[b], batch.values[b], j)
            assert batch.mask[b, j].item() == (expected is not None)
            if expected is not None:
                assert batch.target[b, j].item() == expected
            else:
                absent += 1
                assert 0 <= batch.target[b, j].item() < S  # a valid index, masked out
    assert absent > 0  # with replacement some keys are missing from some sequences


@pytest.mark.parametrize("eval_len", [5, 24])
def test_setting2_eval_sequence_length_is_its_own(eval_len):
    S = 8
    task = setting2(S, eval_seq_len=eval_len)
    assert task.train_batch(3).keys.shape == (3, 2 * S)
    batch = task.eval_batch(4, max_queries=200)
    assert_shapes(batch, 4, eval_len, S)
    for b in range(4):
        for j in range(S):
            expected = last_value(batch.keys[b], batch.values[b], j)
            assert batch.mask[b, j].item() == (expected is not None)
            if expected is not None:
                assert batch.target[b, j].item() == expected


# --------------------------------------------------------------------- the authors' cap


@pytest.mark.parametrize("replacement", [False, True])
def test_eval_max_queries_caps_to_first_keys(replacement):
    S, cap, n = 15, 6, 4
    task = RetrievalTask(S, 2 * S if replacement else S, S, replacement, seed=3, device=CPU)
    batch = task.eval_batch(n, max_queries=cap)
    assert_shapes(batch, n, S, cap)
    for b in range(n):
        assert batch.query[b].tolist() == list(range(cap))  # keys 0..cap-1 by index
        for j in range(cap):
            expected = last_value(batch.keys[b], batch.values[b], j)
            assert batch.mask[b, j].item() == (expected is not None)
            if expected is not None:
                assert batch.target[b, j].item() == expected


def test_eval_max_queries_above_n_keys_queries_every_key():
    S = 7
    batch = setting1(S).eval_batch(2, max_queries=200)
    assert batch.query.shape == (2, S)
    batch = setting1(S).eval_batch(2, max_queries=S)
    assert batch.query.shape == (2, S)


# --------------------------------------------------------------------------- determinism


@pytest.mark.parametrize("make", [setting1, setting2])
def test_same_seed_same_batches(make):
    a, b = make(seed=5), make(seed=5)
    for _ in range(3):
        assert same_batch(a.train_batch(8), b.train_batch(8))
    assert same_batch(a.eval_batch(4, 200), b.eval_batch(4, 200))


@pytest.mark.parametrize("make", [setting1, setting2])
def test_different_seed_different_batches(make):
    a, b = make(seed=5), make(seed=6)
    assert not same_batch(a.train_batch(8), b.train_batch(8))
    assert not same_batch(a.eval_batch(4, 200), b.eval_batch(4, 200))


@pytest.mark.parametrize("make", [setting1, setting2])
def test_successive_batches_differ(make):
    task = make(seed=5)
    assert not same_batch(task.train_batch(8), task.train_batch(8))
    assert not same_batch(task.eval_batch(4, 200), task.eval_batch(4, 200))


@pytest.mark.parametrize("make", [setting1, setting2])
def test_eval_draws_do_not_change_training_stream(make):
    plain, with_eval = make(seed=2), make(seed=2)
    for step in range(4):
        if step % 2 == 0:
            with_eval.eval_batch(20, 200)  # drawn between two training batches
            with_eval.eval_batch(3, 5)
        assert same_batch(plain.train_batch(8), with_eval.train_batch(8))


@pytest.mark.parametrize("make", [setting1, setting2])
def test_training_draws_do_not_change_eval_stream(make):
    plain, with_train = make(seed=2), make(seed=2)
    with_train.train_batch(32)
    assert same_batch(plain.eval_batch(4, 200), with_train.eval_batch(4, 200))


# ------------------------------------------------------------------------- device, dtype


@pytest.mark.parametrize("make", [setting1, setting2])
def test_batches_on_requested_device_with_long_dtype(make):
    task = make()
    for batch in (task.train_batch(4), task.eval_batch(3, 200), task.eval_batch(3, 4)):
        for f in ("keys", "values", "query", "target"):
            t = getattr(batch, f)
            assert t.device == CPU, f
            assert t.dtype == torch.long, f
        assert batch.mask.device == CPU
        assert batch.mask.dtype == torch.bool
        assert batch.query.is_contiguous()
