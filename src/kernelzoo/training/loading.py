"""PyTorch, loaded where a run or a sweep first needs it (``load``): a library that cannot be
loaded, most often one that does not fit a virtual-memory limit (``ulimit -v``), is one line that
names the limit, not a traceback."""

from __future__ import annotations

import resource
from types import ModuleType

from kernelzoo.config import UsageError


def load() -> ModuleType:
    """``import torch``, or a UsageError naming why it failed and the process's ``ulimit -v``."""
    try:
        import torch
    except ImportError as err:
        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
        limit = ("" if soft == resource.RLIM_INFINITY else
                 f" under ulimit -v {soft // 1024} KiB, which its libraries do not fit")
        raise UsageError(f"PyTorch cannot be loaded{limit} ({err}); valid: an environment where "
                         "`python -c 'import torch'` works (ulimit -v unlimited; make install)"
                         ) from err
    return torch
