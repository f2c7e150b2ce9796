"""Compare two configurations of a store, view by view (``make compare``):

    python -m kernelzoo.compare <results_dir>/<experiment> "<label A>" "<label B>"

Each label is a row of the store's capacity table ("ELU+1 d_key=64"). Per view it prints which
holds more keys and by how much, with Welch's 95% interval of the difference of mean failure
points, or that it cannot tell and why, with the seeds per configuration that would decide it at
the spread these seeds show (an estimate: ``analysis.compare``). It trains nothing and writes
nothing. A label the store lacks, or a store that is none, is one line and exit 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kernelzoo.analysis.capacity import VIEW_WORDS
from kernelzoo.analysis.compare import LEVEL, compare
from kernelzoo.analysis.labels import natural
from kernelzoo.analysis.pipeline import seeds_of
from kernelzoo.config.words import plural


def words(d, a: str, b: str) -> str:
    """One view's line: "loss: A holds more, by +5.2 keys [1.1, 9.3]" and so on."""
    span = f"{d.difference:+.3g} keys [{d.low:.3g}, {d.high:.3g}]"
    if d.verdict == "A holds more":
        return f"{a} holds more, by {span}"
    if d.verdict == "B holds more":
        return f"{b} holds more, by {-d.difference:+.3g} keys [{-d.high:.3g}, {-d.low:.3g}]"
    if d.why:
        return f"cannot tell: {d.why}" + (f" ({span})" if d.low == d.low else "")
    need = (f"about {d.seeds_needed} seeds each would decide it at this spread (an estimate)"
            if d.seeds_needed else "no seed count up to 1000 decides it at this spread")
    return f"cannot tell: {span}; {need}"


def fail(line: str) -> None:
    print(f"error: {line}", file=sys.stderr)
    sys.exit(2)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m kernelzoo.compare",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("store", type=Path, help="<results_dir>/<experiment>")
    parser.add_argument("a", help="a configuration's label, as the capacity table writes it")
    parser.add_argument("b", help="another configuration's label")
    parser.add_argument("--threshold", type=float, default=0.01, help="tau (default 0.01)")
    parser.add_argument("--accuracy-threshold", type=float, default=0.99)
    args = parser.parse_args(argv)
    if not (args.store / "runs").is_dir():
        fail(f"{args.store}: no runs/ here; valid: <results_dir>/<experiment>, e.g. "
             "results/reference/zoo")
    seeds = seeds_of(args.store, args.store.name, args.threshold, args.accuracy_threshold)
    labels = natural(seeds["label"].unique())
    for label in (args.a, args.b):
        if label not in labels:
            fail(f"no configuration {label!r} in {args.store}; valid: " + "; ".join(labels))
    found = compare(seeds, args.a, args.b)
    n_a, n_b = found[0].n_a, found[0].n_b
    print(f"{args.a} ({plural(n_a, 'seed')}) against {args.b} ({plural(n_b, 'seed')}): "
          f"difference of mean failure points, {args.a} minus {args.b}, with Welch's "
          f"{100 * LEVEL:g}% interval")
    for d in found:
        print(f"- {VIEW_WORDS[d.view]}: {words(d, args.a, args.b)}")


if __name__ == "__main__":
    main()
