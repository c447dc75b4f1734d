"""The demo's training step reads what ended attempt 1 from torchrun's failure summary (torchrun
itself exits 1 whatever ended its workers)."""

from __future__ import annotations

from lmforge.demo.stages.train import killed_by

# torchrun 2.13's summary, captured from a 2-process run the fault injection killed; rank 1's entry
# shows the SIGTERM torchrun sends a rank still running when another fails.
SIGKILLED = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
======================================================
lmforge.trainer FAILED
------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-24_15:25:16
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -15 (pid: 20404)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 20404
------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-24_15:25:16
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -9 (pid: 20403)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 20403
======================================================
"""


def test_the_root_cause_signal_is_named():
    assert killed_by(SIGKILLED) == "SIGKILL"  # not the SIGTERM torchrun sent the other rank


def test_a_rank_that_exited_with_a_code_was_not_killed():
    exited = SIGKILLED.replace("exitcode  : -9 (pid: 20403)  (SIGKILL)", "exitcode  : 5 (pid: 20403)")
    assert killed_by(exited) is None
    assert killed_by("no failure summary at all") is None
