"""``docs/results.md`` and README's results summary, written from the committed stores' tables so
that no number in them is typed by hand. It reads what the analysis wrote (capacity.csv,
headlines.csv, answer.csv, runs.parquet, sweep.json) and re-runs no analysis.

    python scripts/results_doc.py           # rewrite docs/results.md, README's summary and
                                            # results/predictors.csv
    python scripts/results_doc.py --check   # exit 1, naming the file, when one has drifted

Every study gets a section: what it runs (its experiment file's header), what it cost (runs,
training steps, run and sweep wall time, machine), its capacity table and its verdicts, as the
first screen of its report.md shows them. The last section scores the predictors of the failure
point held out (fitted on some stores and sizes, scored on another), also written to
``results/predictors.csv``. README holds a table of each study's headline verdicts between the markers
``<!-- results:start -->`` and ``<!-- results:end -->``, and the figures that carry them.
"""

from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path

import pandas as pd

from kernelzoo.analysis import prediction
from kernelzoo.analysis.capacity import VIEW_WORDS, VIEWS, by_view
from kernelzoo.analysis.labels import cell
from kernelzoo.records.files import StoreError, atomic_write_text, read_bytes, read_text
from kernelzoo.records.history import read_sweep
from kernelzoo.report.answer import protocol_line, size_lines
from kernelzoo.report.markdown import observed
from kernelzoo.report.verdicts import COLUMNS as HEADLINE_COLUMNS, verdict_lines

ROOT = Path(__file__).resolve().parents[1]
STUDIES = ("quick", "figure2", "figure2_search", "figure3", "dot_scaling", "zoo",
           "favor_diagnosis", "lr_robustness", "lr_patience", "stopping_rule")
START, END = "<!-- results:start -->", "<!-- results:end -->"
# README's first screen: the answer of the store that compares the most maps (its answer.csv)
ANSWER, ANSWERED = "<!-- answer:start -->", "<!-- answer:end -->"
ANSWER_STORE = "zoo"
PROTOCOL_STORE = "stopping_rule"  # what the published stopping rule sets (README's first screen)
# the headlines of each study that README's table shows (headlines.csv's ``id``: the id itself
# or its first part, "law" for "law.loss")
HEADLINES = {"quick": ("n_le_d_dot",), "figure2": ("published",), "figure2_search": ("published",),
             "figure3": ("update_rules",), "dot_scaling": ("law.loss",),
             "zoo": ("between_sizes",),  # its loss-view tiers: the answer
             "favor_diagnosis": ("factorial", "law.loss"),
             "lr_robustness": ("optimisation",), "lr_patience": ("optimisation",),
             "stopping_rule": ("optimisation",)}
# the figures README shows: (store, figure, what it shows)
FIGURES = (("zoo", "headline", "the zoo: failure point against d_dot per family, both sizes, "
                               "each view a panel"),
           ("figure2_search", "headline", "Figure 2 searched with 5 seeds: each configuration's "
                                          "failure point against d_dot, each view a panel"),
           ("dot_scaling", "capacity_scaling", "does capacity follow d_dot: failure point / d_dot "
                                               "per level, with the fitted law"))


def store_of(root: Path, experiment: str) -> Path:
    return root / "results" / "reference" / experiment


def _csv(path: Path) -> pd.DataFrame:
    """A store's table, read as every store file is (``files.read_text``: a FIFO or a device is
    named, never waited on)."""
    return pd.read_csv(io.StringIO(read_text(path)))


def _parquet(path: Path) -> pd.DataFrame:
    return pd.read_parquet(io.BytesIO(read_bytes(path)))


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
    runs = _parquet(store / "runs.parquet")
    if "stall_check_of" in runs:
        runs = runs[runs["stall_check_of"].isna()]
    seconds = runs["wall_seconds"].sum()
    time = f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.1f} min"
    words = (f"{len(runs)} runs, {int(runs['steps'].fillna(0).sum()):,} training steps, "
             f"{time} of run time")
    history = read_sweep(store)  # StoreError naming it when it is no sweep record
    if history is not None:
        machines = sorted({i.get("machine", "?") for i in history.get("invocations", [])})
        n = len(history.get("invocations", []))
        words += (f"; sweep wall clock {float(history['wall_seconds']) / 60:.1f} min over {n} "
                  f"invocation{'' if n == 1 else 's'} on {'; '.join(machines)}")
    return words


def capacity_lines(table: pd.DataFrame) -> list[str]:
    """The store's capacity table in the three views (median [interval] over seeds)."""
    lines = ["| configuration | d_dot | seeds | " + " | ".join(VIEW_WORDS[v] for v in VIEWS)
             + " | loss / d_dot |", "|---|---|---|" + "---|" * len(VIEWS) + "---|"]
    views = {label: rows for label, rows in by_view(table).groupby("label", sort=False)}
    for r in table.itertuples():
        lines.append(f"| {r.label} | {int(r.d_dot) if pd.notna(r.d_dot) else 'unbounded'} | "
                     f"{r.n_seeds} | " + " | ".join(map(observed, views[r.label].itertuples()))
                     + f" | {cell(r.ratio, 2)} |")
    return lines


