"""The last thing a trainer process run as `python -m` does (a rank, a preflight rank, the
`lmforge.trainer.cli` launcher): hand back its exit code with the heap frozen.

torch and what it imports leave some 300k Python objects on the heap. As the interpreter tears its
modules down at exit it runs garbage-collection passes over all of them, about 0.8 s of CPU per
process (every rank pays it), to free memory that the process's exit frees anyway. gc.freeze()
moves them out of the collector's reach first. What changes: only objects caught in reference
cycles at exit are no longer finalized; the commands close what they open (files, process groups,
checkpoint writers, trackers) before they return, and atexit handlers still run."""

from __future__ import annotations

import gc


def frozen_exit(code: int) -> int:
    """`code`, after freezing the heap: for `sys.exit(frozen_exit(main()))` in a `__main__` block only (a
    `main` called in a longer-lived process, a test's, must leave that process's collector alone)."""
    gc.freeze()
    return code
