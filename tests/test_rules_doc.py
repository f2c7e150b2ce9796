"""docs/analysis.md states every rule once, by hand: the numbers its constants table gives are
the code's constants, so a constant changed in the code without the document fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kernelzoo.analysis import (capacity, censored, compare, factorial, flags, intervals,
                                labels, optimisation, prediction, rankings, stalls, tiers)
from kernelzoo.config import AnalyzeConfig

DOC = Path(__file__).resolve().parents[1] / "docs" / "analysis.md"

CONSTANTS = {
    "tau (`threshold`)": AnalyzeConfig().threshold,
    "`accuracy_threshold`": AnalyzeConfig().accuracy_threshold,
    "`LOSS_FLOOR`": capacity.LOSS_FLOOR,
    "`PLATEAU_PROBES`": capacity.PLATEAU_PROBES,
    "`PLATEAU_FLAT`": capacity.PLATEAU_FLAT,
    "`PLATEAU_SPAN`": capacity.PLATEAU_SPAN,
    "`TOUCH`": flags.TOUCH,
    "`LEVEL`": intervals.LEVEL,
    "`MIN_POINTS`": censored.MIN_POINTS,
    "`STALL_MAX_DEAD`": stalls.STALL_MAX_DEAD,
    "`ACCURACY_TOLERANCE`": stalls.ACCURACY_TOLERANCE,
    "`GAP`": rankings.GAP,
    "`LOSS_FIRST`": rankings.LOSS_FIRST,
    "`PARTIAL`": tiers.PARTIAL,
    "`COLLAPSE`": rankings.COLLAPSE,
    "`SIZE_SPREAD`": labels.SIZE_SPREAD,
    "`MARGIN`": optimisation.MARGIN,
    "`ALPHA`": optimisation.ALPHA,
    "factorial `LEVEL`": factorial.LEVEL,
    "`NEAR`": prediction.NEAR,
    "compare `LEVEL`": compare.LEVEL,
    "`DECIDE`": compare.DECIDE,
}


def documented() -> dict[str, float]:
    """The constants table of docs/analysis.md: first column -> value."""
    rows = re.findall(r"^\| ([^|]+?) \| ([0-9.e+-]+) \| ", DOC.read_text(), flags=re.M)
    return {name: float(value) for name, value in rows}


@pytest.mark.parametrize("name", sorted(CONSTANTS))
def test_each_constant_of_the_code_is_the_number_the_rules_state(name):
    assert documented()[name] == pytest.approx(CONSTANTS[name], rel=0, abs=0), name


def test_the_table_documents_no_constant_the_test_does_not_check():
    assert set(documented()) == set(CONSTANTS)


def test_no_module_slices_its_docstring_into_report_text():
    src = Path(capacity.__file__).resolve().parents[1]
    for path in (src / "analysis").glob("*.py"):
        assert "__doc__.partition" not in path.read_text(), path
        assert "__doc__.split(\"\\n\\n\", 1)" not in path.read_text(), path
