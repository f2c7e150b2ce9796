"""The rankings compared between sizes and why a family moves (analysis/between_sizes.py; the
report's section: report/rankings.py), on constructed capacity tables."""

import pandas as pd

from kernelzoo.analysis import between_sizes
from kernelzoo.report.rankings import between_sizes_section
from test_rankings import row


def two_sizes(extra=()):
    """Families at d_dot 64 and 128 by efficiency (the same in every view): F and G rise past
    E, B, C and D, which hold."""
    at = {"B": (0.8, 0.8), "C": (0.7, 0.7), "D": (0.6, 0.6), "E": (0.85, 0.85),
          "F": (0.4, 0.95), "G": (0.35, 0.9)}
    rows = [row(f"{name}{d_dot}", d_dot, e * d_dot, e * d_dot, e * d_dot)
            for name, pair in at.items() for d_dot, e in zip((64, 128), pair)]
    table = pd.DataFrame(rows + list(extra))
    return table, {label: label.rstrip("0123456789") for label in table["label"]}


def section(table, family) -> list[str]:
    """The report's section of ``table``'s pairs of sizes (``between_sizes.pairs``)."""
    return between_sizes_section(between_sizes.pairs(table, family))


def lines_of(table, family):
    return {line.split(" |")[0][2:]: line for line in section(table, family)
            if line.startswith("| ") and not line.startswith("| family")}


def test_a_family_moved_by_its_own_change_and_one_moved_by_others():
    table, family = two_sizes()
    lines = section(table, family)
    assert lines[0] == "### Between sizes: d_dot 64 and 128"
    assert "- accuracy: Spearman rho = -0.37 over 6 families." in lines
    got = lines_of(table, family)
    assert "**1 -> 3**" in got["E"] and "**5 -> 1**" in got["F"]
    assert ("accuracy efficiency held, 0.85 [0.83, 0.87] -> 0.85 [0.83, 0.87]: it swaps with "
            "F, G, whose efficiency changed") in got["E"]
    assert "accuracy efficiency rises, 0.40 [0.39, 0.41] -> 0.95 [0.93, 0.97]" in got["F"]
    assert got["F"].endswith("no measured cause (the same diagnostics at both sizes) |")


def test_a_fall_is_explained_by_what_was_measured_at_one_size_only():
    table, family = two_sizes([
        row("A64", 64, 0.99 * 64, 0.99 * 64, 0.99 * 64),
        row("A128", 128, 0.3 * 128, 0.3 * 128, 0.3 * 128, effective_rank_at_d_dot=10.0,
            effective_rank_at_d_dot_initial=40.0)])
    got = lines_of(table, {**family, "A64": "A", "A128": "A"})
    assert "**1 -> 7**" in got["A"]
    assert "accuracy efficiency falls, 0.99 [0.97, 1.01] -> 0.30 [0.29, 0.31]" in got["A"]
    assert got["A"].endswith("; rank collapse (effective rank 40 -> 10 in training) at d_dot 128 "
                             "only |")


def test_a_lower_bound_counts_as_the_half_line_it_allows():
    table, family = two_sizes([row("P64", 64, 12, 40, 120, outcome_keys="never_fails"),
                               row("P128", 128, 19, 54, 70)])
    got = lines_of(table, {**family, "P64": "P", "P128": "P"})
    assert "keys retrieved efficiency falls, >= 1.88 -> 0.55 [0.54, 0.56]" in got["P"]


def test_too_few_families_or_one_size_give_nothing():
    table, family = two_sizes()
    assert section(table[~table["label"].str[0].isin(["B", "C"])], family) == []
    assert section(table[table["predicted_capacity"] == 64], family) == []
    assert section(table, {}) == []


def test_a_fall_without_a_measured_cause_cites_the_arm_under_another_setting():
    """tanh under the attention normalisation falls from 0.9 to 0.3 d_dot (the same diagnostics
    at both sizes); its arm under normalisation none, 0.6 and 0.6, is the normalisation's
    measured share: x0.67 at d_dot 64, x2.00 at 128."""
    arms = {"tanh memory.normalisation=attention": (0.9, 0.3),
            "tanh memory.normalisation=none": (0.6, 0.6)}
    extra = [row(f"{name} {d_dot}", d_dot, e * d_dot, e * d_dot, e * d_dot)
             for name, pair in arms.items() for d_dot, e in zip((64, 128), pair)]
    table, family = two_sizes(extra)
    family = {**family, **{f"{name} {n}": name for name in arms for n in (64, 128)}}
    got = lines_of(table, family)["tanh memory.normalisation=attention"]
    assert "loss efficiency falls, 0.90 [0.88, 0.92] -> 0.30 [0.29, 0.31]" in got
    assert got.endswith(
        "the same diagnostics at both sizes; memory.normalisation=none beside it holds x0.67 at "
        "d_dot 64, x2.00 at 128 in loss; x0.67 at d_dot 64, x2.00 at 128 in accuracy; x0.67 at "
        "d_dot 64, x2.00 at 128 in keys retrieved (its efficiency over this one's: "
        "memory.normalisation's measured share) |"), got
