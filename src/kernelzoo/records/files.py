"""Every file of the suite is written whole and read safely.

``atomic_write`` writes a file so that readers, and a kill -9 or a full disk at any moment, see
the old file or the new, never a part, with the mode the umask gives; ``read_text`` reads only
regular UTF-8 files of bounded size, never through a link (``open_regular``, which the binary
checkpoint is read through too), so a FIFO or a binary blob where a result should be is reported (as
StoreError, naming the file and what is wrong), never waited on or decoded into nonsense.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import stat
import tempfile
import time
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

from filelock import FileLock

from kernelzoo.records.loaders import load_json


class StoreError(Exception):
    """A store entry that cannot be read (damaged or incomplete); the message names the file."""


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


STALE_TEMP = 600  # seconds after which a temporary file of a write was left by a killed writer


def clean_stale_temps(path: Path, older: float = STALE_TEMP) -> list[Path]:
    """Remove the temporary files of earlier writes of ``path`` (``.<name>.<8 characters>``,
    as ``atomic_write`` makes them) older than ``older`` seconds: a writer killed between its
    write and its rename left them; a write in flight is never that old. The ones removed."""
    name = re.compile(rf"\.{re.escape(path.name)}\.[a-z0-9_]{{8}}")
    removed = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(path.parent):
            if name.fullmatch(entry.name) and entry.is_file(follow_symlinks=False):
                with contextlib.suppress(OSError):
                    if time.time() - entry.stat(follow_symlinks=False).st_mtime > older:
                        os.unlink(entry.path)
                        removed.append(Path(entry.path))
    return removed


def atomic_write(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """Write ``path`` through ``write(binary file)`` so that readers, and a kill -9 at any
    moment, see the old file or the new, never a part: a temporary file beside it, its mode
    set from the umask (mkstemp's 0600 would hide results from the group), flushed to disk,
    then renamed over ``path``. A failure (a full disk) leaves the old file and raises OSError
    naming ``path``. The temporary files a killed writer of ``path`` left go first
    (``clean_stale_temps``)."""
    clean_stale_temps(path)
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


def lock(path: str | Path, timeout: float = -1) -> FileLock:
    """A FileLock on the file ``path`` (a record's ``.lock``, a run's ``.claim``) that never
    opens a link planted under its name: the link is removed first (a lock file is opened for
    writing and truncated, which through a link would empty what it points to)."""
    if os.path.islink(path):
        os.unlink(path)
    return FileLock(str(path), timeout=timeout)


def atomic_write_text(path: Path, text: str) -> None:
    """``atomic_write`` of a text (UTF-8)."""
    atomic_write(path, lambda f: f.write(text.encode()))


TEXT_LIMIT = 256 << 20  # the largest text a store holds (a long curve.csv is a few MB)


@contextlib.contextmanager
def open_regular(path: Path, limit: int = TEXT_LIMIT) -> Iterator[BinaryIO]:
    """``path`` opened for reading when it is a regular file of at most ``limit`` bytes.
    OSError when it cannot be opened (FileNotFoundError when missing); StoreError naming it
    when it is a link (never followed: ``store.guard``), no regular file (a FIFO would block a
    reader forever, a device never end) or too large."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise StoreError(f"{path}: a symbolic link, not a file of the store") from None
        raise
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise StoreError(f"{path}: not a regular file")
        if info.st_size > limit:
            raise StoreError(f"{path}: {info.st_size} bytes, more than the {limit} a store "
                             "file may hold")
        yield f


def read_bytes(path: Path, limit: int = TEXT_LIMIT) -> bytes:
    """The bytes of the regular file ``path`` (``open_regular``)."""
    with open_regular(path, limit) as f:
        return f.read()


def read_text(path: Path) -> str:
    """The text of the regular file ``path`` (``open_regular``); StoreError naming it when it
    is not UTF-8."""
    data = read_bytes(path)
    try:
        return data.decode()
    except UnicodeDecodeError as err:
        raise StoreError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from None


def read_json(file: Path):
    """The JSON in ``file`` (``loaders.load_json``: within its limits), None when there is no
    such file; StoreError naming it when damaged."""
    try:
        return load_json(read_text(file))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        raise StoreError(f"{file}: not readable JSON ({one_line(err)})") from None


KINDS = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"),
         (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
         (stat.S_ISSOCK, "a socket"))


def kind(mode: int) -> str:
    """What a file of ``mode`` (an lstat's st_mode) is, in words."""
    return next((words for test, words in KINDS if test(mode)),
                "a directory" if stat.S_ISDIR(mode) else "a regular file")


def _refuse(path: Path, mode: int) -> StoreError:
    return StoreError(f"{path}: {kind(mode)}, not a regular file or directory; valid: a run "
                      "of regular files and directories only (remove it, or leave the run out)")


def check_tree(source: Path, skip: tuple[str, ...] = ()) -> None:
    """StoreError naming the first entry under the directory ``source`` (names in ``skip``
    aside) that is neither a directory nor a regular file of at most TEXT_LIMIT bytes: a link,
    a FIFO, a device, a socket."""
    for entry in sorted(Path(source).iterdir()):
        if entry.name in skip:
            continue
        info = entry.lstat()
        if stat.S_ISDIR(info.st_mode):
            check_tree(entry, skip)
        elif not stat.S_ISREG(info.st_mode):
            raise _refuse(entry, info.st_mode)
        elif info.st_size > TEXT_LIMIT:
            raise StoreError(f"{entry}: {info.st_size} bytes, more than the {TEXT_LIMIT} a "
                             "store file may hold")


def copy_tree(source: Path, target: Path, skip: tuple[str, ...] = ()) -> None:
    """Copy the directory ``source`` into the new directory ``target``: its directories and
    regular files (each read through ``open_regular``, mode and times kept), never what a
    link points to, nothing from a FIFO or a device. StoreError naming the first entry that is
    anything else (``check_tree``), OSError when writing fails (a full disk); either way
    ``target`` is removed again, so a failed copy leaves nothing behind."""
    os.mkdir(target)
    try:
        _copy_into(Path(source), Path(target), skip)
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)
        raise


def _copy_into(source: Path, target: Path, skip: tuple[str, ...]) -> None:
    for entry in sorted(source.iterdir()):
        if entry.name in skip:
            continue
        mode = entry.lstat().st_mode
        if stat.S_ISDIR(mode):
            os.mkdir(target / entry.name)
            _copy_into(entry, target / entry.name, skip)
            continue
        if not stat.S_ISREG(mode):
            raise _refuse(entry, mode)
        with open_regular(entry) as f:  # what was checked above may have been swapped since
            info = os.fstat(f.fileno())
            fd = os.open(target / entry.name, os.O_WRONLY | os.O_CREAT | os.O_EXCL
                         | getattr(os, "O_NOFOLLOW", 0), stat.S_IMODE(info.st_mode))
            with os.fdopen(fd, "wb") as out:
                shutil.copyfileobj(f, out)
        os.utime(target / entry.name, ns=(info.st_atime_ns, info.st_mtime_ns),
                 follow_symlinks=False)
