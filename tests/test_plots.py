"""Tests of the published column and the figures on a synthetic figure2-like store (no training)."""

from __future__ import annotations

import pytest

from kernelzoo import published


def test_shipped_csv_names_are_all_known():
    table = published.load()
    assert len(table) == 240
    assert {published.configuration(name)[0] for name in table["feature_map"]} == {
        "elu", "dpfp", "favor", "softmax"}
    with pytest.raises(ValueError, match="unknown feature_map 'performer64'"):
        published.configuration("performer64")
