"""CPU seconds a local PostgreSQL server has used, read from Linux's ``/proc``.

A benchmark snapshots :func:`server_cpu_s` before and after a measured window: the difference
is what the server's processes (the postmaster, every backend and worker, of every database)
spent in it, except that a backend which exits within the window counts with its whole life
(the postmaster collects it only then). On a server elsewhere (``PGMEMORY_DATABASE_URL``), or
without ``/proc``, the figure is None.
"""

from __future__ import annotations

import os
from pathlib import Path

#: Clock ticks a second, the unit of ``/proc/<pid>/stat``'s CPU times.
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def postmaster_pid(data_dir: Path) -> int | None:
    """The PID of the server running on ``data_dir`` (its ``postmaster.pid``), or None."""
    try:
        return int((data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return None


def server_cpu_s(postmaster: int | None) -> float | None:
    """User and system CPU seconds of the server whose postmaster is ``postmaster``: its own,
    its live children's, and those of the children that exited (counted into the postmaster
    when it reaped them). None when ``/proc`` has no such process."""
    if postmaster is None:
        return None
    ticks = 0
    found = False
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # exited meanwhile
            continue
        # after "pid (comm) ": state, ppid, ..., utime (12th), stime, cutime, cstime
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(entry.name) == postmaster:
            ticks += sum(int(f) for f in fields[11:15])
            found = True
        elif int(fields[1]) == postmaster:
            ticks += int(fields[11]) + int(fields[12])
    return ticks / _TICKS if found else None
