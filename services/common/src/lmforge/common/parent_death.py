"""A child process that dies with the process that started it, even when that one is killed by
SIGKILL: an orphan would go on writing into an output or run directory that a rerun may already
be writing to (a data-prep pool process, a trainer rank)."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(parent_pid: int | None) -> None:
    """Have the kernel SIGKILL this process when its parent dies (Linux's parent-death signal;
    elsewhere nothing). The signal follows the parent *thread* that started this process, so the
    parent must start it from a thread that lives as long as the parent does. parent_pid: the
    process that started this one; if this process's parent is no longer it, the parent died
    before the signal was armed, and this process exits now (None: no such check)."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)
