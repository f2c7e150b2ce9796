"""How many jobs of a sweep run at once: one worker per core this process may use.

Usable cores (``usable_cores``) are the fewest of: the machine's cores, this process's CPU
affinity (a SLURM job's cpuset, ``taskset``), the CPU quota of the cgroup at the root of the
mount (a container's ``--cpus``) and ``LOKY_MAX_CPU_COUNT`` — all four from
``joblib.cpu_count`` — and the CPU quota of this process's own cgroup or a parent's
(``cpu_quota``: v2 ``cpu.max``, v1 ``cpu.cfs_quota_us`` over ``cpu.cfs_period_us``), rounded up.
``workers`` takes at most one worker per usable core, one per job and as many as the memory holds
at the largest job's estimate; on a GPU, one process holds the device and its packs fill it.
The memory limits a process runs under (``process_limit``) are read by the same walk over its
cgroups. Nothing here loads torch: a sweep whose points are all done loads none.
"""

from __future__ import annotations

import contextlib
import math
import os
import resource
from pathlib import Path
from typing import Iterator

PROC = Path("/proc/self/cgroup")
ROOT = Path("/sys/fs/cgroup")


def _groups(controller: str, proc: Path, root: Path) -> Iterator[tuple[Path, bool]]:
    """The folders of this process's cgroup for ``controller`` and of each parent group up
    to the mount, with whether each is v2 (one hierarchy) or v1 (a mount per controller)."""
    try:
        lines = proc.read_text().splitlines()
    except OSError:
        return
    for line in lines:
        _, controllers, group = line.split(":", 2)
        if controllers == "":  # v2: one hierarchy for every controller
            bases, v2 = [root], True
        elif controller in controllers.split(","):
            bases, v2 = [root / controllers, root / controller], False
        else:
            continue
        for base in dict.fromkeys(bases):  # v1 mounts "cpu,cpuacct" as one folder, or "cpu"
            here = base / group.lstrip("/")
            for folder in [here, *here.parents]:
                if folder.is_relative_to(base):
                    yield folder, v2


def _read(path: Path) -> str | None:
    with contextlib.suppress(OSError, ValueError):
        return path.read_text().strip()
    return None


def cpu_quota(proc: Path = PROC, root: Path = ROOT) -> float | None:
    """The smallest CPU quota of this process's cgroup and its parents, in cores (quota over
    period: 1.5 for "150000 100000"); None without one."""
    found = []
    for folder, v2 in _groups("cpu", proc, root):
        if v2:
            parts = (_read(folder / "cpu.max") or "").split()
        else:
            parts = [_read(folder / "cpu.cfs_quota_us") or "", _read(folder / "cpu.cfs_period_us")
                     or ""]
        with contextlib.suppress(ValueError, IndexError):
            quota, period = int(parts[0]), int(parts[1])  # "max": no quota (ValueError)
            if quota > 0 and period > 0:  # v1's -1: no quota
                found.append(quota / period)
    return min(found) if found else None


def process_limit(proc: Path = PROC, root: Path = ROOT,
                  statm: Path = Path("/proc/self/statm")) -> tuple[int, str] | None:
    """The smallest memory limit this process runs under, in bytes, and its name: its memory
    cgroup's (v2 ``memory.max``, v1 ``memory.limit_in_bytes``, here or in a parent group: a
    SLURM job's ``--mem``, a container's) and ``ulimit -v`` (RLIMIT_AS) less the address space
    the process already holds (``statm``: torch's libraries alone are gigabytes of it); None
    without one. A run above it would be killed by the kernel, unannounced."""
    found = []
    soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    if soft != resource.RLIM_INFINITY:
        held = 0
        with contextlib.suppress(ValueError, IndexError, AttributeError):
            held = int(_read(statm).split()[0]) * os.sysconf("SC_PAGE_SIZE")
        found.append((max(0, soft - held), "its ulimit -v"))
    for folder, v2 in _groups("memory", proc, root):
        with contextlib.suppress(ValueError, TypeError):
            value = int(_read(folder / ("memory.max" if v2 else "memory.limit_in_bytes")))
            if value < 2 ** 62:  # "max", or v1's page-rounded 2^63: no limit
                found.append((value, "its cgroup's memory limit"))
    return min(found) if found else None


def usable_cores(proc: Path = PROC, root: Path = ROOT) -> int:
    """Cores this process may use: ``joblib.cpu_count`` (machine, affinity, the mount's quota,
    LOKY_MAX_CPU_COUNT) and its own cgroup's quota (``cpu_quota``, rounded up); at least 1."""
    from joblib import cpu_count

    cores, quota = cpu_count(), cpu_quota(proc, root)
    return max(1, min(cores, math.ceil(quota)) if quota else cores)


def workers(jobs: int, cores: int, job_bytes: int = 0, memory: int | None = None,
            gpu: bool = False) -> int:
    """Jobs run at once: one per usable core (``cores``), at most ``jobs`` and at most as many
    as ``memory`` holds at ``job_bytes`` each (the largest job's estimate); on a GPU, one (a
    pack fills the device). At least 1."""
    most = 1 if gpu else cores
    if job_bytes > 0 and memory is not None:
        most = min(most, memory // job_bytes)
    return max(1, min(most, jobs))
