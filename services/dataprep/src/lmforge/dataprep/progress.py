"""Progress for long phases: a bar on a terminal, periodic JSON log lines otherwise."""

from __future__ import annotations

import sys
import time

from lmforge.common.logging import StructLogger

LOG_EVERY_S = 10.0


class Progress:
    def __init__(self, log: StructLogger, phase: str, total: int, unit: str = "inputs"):
        self.log, self.phase, self.total, self.unit = log, phase, total, unit
        self.done = 0
        self._last_log = time.monotonic()
        self._bar = None
        if sys.stderr.isatty():
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=phase, unit=unit, file=sys.stderr)

    def advance(self, n: int = 1, **fields) -> None:
        self.done += n
        if self._bar is not None:
            self._bar.update(n)
        elif time.monotonic() - self._last_log >= LOG_EVERY_S or self.done == self.total:
            self._last_log = time.monotonic()
            self.log.info("progress", phase=self.phase, done=self.done, total=self.total, unit=self.unit, **fields)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