def read_headlines(store: Path) -> pd.DataFrame:
    path = store / "headlines.csv"
    return _csv(path).fillna("") if path.exists() and path.stat().st_size > 1 else \
        pd.DataFrame(columns=list(HEADLINE_COLUMNS))


def section(experiment: str, root: Path) -> list[str]:
    """One study's section ([] when the store is not analysed)."""
    store = store_of(root, experiment)
    if not (store / "capacity.csv").exists():
        return []
    table = _csv(store / "capacity.csv")
    return [f"## `{experiment}`", "", _header(experiment, root), "",
            f"Cost: {cost(store)}. Report: `results/reference/{experiment}/report.md`.", "",
            *capacity_lines(table), "", *verdict_lines(read_headlines(store)), ""]


def predicted_stores(root: Path) -> pd.DataFrame:
    """The capacity.csv rows of the stores the held-out scores split (``prediction.FIT``,
    ``prediction.SCORE``), with their ``store``."""
    stores = [e for e in dict.fromkeys((*prediction.FIT, *prediction.SCORE))
              if (store_of(root, e) / "capacity.csv").exists()]
    table, _ = prediction.read_stores([store_of(root, e) / "capacity.csv" for e in stores])
    return table


def _score(r) -> str:
    return cell(r.score, 3) + (f" (c = {r.constant:.3g})" if pd.notna(r.constant) else "")


def predictions(table: pd.DataFrame) -> list[str]:
    """The held-out scores of every predictor per view, against c·d_dot and raw d_dot, and the
    configurations where raw d_dot wins."""
    if table.empty:
        return []
    frame = prediction.held_out(table)
    fit = " and ".join(f"`{e}`" + (f" at d_dot {s}" if s else "") for e, s in prediction.FIT.items())
    test = " and ".join(f"`{e}` at d_dot {s}" for e, s in prediction.SCORE.items())
    lines = ["## Predicting the failure point, held out", "",
             f"Constants fitted on {fit}, scores on {test}: mean |ln(observed / predicted)| per "
             "view over the configurations that fail at a point; bounds are censored and left "
             "out (`python -m kernelzoo.analysis.prediction results/reference/{"
             + ",".join(dict.fromkeys((*prediction.FIT, *prediction.SCORE)))
             + "}/capacity.csv`; the predictors in `src/kernelzoo/analysis/prediction.py`, "
             "the table in `results/predictors.csv`). Before training: d_dot and the untrained "
             "map's ranks on the task's keys at n_keys = d_dot. Early diagnostic: the ranks of "
             "the model trained at the n_keys = d_dot probe, a trained run. c·p: p times one "
             "constant fitted on the fit set.", "",
             "| predictor | known | " + " | ".join(VIEW_WORDS[v] for v in VIEWS) + " |",
             "|---|---|" + "---|" * len(VIEWS)]
    by = {(r.view, r.predictor): r for r in frame.itertuples()}
    for p in prediction.PREDICTORS:
        lines.append(f"| {p} | {prediction.kind(p)} | "
                     + " | ".join(_score(by[v, p]) for v in VIEWS) + " |")
    counts = [by[v, "d_dot"] for v in VIEWS]
    lines += ["| configurations scored (fitted on; bounds left out) | | "
              + " | ".join(f"{r.configurations} ({r.fitted_on}; {r.bounds_left_out})"
                           for r in counts) + " |", "",
              "Where raw d_dot wins, per view: the predictors it scores below, and the scored "
              "configurations where it is closer than c·d_dot and where no predictor is closer "
              "(ties with the untrained rank, which equals d_dot where the features have full "
              "rank, count for d_dot):", ""]
    for view in VIEWS:
        rows = frame[frame["view"] == view].set_index("predictor")["score"]
        beat_calibrated, _ = prediction.compared(frame, view, "c·d_dot")
        _, lose_to_d_dot = prediction.compared(frame, view, "d_dot")
        closer, best = prediction.d_dot_wins(prediction.predict(table, view))
        lines.append(f"- {VIEW_WORDS[view]}: best {rows.idxmin()} {rows.min():.3f}; below "
                     f"c·d_dot ({rows['c·d_dot']:.3f}): {', '.join(beat_calibrated) or 'none'}; "
                     f"raw d_dot ({rows['d_dot']:.3f}) scores below "
                     f"{', '.join(lose_to_d_dot) or 'none'}, is closer than c·d_dot on "
                     f"{', '.join(closer) or 'none'} and closest of all on "
                     f"{', '.join(best) or 'none'}.")
    return lines + [""]


