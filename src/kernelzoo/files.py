"""Every file of the suite is written whole.

``atomic_write`` writes a file so that readers, and a kill -9 or a full disk at any moment, see
the old file or the new, never a part, with the mode the umask gives.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable


def one_line(err: Exception) -> str:
    """An error as one line; an OSError names its file and says what happened to it."""
    if isinstance(err, OSError) and err.filename:
        return f"{err.filename}: {err.strerror}"
    return str(err)


def umask() -> int:
    """This process's umask, read without changing it where the OS shows it (Linux)."""
    try:
        with open("/proc/self/status") as f:
            return int(next(line for line in f if line.startswith("Umask:")).split()[1], 8)
    except (OSError, StopIteration, ValueError):
        mask = os.umask(0o022)
        os.umask(mask)
        return mask


def atomic_write(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """Write ``path`` through ``write(binary file)`` so that readers, and a kill -9 at any
    moment, see the old file or the new, never a part: a temporary file beside it, its mode
    set from the umask (mkstemp's 0600 would hide results from the group), flushed to disk,
    then renamed over ``path``. A failure (a full disk) leaves the old file and raises OSError
    naming ``path``."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    except OSError as err:
        raise OSError(err.errno, err.strerror, str(path)) from None
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fchmod(f.fileno(), 0o666 & ~umask())
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(err, OSError):
            raise OSError(err.errno, err.strerror or str(err), str(path)) from None
        raise


def atomic_write_text(path: Path, text: str) -> None:
    """``atomic_write`` of a text (UTF-8)."""
    atomic_write(path, lambda f: f.write(text.encode()))
