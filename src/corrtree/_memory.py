"""How much memory this process may still allocate, as the operating system says.

The kernel's ``MemAvailable`` is the machine's; a process in a container, a Kubernetes
pod, a SLURM job or a CI runner is held to its memory cgroup's limit instead, and is
killed without a word when it passes it.  :func:`system_available` is therefore the
smallest of ``MemAvailable`` and, for the process's cgroup and every ancestor with a
limit, that limit less what the group uses (its reclaimable page cache, the
``inactive_file`` pages, counted as free, as ``docker stats`` and the kubelet count
it).  Both cgroup versions are read: v2 (``memory.max``, ``memory.current``) and v1
(``memory.limit_in_bytes``, ``memory.usage_in_bytes``).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["format_bytes", "system_available"]

#: Where the kernel mounts the cgroup file systems, and where it lists a process's groups
#: (module attributes so that tests can lay out a tree of their own).
CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")
PROC_MEMINFO = Path("/proc/meminfo")

#: cgroup v1 writes "no limit" as a page-rounded 2^63 - 1; any limit above 2^60 is none.
_NO_LIMIT = 1 << 60


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except (OSError, ValueError):
        return None
    if text == "max":
        return None
    try:
        return int(text)
    except ValueError:
        return None


def _stat(path: Path, key: str) -> int:
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def _levels(mount: Path, group: str) -> list[Path]:
    """The folders of ``group`` and of its ancestors under ``mount`` that exist; a
    container that mounts only its own group sees it at the mount's root."""
    parts = [p for p in group.strip().split("/") if p]
    found = [mount.joinpath(*parts[:k]) for k in range(len(parts), -1, -1)]
    return [p for p in found if p.is_dir()]


def _cgroup_free() -> int | None:
    """The smallest ``limit - used`` over the process's memory cgroups (v2 and v1), or
    ``None`` where none has a limit."""
    try:
        lines = PROC_CGROUP.read_text().splitlines()
    except OSError:
        return None
    free: list[int] = []
    for line in lines:
        _, controllers, group = [*line.split(":", 2), "", ""][:3]
        if controllers == "" and (CGROUP_ROOT / "cgroup.controllers").exists():
            mounts = [(CGROUP_ROOT, "memory.max", "memory.current", "inactive_file")]
        elif controllers == "":
            mounts = [(CGROUP_ROOT / "unified", "memory.max", "memory.current", "inactive_file")]
        elif "memory" in controllers.split(","):
            mounts = [
                (
                    CGROUP_ROOT / "memory",
                    "memory.limit_in_bytes",
                    "memory.usage_in_bytes",
                    "total_inactive_file",
                )
            ]
        else:
            continue
        for mount, limit_file, usage_file, cache_key in mounts:
            for level in _levels(mount, group):
                limit = _read_int(level / limit_file)
                if limit is None or limit >= _NO_LIMIT:
                    continue
                used = _read_int(level / usage_file) or 0
                used -= min(used, _stat(level / "memory.stat", cache_key))
                free.append(max(0, limit - used))
    return min(free) if free else None


def _meminfo_available() -> int | None:
    try:
        with open(PROC_MEMINFO, encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def system_available() -> int:
    """Bytes of memory this process can still allocate: the smallest of the kernel's
    ``MemAvailable`` and the room left under every memory cgroup limit that applies to
    the process (v1 or v2); the physical memory size where neither can be read."""
    found = [v for v in (_meminfo_available(), _cgroup_free()) if v is not None]
    if found:
        return min(found)
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
        return 1 << 62


def format_bytes(nbytes: float) -> str:
    """``nbytes`` in the largest binary unit that keeps it at 1 or more: ``"512 B"``,
    ``"16.00 KiB"``, ``"1.50 GiB"``."""
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            if unit == "B":
                return f"{value:.0f} B"
            return f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")  # pragma: no cover
