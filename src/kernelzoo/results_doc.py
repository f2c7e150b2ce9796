"""``docs/results.md`` and README's results summary, written from the committed stores so that no
number in them is typed by hand. Pure reading of analysed stores (capacity.csv, scaling.csv,
runs.parquet, sweep.json); never the trainer.

    python -m kernelzoo.results_doc           # rewrite docs/results.md, docs/analysis.md and
                                              # README's summary
    python -m kernelzoo.results_doc --check   # exit 1, naming the file, when one has drifted

Every study gets a section: what it runs (its experiment file's header), what it cost (runs,
training steps, run and sweep wall time, machine), its capacity table in the three views
(``capacity.py``), the published and d_dot comparisons where they apply, the d_dot law per
view (``scaling.py``), how far the views' rankings agree and, for a study run at several
learning rates or stopping rules, the optimisation test's verdicts (``optimisation.py``, on the
seeds' failure points of runs.parquet at the analysis' default thresholds). The last section
pools the prediction scores (``prediction.py``) over every store. README holds a short summary between
the markers ``<!-- results:start -->`` and ``<!-- results:end -->``. ``docs/analysis.md`` quotes
every rule from the docstring of the module that applies it.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

import pandas as pd
from kernelzoo.analysis import (between_sizes, factorial, optimisation, prediction, rankings,
                                scaling)
from kernelzoo.analysis.capacity import VIEW_WORDS, VIEWS, seed_table
from kernelzoo.config import AnalyzeConfig
from kernelzoo.records.files import atomic_write_text
from kernelzoo.analysis.rankings import view_rhos
from kernelzoo.report.markdown import observed, published
from kernelzoo.analysis.labels import bound, cell

ROOT = Path(__file__).resolve().parents[2]
STUDIES = ("quick", "figure2", "figure2_search", "figure3", "dot_scaling", "zoo",
           "favor_diagnosis", "lr_robustness", "lr_patience")
REPEATS = {"lr_patience": "lr_robustness"}  # a store whose runs repeat another's: pooled once
START, END = "<!-- results:start -->", "<!-- results:end -->"


def _header(experiment: str, root: Path) -> str:
    """The experiment file's header comment, without its first "name:" words."""
    path = root / "experiments" / f"{experiment}.yaml"
    lines = [line[2:] for line in path.read_text().splitlines()[1:]
             if line.startswith("# ")] if path.exists() else []
    text = " ".join((" ".join(lines).partition(": ")[2] if lines else "").split())
    return text[:1].upper() + text[1:]


def cost(store: Path) -> str:
    """"<runs> runs, <steps> training steps, <time> of run time; sweep wall clock <minutes> min
    over <n> invocations on <machines>", from the store's runs.parquet and sweep.json."""
    runs = pd.read_parquet(store / "runs.parquet")
    if "stall_check_of" in runs:
        runs = runs[runs["stall_check_of"].isna()]
    seconds = runs["wall_seconds"].sum()
    time = f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.1f} min"
    words = (f"{len(runs)} runs, {int(runs['steps'].fillna(0).sum()):,} training steps, "
             f"{time} of run time")
    sweep = store / "sweep.json"
    if sweep.exists():
        history = json.loads(sweep.read_text())
        machines = sorted({i.get("machine", "?") for i in history.get("invocations", [])})
        n = len(history.get("invocations", []))
        words += (f"; sweep wall clock {float(history['wall_seconds']) / 60:.1f} min over {n} "
                  f"invocation{'' if n == 1 else 's'} on {'; '.join(machines)}")
    return words


def capacity_lines(table: pd.DataFrame) -> list[str]:
    """The store's capacity table in the three views (median [interval] over seeds)."""
    lines = ["| configuration | d_dot | seeds | loss view | accuracy view | keys retrieved | "
             "rank bound | stalled runs |", "|---|---|---|---|---|---|---|---|"]
    for r in table.itertuples():
        lines.append(f"| {r.label} | {int(r.d_dot) if pd.notna(r.d_dot) else 'unbounded'} | "
                     f"{r.n_seeds} | {observed(r)} | {observed(r, 'accuracy')} | "
                     f"{observed(r, 'keys_retrieved')} | {cell(r.rank_bound)} | "
                     f"{int(r.stalled_runs)} |")
    return lines


