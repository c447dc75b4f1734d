"""`lmforge-train run` and `lmforge-train preflight`: torchrun (torch.distributed.run) inside the
command's own process, so that

- the ranks die with it: torchrun starts each rank in a session of its own, which a signal to the
  command's process group does not reach, and a rank left running trains on into a run directory
  that a relaunch is writing to. Each rank arms the parent-death signal when it starts
  (`die_with_launcher`) and its parent is this process, so killing it, or its process group, even
  by SIGKILL, ends every rank;
- it exits with the documented code of the first rank to fail (3 unusable input, 7 …; a rank
  killed by signal N: 128 + N), where torchrun itself exits 1.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Sequence

from lmforge.common.errors import LmforgeError
from lmforge.common.parent_death import die_with_parent

# The process that started the ranks, for a rank to check that it is still its parent.
LAUNCHER_PID_ENV = "LMFORGE_TRAINER_LAUNCHER_PID"


class LaunchError(LmforgeError):
    """The ranks did not all finish: exits with a rank's code, or 128 + the signal that stopped them."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


def torchrun(module: str, nproc: int, config: str | None, overrides: Sequence[str]) -> int:
    """`torchrun --standalone --nproc_per_node NPROC -m MODULE [--config F] OVERRIDES…`, here."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    os.environ[LAUNCHER_PID_ENV] = str(os.getpid())  # the ranks inherit this environment
    args = parse_args(["--standalone", f"--nproc_per_node={nproc}", "-m", module,
                       *(["--config", config] if config else []), *overrides])
    try:
        run(args)
    except ChildFailedError as exc:
        raise first_failure(exc.failures) from None
    except SignalException as exc:  # torchrun has stopped the ranks
        raise LaunchError(f"stopped by {exc.sigval.name}", 128 + exc.sigval) from None
    return 0


def first_failure(failures: dict) -> LaunchError:
    """The error of the rank that failed first ({rank: torchrun's ProcessFailure}, each with its
    exit code, negative for a signal, and its time).

    torchrun stamps a failure in whole seconds and, once one rank fails, sends SIGTERM to the
    rest: a rank ended by SIGTERM is the consequence of another's failure whenever one ended
    otherwise, even in the same second, so those ranks come first."""
    def order(r: int) -> tuple:
        return (failures[r].exitcode == -signal.SIGTERM, failures[r].timestamp, r)

    rank = min(failures, key=order)
    code = failures[rank].exitcode
    if code < 0:
        how, exit_code = f"was killed by {signal.Signals(-code).name}", 128 - code
    else:
        how, exit_code = f"exited with code {code}", code
    others = f" (the first of {len(failures)} failed ranks)" if len(failures) > 1 else ""
    return LaunchError(f"rank {rank} {how}{others}", exit_code)


def die_with_launcher() -> None:
    """In a rank: die with the process that started it, torchrun's (lmforge-train run's, or a
    torchrun of its own, as in the training job's container). A process not under torchrun is a
    run of its own and is left alone."""
    if "TORCHELASTIC_RUN_ID" not in os.environ:
        return
    launcher = os.environ.get(LAUNCHER_PID_ENV)
    die_with_parent(int(launcher) if launcher else None)
