"""Merge a sweep's store kept elsewhere into the store it extends (``records/merge.py``): the
runs, search series and sweep invocations of one experiment, then analyse the target as usual.

    python -m kernelzoo.merge results/pending/zoo results/reference/zoo

A sweep whose search spans several sessions or machines runs into a store of its own
(``results_dir=results/pending``) and joins the reference store whole when its search ends, so
no report is written from a search half done. A conflict (a run or series both stores hold
differently) is one line and exit 1, with nothing written.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kernelzoo.records.files import StoreError
from kernelzoo.records.merge import merge


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m kernelzoo.merge",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("source", type=Path, help="<results_dir>/<experiment> merged from")
    parser.add_argument("target", type=Path, help="<results_dir>/<experiment> merged into")
    args = parser.parse_args(argv)
    try:
        done = merge(args.source, args.target)
    except (StoreError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print(f"interrupted: each run and record written into {args.target} so far is whole; "
              "the same command finishes the merge", file=sys.stderr)
        sys.exit(130)
    print(done.line(args.source, args.target))
    if done.unfinished:
        print(f"left behind (no summary.json): {', '.join(done.unfinished)}")


if __name__ == "__main__":
    main()