def predictors_csv(table: pd.DataFrame) -> str:
    """results/predictors.csv: ``prediction.held_out``'s table, 6 significant digits."""
    return prediction.held_out(table).to_csv(index=False, float_format="%.6g")


def document(root: Path = ROOT) -> str:
    """The whole of docs/results.md."""
    lines = ["# Results of the committed studies", "",
             "Written by `scripts/results_doc.py` (`make docs`) from the analysed stores under "
             "`results/reference/`; `make test` fails when a number here differs from its store. "
             "The rules are in `docs/analysis.md`; each study's detail in its `report.md`.", ""]
    for experiment in STUDIES:
        lines += section(experiment, root)
    return "\n".join(lines + predictions(predicted_stores(root))).rstrip() + "\n"


def summary(root: Path = ROOT) -> list[str]:
    """README's summary: a table of each study's headline verdicts, then its figures."""
    lines = [START, "| study | verdict | evidence |", "|---|---|---|"]
    for experiment in STUDIES:
        found = read_headlines(store_of(root, experiment))
        shown = found["id"].str.partition(".")[0].isin(HEADLINES[experiment]) | \
            found["id"].isin(HEADLINES[experiment])
        for r in found[shown].itertuples():
            lines.append(f"| `{experiment}` | {r.title} | {r.evidence.replace('|', '/')} |")
    for experiment, name, what in FIGURES:
        path = f"results/reference/{experiment}/{name}.png"
        if (root / path).exists():
            lines += ["", f"![{what}]({path})", "", f"*{what[:1].upper() + what[1:]}.*"]
    return lines + [END]


def answer(root: Path = ROOT) -> list[str]:
    """README's first screen: which map, how much, how sure, from ANSWER_STORE's answer.csv
    (``report.answer.size_lines``) and its capacity.csv (how many configurations)."""
    store = store_of(root, ANSWER_STORE)
    facts = _csv(store / "answer.csv")
    configurations = len(_csv(store / "capacity.csv"))
    protocol = store_of(root, PROTOCOL_STORE)
    caveat = protocol_line(_csv(protocol / "verdicts.csv"), _csv(protocol / "capacity.csv"),
                           PROTOCOL_STORE) if (protocol / "verdicts.csv").exists() else []
    return [ANSWER, f"**Which map, how much, how sure** (`{ANSWER_STORE}`: "
            f"{configurations} configurations of the maps under the published protocol, "
            f"`results/reference/{ANSWER_STORE}/report.md`; loss view, n* / d_dot, median over "
            "seeds [interval]):", "", *size_lines(facts), *caveat, ANSWERED]


def _between(text: str, start: str, end: str, block: list[str]) -> str:
    head, found, rest = text.partition(start)
    if not found:
        return text
    _, closed, tail = rest.partition(end)
    return head + "\n".join(block) + tail if closed else text


def readme(text: str, root: Path = ROOT) -> str:
    """README ``text`` with its answer and summary blocks rewritten (each unchanged without its
    markers)."""
    if ANSWER in text:
        text = _between(text, ANSWER, ANSWERED, answer(root))
    return _between(text, START, END, summary(root))


def _problem(err: Exception) -> str:
    """One line for what kept a store from being read."""
    if isinstance(err, StoreError):
        return str(err)
    if isinstance(err, OSError):
        return f"{err.filename}: {err.strerror}" if err.filename else str(err)
    return f"a store's table is not as analysed ({type(err).__name__}: {err})"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python scripts/results_doc.py",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when docs/results.md, README's summary or "
                        "results/predictors.csv has drifted")
    parser.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        table = predicted_stores(args.root)
        targets = {args.root / "docs" / "results.md": document(args.root),
                   args.root / "README.md": readme(read_text(args.root / "README.md"),
                                                   args.root)}
        if not table.empty:
            targets[args.root / "results" / "predictors.csv"] = predictors_csv(table)
    except (StoreError, OSError, ValueError, KeyError) as err:  # a store that cannot be read
        print(f"error: {_problem(err)}; valid: analysed stores under "
              f"{args.root / 'results' / 'reference'} (make plots EXPERIMENT=<name> "
              "RESULTS=results/reference)", file=sys.stderr)
        sys.exit(1)
    drifted = [path for path, text in targets.items()
               if not path.exists() or path.read_text() != text]
    if args.check:
        for path in drifted:
            print(f"{path}: differs from the stores under {args.root / 'results' / 'reference'}"
                  " (make docs rewrites it)", file=sys.stderr)
        sys.exit(1 if drifted else 0)
    for path in drifted:
        try:
            atomic_write_text(path, targets[path])
        except OSError as err:  # a read-only docs/: what is written so far is whole
            print(f"error: {_problem(err)}; valid: a writable {path.parent}", file=sys.stderr)
            sys.exit(1)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