def agreement(table: pd.DataFrame) -> str:
    """Spearman's rho between the views' efficiency orders (``rankings.view_rhos``)."""
    parts = [f"{VIEW_WORDS[v]} / {VIEW_WORDS[w]} {rho:.2f}" for v, w, rho, _ in view_rhos(table)]
    return ("Rank agreement of failure point / d_dot between views (Spearman rho): "
            + "; ".join(parts) + ".") if parts else ""


def optimisation_tables(store: Path) -> dict:
    """{setting: ``optimisation.table``} of the store's runs, for each setting with
    configurations at several levels; computed once per state of the store's files (the
    documents' section and README's summary both use it)."""
    stamp = tuple((f.stat().st_mtime_ns, f.stat().st_size) if f.exists() else None
                  for f in (store / "capacity.csv", store / "runs.parquet"))
    return _optimisation_tables(str(store), stamp)


@functools.lru_cache(maxsize=32)
def _optimisation_tables(store: str, stamp: tuple) -> dict:
    store = Path(store)
    table = pd.read_csv(store / "capacity.csv")
    if not any(s.level(label) for s in optimisation.SETTINGS for label in table["label"]):
        return {}
    runs = pd.read_parquet(store / "runs.parquet")
    if "stall_check_of" in runs:
        runs = runs[runs["stall_check_of"].isna()]
    defaults = AnalyzeConfig()
    seeds = seed_table(runs, defaults.threshold, defaults.accuracy_threshold)
    found = {s: optimisation.table(seeds, table, s) for s in optimisation.SETTINGS}
    return {s: f for s, f in found.items() if not f.empty}


def _rise(differences) -> str:
    """The level whose rise is shown furthest above 0: "+d [lower]" (``optimisation.table``)."""
    _, d, low, _ = max(differences, key=lambda x: x[2])
    return f"{d:+.3g} [{cell(low)}]"


def optimisation_verdicts(store: Path) -> list[str]:
    """The optimisation test's verdict per configuration, setting and view ([] without
    configurations at several levels of a setting): ``optimisation.table`` on the store's
    runs."""
    lines = []
    for setting, found in optimisation_tables(store).items():
        published = setting.words(setting.base)
        lines += [f"Does the failure point move with the {setting.heading.lower()}? The test of "
                  "the report's \"Capacity or optimisation?\" section (`docs/analysis.md`), "
                  f"{optimisation.TEST_WORDS[setting.test]}: \"moves\" when another level "
                  f"raises it above {published}'s (the rise in keys [its lower bound]), \"does not "
                  "move\" when none raises it by the margin, 0.1 d_dot keys, and undecided "
                  "otherwise; seed values that are bounds (never_fails, fails_everywhere) are "
                  "tested as values.", "",
                  "| configuration | margin (keys) | " + " | ".join(f"{VIEW_WORDS[v]} view"
                                                              for v in VIEWS) + " |",
                  "|---|---|" + "---|" * len(VIEWS)]
        for label, rows in found.groupby("label", sort=False):
            rows = rows.set_index("view")
            cells = []
            for v in VIEWS:
                r = rows.loc[v]
                words = r["verdict"] + (
                    f" (needs a margin above {cell(r['decided_at'])})"
                    if r["verdict"] == "undecided" else
                    f" ({_rise(r['differences'])})" if r["verdict"] == "moves" else "")
                bounds = sum(r["bounds"].values())
                cells.append(words + (f"; {bounds} of {r['values']} bounds" if bounds else ""))
            lines.append(f"| {label} | {cell(rows['margin'].iloc[0])} | " + " | ".join(cells)
                         + " |")
        lines.append("")
    return lines


