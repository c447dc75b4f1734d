"""CPU seconds of a process and of every process under it, from /proc (Linux), for servers that
spawn processes of their own (an engine-core process, more API processes).

A process's /proc/PID/stat has its own user and system time (all its threads: utime, stime) and
the time of its children that exited and were waited for (cutime, cstime; theirs include their own
reaped children). The tree's CPU so far is the sum of the four over the root and every live
descendant (found by parent pid): a live child is counted once, by its own line; once it exits and
is reaped, its time moves into its parent's cutime/cstime, so the sum never drops. An exited child
not yet reaped (a zombie) still has its own line. Not counted: a descendant that was re-parented
away from the tree (a daemonized grandchild) and one that exited unreaped under a parent that
exited too.

psutil would do the same walk; it is not a dependency of the venv, so this reads /proc directly.
"""

from __future__ import annotations

import os
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, clock ticks: utime + stime + cutime + cstime), or None for a process gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = text.rsplit(")", 1)[1].split()  # the command name (in parentheses) may hold spaces
    return int(fields[1]), sum(int(f) for f in fields[11:15])


def process_tree(root: int) -> dict[int, int]:
    """{pid: clock ticks} of `root` and its live descendants."""
    stats = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None:
            stats[int(entry.name)] = stat
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in stats.items():
        children.setdefault(parent, []).append(pid)
    if root not in stats:
        return {}
    tree, todo = {}, [root]
    while todo:
        pid = todo.pop()
        tree[pid] = stats[pid][1]
        todo.extend(children.get(pid, ()))
    return tree


def start_time(pid: int) -> int | None:
    """The process's start time (clock ticks after boot): with the pid, who it is; None when gone."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None


def tree_cpu_seconds(root: int) -> float:
    """User + system CPU seconds of `root` and every process under it, so far (see the module)."""
    return sum(process_tree(root).values()) / TICKS
