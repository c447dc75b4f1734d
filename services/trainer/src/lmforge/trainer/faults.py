"""Fault injection for the resilience tests, off unless its environment variables are set.

LMFORGE_TRAINER_KILL_AT_STEP=N   SIGKILL this process when it reaches step N
LMFORGE_TRAINER_HANG_AT_STEP=N   stop responding (sleep) at step N, as a hung peer does
LMFORGE_TRAINER_SLOW_DATA_SECONDS=S  every batch this rank loads takes S seconds longer
LMFORGE_TRAINER_FAULT_RANK=R     only on rank R (default: every rank)
LMFORGE_TRAINER_ZERO_WEIGHTS_AT_STEP=N  the weights package of step N (RUN_DIR/weights, written by rank 0)
                                 holds zeros for every parameter; training itself is unaffected (the
                                 evaluation branch's regression alert is proven with it)

Faults fire on torchrun's first attempt only, so a restarted attempt (TORCHELASTIC_RESTART_COUNT
> 0) runs clean.
"""

from __future__ import annotations

import os
import signal
import time


def _armed(variable: str, step: int, rank: int) -> bool:
    target = os.environ.get(variable)
    if target is None or int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0:
        return False
    return step == int(target) and rank == int(os.environ.get("LMFORGE_TRAINER_FAULT_RANK", rank))


def maybe_inject(step: int, rank: int) -> None:
    if _armed("LMFORGE_TRAINER_KILL_AT_STEP", step, rank):
        os.kill(os.getpid(), signal.SIGKILL)
    if _armed("LMFORGE_TRAINER_HANG_AT_STEP", step, rank):
        time.sleep(24 * 3600)


def data_delay(rank: int) -> float:
    delay = float(os.environ.get("LMFORGE_TRAINER_SLOW_DATA_SECONDS", "0"))
    return delay if rank == int(os.environ.get("LMFORGE_TRAINER_FAULT_RANK", rank)) else 0.0


def zero_weights(step: int) -> bool:
    """Whether the weights package of `step` is written with every parameter zeroed (the package is
    rank 0's: LMFORGE_TRAINER_FAULT_RANK does not apply)."""
    target = os.environ.get("LMFORGE_TRAINER_ZERO_WEIGHTS_AT_STEP")
    restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0
    return target is not None and not restarted and step == int(target)
