"""What a sweep's local workers keep in /dev/shm, and its removal once the sweep is dead, by a
token of the sweep's own rather than a process id, which another PID namespace sharing
/dev/shm (a container) gives out again.

While it runs, a sweep holds ``Owner``: a directory ``/dev/shm/kernelzoo-sweep-<pid>-<random>``
whose ``owner.lock`` it keeps locked (``flock``; the kernel releases it however the sweep ends,
kill -9 included, and in whatever namespace the cleaner runs, since both see one file). joblib's
memmapping folders go inside it (``JOBLIB_TEMP_FOLDER``). loky's semaphores (``sem.loky-*``,
whose place cannot be chosen) are listed in its ``semaphores`` file, each with its inode and time, once a
process of the sweep is seen to map it (``/proc/<pid>/maps``, of the sweep and its descendants).
``clean`` removes, of the owner directories of this user whose lock it can take (a dead
sweep's), the semaphores listed there that are still the same files, then the directory. Nothing
else in /dev/shm is touched: another program's joblib folders, a semaphore no process of a sweep
was seen to map, a running sweep's files in any namespace.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import stat
import tempfile
import threading
from pathlib import Path

from kernelzoo.records.files import StoreError, atomic_write_text, read_text

SHM = Path("/dev/shm")
PREFIX = "kernelzoo-sweep-"
LOCK, SEMAPHORES = "owner.lock", "semaphores"
SEMAPHORE = re.compile(r"^sem\.loky-\d+-\w+$")
NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def identity(found: os.stat_result) -> str:
    """A file as the semaphore list names it: its inode and the time it was made (a new file
    may get a removed one's inode)."""
    return f"{found.st_ino}:{found.st_ctime_ns}"


class Owner:
    """This sweep's token in ``root`` (module docstring), from its start until ``close``; nothing
    where ``root`` is missing (no /dev/shm) or cannot be written."""

    def __init__(self, root: Path = SHM, every: float = 1.0):
        self.root, self.dir, self.fd, self.seen = Path(root), None, None, {}
        self.stop = threading.Event()
        try:
            self.dir = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=self.root))
            fd, held = tempfile.mkstemp(dir=self.dir)  # locked before it is named the lock:
            fcntl.flock(fd, fcntl.LOCK_EX)             # a cleaner never finds it free early
            os.rename(held, self.dir / LOCK)
            self.fd = fd
        except OSError:
            self.close()
            return
        os.environ["JOBLIB_TEMP_FOLDER"] = str(self.dir)
        threading.Thread(target=self._watch, args=(every,), name="kernelzoo-shm-owner",
                         daemon=True).start()

    def _watch(self, every: float) -> None:
        while not self.stop.wait(every):
            with contextlib.suppress(OSError):
                self.record()

    def record(self) -> None:
        """List the loky semaphores in ``root`` that this process or a descendant maps."""
        from kernelzoo.training.interrupt import descendants

        for pid in [os.getpid(), *descendants()]:
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
                    fields = line.split(maxsplit=5)  # address perms offset dev inode path
                    path = Path(fields[5]) if len(fields) == 6 else None
                    if path and path.parent == self.root and SEMAPHORE.match(path.name) \
                            and path.name not in self.seen:
                        found = path.lstat()  # the file mapped, made when (a name is reused)
                        if found.st_ino == int(fields[4]):
                            self.seen[path.name] = identity(found)
        if self.seen and self.dir is not None:
            atomic_write_text(self.dir / SEMAPHORES, "".join(
                f"{name} {made}\n" for name, made in sorted(self.seen.items())))

    def close(self) -> None:
        """The sweep's end: its token removed (loky has removed its own semaphores)."""
        self.stop.set()
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            if os.environ.get("JOBLIB_TEMP_FOLDER") == str(self.dir):
                del os.environ["JOBLIB_TEMP_FOLDER"]
        if self.fd is not None:
            os.close(self.fd)
        self.dir = self.fd = None


def clean(root: Path = SHM) -> list[Path]:
    """Remove what dead sweeps of this user left in ``root`` (module docstring): the paths
    removed, each semaphore and each owner directory."""
    removed = []
    with contextlib.suppress(OSError):
        for entry in sorted(Path(root).iterdir()):
            if entry.name.startswith(PREFIX):
                with contextlib.suppress(OSError):
                    removed += _clean(entry)
    return removed


def _clean(owner: Path) -> list[Path]:
    info = owner.lstat()
    if not owner.is_dir() or owner.is_symlink() or info.st_uid != os.getuid():
        return []
    fd = os.open(owner / LOCK, os.O_RDONLY | NOFOLLOW)  # none: a sweep still starting
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return []  # its sweep runs
        removed = []
        try:
            listed = read_text(owner / SEMAPHORES).split("\n")
        except (FileNotFoundError, StoreError):
            listed = []
        for line in filter(None, listed):
            name, _, made = line.partition(" ")
            path = owner.parent / name
            with contextlib.suppress(OSError):
                found = path.lstat()
                if SEMAPHORE.match(name) and identity(found) == made \
                        and found.st_uid == os.getuid() and stat.S_ISREG(found.st_mode):
                    path.unlink()
                    removed.append(path)
        shutil.rmtree(owner)
        return removed + [owner]
    finally:
        os.close(fd)
