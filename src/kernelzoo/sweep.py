"""Run a named sweep: ``python -m kernelzoo.sweep <experiment> [overrides]`` (``make sweep``).

A thin front door over the Hydra app of ``kernelzoo.train``: it checks that
``experiments/<experiment>.yaml`` exists (listing the valid names if not), then starts
``kernelzoo.train --multirun +experiments=<experiment> [overrides]``. Rerunning a sweep trains
only what is missing.
"""

from __future__ import annotations

import sys

from kernelzoo.config import EXPERIMENTS


def available() -> list[str]:
    return sorted(p.stem for p in EXPERIMENTS.glob("*.yaml"))


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    usage = (f"usage: kernelzoo-sweep <experiment> [overrides]  (python -m kernelzoo.sweep)\n"
             f"experiments: {', '.join(available())}\n"
             "overrides: Hydra syntax, e.g. seed=1,2,3 launcher=local search=bisect "
             "grids=[0] dry_run=true; --cfg job shows a point's config; `python -m kernelzoo.train "
             "--help` lists every config group")
    if argv[:1] in (["-h"], ["--help"]):
        print(usage)
        sys.exit(0)
    if not argv or argv[0].startswith("-") or "=" in argv[0]:
        print(usage, file=sys.stderr)
        sys.exit(2)
    name, overrides = argv[0], argv[1:]
    if name not in available():
        print(f"error: unknown experiment {name!r}; valid: {', '.join(available())}",
              file=sys.stderr)
        sys.exit(2)
    from kernelzoo import train

    # Hydra takes one mode: --cfg, --info or --help shows the experiment's config (its point
    # values as the experiment sets them), without a sweep
    shows = any(a in ("--cfg", "-c", "--info", "-i", "--help", "-h", "--hydra-help")
                or a.startswith(("--cfg=", "--info=")) for a in overrides)
    sys.argv = [sys.argv[0], *([] if shows else ["--multirun"]), f"+experiments={name}",
                *overrides]
    train.main()


if __name__ == "__main__":
    main()
