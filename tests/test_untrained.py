"""The untrained map's ranks (kernelzoo.training.untrained): a plain SVD of phi applied to the
untrained model's written keys, and the numbers the committed runs recorded before their first
step, computed again with no training."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TINY
from omegaconf import OmegaConf

from kernelzoo import config
from kernelzoo.core.diagnostics import RANK_RTOL
from kernelzoo.core.model import RetrievalModel
from kernelzoo.core.task import RetrievalTask
from kernelzoo.maps.catalog import build_feature_map
from kernelzoo.training.runner import PROBE_OFFSET
from kernelzoo.training.untrained import at_d_dot, main, untrained_ranks

REFERENCE = Path(__file__).resolve().parents[1] / "results" / "reference"


def plain_ranks(features: np.ndarray) -> tuple[float, float]:
    """Mean over sequences of (numerical rank, exp(entropy of the normalised singular values))."""
    ranks, effective = [], []
    for f in features:
        s = np.linalg.svd(f, compute_uv=False)
        ranks.append(int((s > RANK_RTOL * s[0]).sum()))
        p = s / s.sum()
        p = p[p > 0]
        effective.append(math.exp(-(p * np.log(p)).sum()))
    return float(np.mean(ranks)), float(np.mean(effective))


def test_the_untrained_ranks_are_those_of_elu_plus_one_on_the_untrained_keys():
    seed, n_keys, d_key = 3, 4, 4
    cfg = config.compose("config", [*TINY, "feature_map=elu", f"d_key={d_key}",
                                    f"n_keys={n_keys + 2}", f"seed={seed}"])
    with config.as_job(cfg) as job:
        rank, effective = at_d_dot(job)  # ELU+1: d_dot = d_key, so measured at n_keys = 4
    # the spec's keys, written out: k_l = W_k [onehot(value_l), E[key_l]] + b_k, phi = elu + 1
    torch.manual_seed(seed)
    model = RetrievalModel(n_keys, build_feature_map("elu", d_key=d_key))
    batch = RetrievalTask(n_keys, n_keys, n_keys, False, seed + PROBE_OFFSET,
                          torch.device("cpu")).eval_batch(4, 200)  # trainer=smoke: 4 sequences
    x = torch.cat([torch.nn.functional.one_hot(batch.values, n_keys).float(),
                   model.embedding.weight[batch.keys]], dim=-1)
    keys = (x @ model.W_k.weight.T + model.W_k.bias).detach().double().numpy()
    features = np.where(keys > 0, keys + 1, np.exp(keys))
    assert features.shape == (4, n_keys, d_key)
    want = plain_ranks(features)
    assert rank == want[0] and effective == pytest.approx(want[1], rel=1e-6)
    assert 1 < effective < rank <= d_key  # unequal directions: fewer effective than counted


def test_softmax_has_no_untrained_rank():
    cfg = config.compose("config", [*TINY, "feature_map=softmax"])
    with config.as_job(cfg) as job:
        assert untrained_ranks(job) == (None, None)
        assert at_d_dot(job) == (None, None)


@pytest.mark.parametrize("run", ["cosformer-dkey32-S64-sum-seed2-b2e70474",
                                 "taylor-dkey10-S66-sum-seed1-81e5ea75"])
def test_a_committed_run_recorded_what_its_untrained_map_measures(run):
    """The zoo's summaries carry these numbers from a trained run's initialisation: computed
    again from its config.yaml alone, with no training step, they are the same (the effective
    rank to float32's last digits)."""
    path = REFERENCE / "zoo" / "runs" / run
    recorded = json.loads((path / "summary.json").read_text())
    rank, effective = untrained_ranks(OmegaConf.load(path / "config.yaml"))
    assert rank == recorded["phi_rank_initial"]
    assert effective == pytest.approx(recorded["phi_effective_rank_initial"], rel=1e-6)
    assert at_d_dot(OmegaConf.load(path / "config.yaml")) == (rank, effective)  # n_keys = d_dot


def test_the_command_prints_each_config_and_names_a_bad_one(tmp_path, capsys):
    run = REFERENCE / "zoo" / "runs" / "cosformer-dkey32-S64-sum-seed2-b2e70474" / "config.yaml"
    main([str(run)])
    assert capsys.readouterr().out == (f"{run}: untrained rank 64.0, effective rank "
                                       "42.765916288358206 at n_keys = d_dot\n")
    for text, words in (("n_keys: [\n", "expected the node content"),
                        ("n_keys: -3\n",
                         "n_keys=-3 is invalid; valid: an integer from 1 to 1048576")):
        (tmp_path / "bad.yaml").write_text(text)
        with pytest.raises(SystemExit) as err:
            main([str(tmp_path / "bad.yaml")])
        assert str(err.value).startswith(f"error: {tmp_path / 'bad.yaml'}: ")
        assert words in str(err.value) and "\n" not in str(err.value)