def section(experiment: str, root: Path) -> list[str]:
    """One study's section ([] when the store is not analysed)."""
    store = root / "results" / "reference" / experiment
    if not (store / "capacity.csv").exists():
        return []
    table = pd.read_csv(store / "capacity.csv")
    lines = [f"## `{experiment}`", "", _header(experiment, root), "",
             f"Cost: {cost(store)}. Report: `results/reference/{experiment}/report.md`.", "",
             *capacity_lines(table), ""]
    theirs = table[table["published_outcome"].notna()]
    if len(theirs):
        lines += ["Loss view against the authors' published losses (same rule; with seeds, "
                  "where their one run lies, `published.verdict`): "
                  + "; ".join(f"{r.label} {observed(r)} against {published(r)}"
                              + (f" ({r.published_verdict})"
                                 if r.published_verdict not in ("one seed", None) else "")
                              for r in theirs.itertuples()) + ".", ""]
    rho = agreement(table)
    lines += [rho, ""] if rho else []
    lines += optimisation_verdicts(store)
    laws = pd.read_csv(store / "scaling.csv") if (store / "scaling.csv").exists() else None
    if laws is not None and not laws.empty and laws["d_dot"].groupby(laws["family"]).nunique().max() >= 2:
        lines += ["The d_dot law per view:", ""]
        lines += [f"- {scaling.sentence(group)}"
                  for _, group in laws.groupby(["family", "view"], sort=False)
                  if group["d_dot"].nunique() >= 2]
        lines.append("")
    lines += rankings.section(table, level=3)
    lines += between_sizes.section(table, families(store), level=3)
    if (store / "factorial.csv").exists():
        lines += factorial.summary(pd.read_csv(store / "factorial.csv"))
    return lines


def families(store: Path) -> dict[str, str]:
    """Configuration label -> its scaling family's name, from the store's scaling.csv ({} where
    it has none)."""
    path = store / "scaling.csv"
    laws = pd.read_csv(path) if path.exists() and path.stat().st_size else pd.DataFrame()
    return {label: r.family for r in laws.itertuples()
            for label in str(r.configurations).split("; ")} if len(laws) else {}


def predictions(root: Path) -> list[str]:
    """The pooled prediction scores of every store."""
    pooled = [e for e in STUDIES if e not in REPEATS
              and (root / "results" / "reference" / e / "capacity.csv").exists()]
    scores, _ = prediction.pooled([root / "results" / "reference" / e / "capacity.csv"
                                   for e in pooled])
    left_out = [f"`{e}` (its runs repeat `{of}`'s)" for e, of in REPEATS.items()
                if (root / "results" / "reference" / e / "capacity.csv").exists()]
    return ["## Predicting the failure point before it is known", "",
            "Mean |ln(observed / predicted)| over the configurations of every store above"
            + (f" but {', '.join(left_out)}" if left_out else "")
            + " (`python -m kernelzoo.analysis.prediction results/reference/{"
            + ",".join(pooled) + "}/capacity.csv`; the predictors in "
            "`src/kernelzoo/analysis/prediction.py`):", "",
            *[f"- {scores.words(v)}." for v in VIEWS], ""]


def document(root: Path = ROOT) -> str:
    """The whole of docs/results.md."""
    lines = ["# Results of the committed studies", "",
             "Written by `python -m kernelzoo.results_doc` (`make docs`) from the analysed "
             "stores under `results/reference/`; `make test` fails when a number here differs "
             "from its store. The views, intervals and rules are in `docs/analysis.md` and each "
             "store's `report.md`.", ""]
    for experiment in STUDIES:
        lines += section(experiment, root)
    return "\n".join(lines + predictions(root)).rstrip() + "\n"


