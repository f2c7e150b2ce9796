"""Whether a store changed since its last analysis, so that a sweep (``kernelzoo.sweep``,
``make sweep``) re-analyses only then.

    python -m kernelzoo.records.analysed check <results_dir>/<experiment> [analysis arguments]
    python -m kernelzoo.records.analysed mark <results_dir>/<experiment> [analysis arguments]

``mark`` (after an analysis succeeded) writes the store's ``state``: every run directory's name
with its summary's size and modification time, the search record's, whether the report exists,
and the analysis' arguments, hashed, to ``index/analysed`` (scratch, as the point index).
``check`` exits 0 with one line when the state is the one marked, 1 otherwise (a run finished,
was added or removed, the search went on, the report is gone, other arguments). The sweep record
``sweep.json``, which every sweep appends to, is no part of it: a rerun that trained nothing
leaves the analysis as it was. ``make plots`` analyses whenever asked, and marks it too (the
analysis marks itself, ``kernelzoo.analyze``). It loads no library
beyond Python's own: the check costs a Python start.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

from kernelzoo.records.files import StoreError, atomic_write_text, read_text


def stamp_file(exp_dir: Path) -> Path:
    return exp_dir / "index" / "analysed"


def _stat(path: Path) -> str:
    try:
        st = os.stat(path)
    except OSError:
        return "-"
    return f"{st.st_size}:{st.st_mtime_ns}"


def arguments(experiment: str, results_dir: str, logger: str, extra=()) -> list[str]:
    """An analysis' arguments as its stamp records them, whoever ran it (a sweep's analysis,
    ``make plots``): its experiment, store and logger, and its other overrides (a threshold,
    ``logger.project``), sorted."""
    own = ("experiment", "results_dir", "logger")
    return sorted({f"experiment={experiment}", f"results_dir={results_dir}", f"logger={logger}",
                   *(a for a in extra if a.lstrip("+~").partition("=")[0] not in own)})


def state(exp_dir: Path, arguments: list[str]) -> str:
    """The digest of what the analysis of ``exp_dir`` reads (but sweep.json) and its arguments."""
    h = hashlib.sha1("\0".join(arguments).encode())
    runs = exp_dir / "runs"
    names = sorted(os.listdir(runs)) if runs.is_dir() else []
    for name in names:
        h.update(f"{name}\0{_stat(runs / name / 'summary.json')}\n".encode())
    for name in ("search.json", "report.md"):
        h.update(f"{name}\0{_stat(exp_dir / name)}\n".encode())
    return h.hexdigest()


def mark(exp_dir: Path, arguments: list[str]) -> None:
    """Record the store's state after its analysis with ``arguments`` succeeded."""
    atomic_write_text(stamp_file(exp_dir), state(exp_dir, arguments) + "\n")


def up_to_date(exp_dir: Path, arguments: list[str]) -> bool:
    """True when the store's state is the one its last analysis with ``arguments`` marked."""
    try:
        return read_text(stamp_file(exp_dir)).strip() == state(exp_dir, arguments)
    except (OSError, StoreError):  # none, or no regular file (a FIFO is never waited on)
        return False


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 2 or argv[0] not in ("check", "mark"):
        print("usage: python -m kernelzoo.records.analysed check|mark <results_dir>/<experiment> "
              "[analysis arguments]", file=sys.stderr)
        sys.exit(2)
    what, exp_dir, arguments = argv[0], Path(argv[1]), argv[2:]
    if what == "mark":
        mark(exp_dir, arguments)
    elif up_to_date(exp_dir, arguments):
        print(f"the analysis of {exp_dir} is up to date: no run changed since (make plots "
              "re-analyses)")
    else:
        sys.exit(1)


if __name__ == "__main__":
    main()