def analysis_document() -> str:
    """docs/analysis.md: every rule of the analysis, quoted from the module that applies it."""
    from kernelzoo.analysis import capacity, intervals, rank_bound, rankings, stalls
    from kernelzoo.report import markdown as report
    from kernelzoo.core import diagnostics
    from kernelzoo.analysis.rankings import HEADLINE_WHY
    from kernelzoo.report.markdown import CAPTIONS, PUBLISHED_NOTE, REFERENCE_NOTE

    def quoted(module, text: str) -> list[str]:
        return [f"(`src/{module.__name__.replace('.', '/')}.py`)", "", text.strip(), ""]

    sections = [
        ("The failure point in three views", capacity, capacity.RULE),
        ("Which view headlines the rankings", rankings, HEADLINE_WHY),
        ("The rank bound", rank_bound, rank_bound.DERIVATION),
        ("Intervals", intervals, intervals.RULE),
        ("Does capacity follow d_dot?", scaling, scaling.RULE),
        ("Capacity or optimisation: the learning rate and the stopping rule", optimisation,
         optimisation.RULE),
        ("Stalls and their checks", stalls, stalls.RULE),
        ("Rankings per view and why they disagree", rankings, rankings.RULE),
        ("Rankings between sizes", between_sizes, between_sizes.RULE),
        ("Factorial effects", factorial, factorial.RULE),
        ("Predicting the failure point", prediction, prediction.__doc__.split("\n\n")[1]),
        ("Diagnostics", diagnostics, diagnostics.__doc__.split("\n\n", 1)[1]),
        ("The reference and published columns", report, REFERENCE_NOTE + "\n\n" + PUBLISHED_NOTE),
    ]
    lines = ["# Analysis rules", "",
             "How `make plots` (`python -m kernelzoo.analyze experiment=<name>`) turns a store "
             "into `capacity.csv`, `scaling.csv`, the figures and `report.md`. It never trains "
             "and works on partial sweeps. Each rule below is quoted from the module that "
             "applies it (`make docs` rewrites this file; `make test` fails when it drifts).", ""]
    for title, module, text in sections:
        lines += [f"## {title}", "", *quoted(module, text)]
    lines += ["## The figures", ""]
    lines += [f"- `{name}`: {caption}" for name, caption in CAPTIONS.items()]
    return "\n".join(lines) + "\n"


def _favor_summary(store: Path) -> list[str]:
    """favor_diagnosis in one line: each fix's main effect in the loss view (the factorial),
    then the loss-view failure point at each d_dot of the family searched at most d_dot levels
    (all three fixes) and what the d_dot law test says of it."""
    if not (store / "factorial.csv").exists():
        return []
    effects = pd.read_csv(store / "factorial.csv")
    main = effects[(effects["view"] == "loss") & (effects["order"] == 1)]
    laws = pd.read_csv(store / "scaling.csv")
    law = laws[laws["view"] == "loss"].sort_values("n_d_dot", kind="stable").iloc[-1]
    capacity = pd.read_csv(store / "capacity.csv")
    family = capacity[capacity["label"].map(families(store)) == law["family"]]
    return [f"- `favor_diagnosis` ({int(capacity['n_seeds'].max())} seeds, loss view), each fix's "
            f"ratio on the failure point ({main['design'].iloc[0]}) [95% interval]: " + "; ".join(
                f"{r.effect} x{r.ratio:.3g} [{r.ci_low:.3g}, {r.ci_high:.3g}]"
                for r in main.itertuples())
            + f"; with every fix ({law['family']}), the failure point per d_dot: " + "; ".join(
                f"{r.d_dot}: {observed(r)}" for r in family.sort_values("d_dot").itertuples())
            + f" (n* = d_dot: F test p = {law['p_identity']:.2g}, "
            + ("consistent" if law["follows_d_dot"] else "rejected") + ")."]


def summary(root: Path = ROOT) -> list[str]:
    """README's short summary: per study, its headline numbers."""
    lines = [START]
    fig2 = pd.read_csv(root / "results" / "reference" / "figure2" / "capacity.csv")
    theirs = fig2[fig2["published_outcome"].notna()]
    lines.append("- `figure2` (one seed, the loss view against the authors' losses): "
                 + "; ".join(f"{r.label} {bound(r.observed_capacity, r.outcome)} "
                             f"(published {published(r)})" for r in theirs.itertuples()) + ".")
    search = root / "results" / "reference" / "figure2_search" / "capacity.csv"
    if search.exists():
        fig2s = pd.read_csv(search)
        theirs = fig2s[fig2s["published_outcome"].notna() & (fig2s["n_seeds"] >= 2)]
        if len(theirs):
            lines.append(
                f"- `figure2_search` (up to {int(theirs['n_seeds'].max())} seeds, loss view: "
                "median [interval] against the authors' one run, and where it lies): "
                + "; ".join(f"{r.label} {observed(r)} against {published(r)}: "
                            f"{r.published_verdict}" for r in theirs.itertuples()) + ".")
    zoo = pd.read_csv(root / "results" / "reference" / "zoo" / "capacity.csv")
    for size, levels in rankings.sizes(zoo).items():
        mine = zoo[zoo["predicted_capacity"].isin(levels)]
        best = mine.sort_values("ratio_acc", ascending=False).head(3)
        lines.append(f"- `zoo` (d_dot {size}, {int(mine['n_seeds'].max())} seeds), highest "
                     "failure point / d_dot in the accuracy view: " + "; ".join(
                         f"{r.label} {bound(r.ratio_acc, r.outcome_acc)}"
                         for r in best.itertuples()) + ".")
    for pair in between_sizes.pairs(zoo, families(root / "results" / "reference" / "zoo")):
        lines.append(f"- `zoo` between d_dot {pair.small} and {pair.large} "
                     f"({len(pair.families)} families), Spearman rho of their ranks: "
                     + ", ".join(f"{VIEW_WORDS[v]} {r:.2f}" for v, (r, _) in pair.rho.items())
                     + "; moved by their own efficiency change: "
                     + ("; ".join(f"{name} ({', '.join(views)})"
                                  for name, views in pair.moved.items()) or "none") + ".")
    lines += _favor_summary(root / "results" / "reference" / "favor_diagnosis")
    for experiment in ("lr_robustness", "lr_patience"):
        store = root / "results" / "reference" / experiment
        found_by_setting = optimisation_tables(store) if (store / "capacity.csv").exists() else {}
        for setting, found in found_by_setting.items():
            verdicts = found.groupby("label", sort=False)["verdict"]
            moves = {label: [f"{VIEW_WORDS[r.view]} {_rise(r.differences)}"
                             for r in rows[rows["verdict"] == "moves"].itertuples()]
                     for label, rows in found.groupby("label", sort=False)
                     if (rows["verdict"] == "moves").any()}
            held = [label for label, v in verdicts if (v == "does not move").all()]
            lines.append(f"- `{experiment}`, the optimisation test ({setting.heading.lower()}, "
                         f"{optimisation.TEST_WORDS[setting.test]}, margin 0.1 d_dot keys, "
                         "per view; a rise in keys [its lower bound]): moves: "
                         + ("; ".join(f"{k} ({', '.join(v)})" for k, v in moves.items()) or "none")
                         + "; does not move in every view: " + (", ".join(held) or "none")
                         + f"; {len(verdicts) - len(moves) - len(held)} of {len(verdicts)} "
                         "configurations undecided in some view.")
    dot = pd.read_csv(root / "results" / "reference" / "dot_scaling" / "scaling.csv")
    laws = dot.drop_duplicates(["family", "view"])
    laws = laws[laws["view"].isin(["loss", "accuracy"]) & laws["b"].notna()]
    lines.append("- `dot_scaling` (5 seeds, d_dot 16-256), n* = a d_dot^b per family and view: "
                 + "; ".join(f"{r.family} ({VIEW_WORDS[r.view]}) b = {r.b:.2f} "
                             f"[{r.b_low:.2f}, {r.b_high:.2f}], "
                             f"{'consistent with' if r.follows_d_dot else 'rejects'} n* = d_dot"
                             for r in laws.itertuples()) + ".")
    return lines + [END]


def readme(text: str, root: Path = ROOT) -> str:
    """README ``text`` with its summary block rewritten (unchanged without the markers)."""
    head, start, rest = text.partition(START)
    if not start:
        return text
    _, end, tail = rest.partition(END)
    return head + "\n".join(summary(root)) + tail if end else text


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m kernelzoo.results_doc",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when docs/results.md or README's summary has drifted")
    parser.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    targets = {args.root / "docs" / "results.md": document(args.root),
               args.root / "docs" / "analysis.md": analysis_document(),
               args.root / "README.md": readme((args.root / "README.md").read_text(), args.root)}
    drifted = [path for path, text in targets.items()
               if not path.exists() or path.read_text() != text]
    if args.check:
        for path in drifted:
            print(f"{path}: differs from the stores under {args.root / 'results' / 'reference'}"
                  " (make docs rewrites it)", file=sys.stderr)
        sys.exit(1 if drifted else 0)
    for path in drifted:
        atomic_write_text(path, targets[path])
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
