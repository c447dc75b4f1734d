"""A data-prep run as the stages see it: its store, config and inputs, and the executor that runs
its tasks on this machine (stage_runs.py runs the stages over it; report.py reads it)."""

from __future__ import annotations

from dataclasses import dataclass, field

from lmforge.common.logging import StructLogger, get_logger
from lmforge.common.store import Store
from lmforge.dataprep.config import DataprepConfig
from lmforge.dataprep.executor import Executor, local_executor


@dataclass
class Run:
    store: Store
    config: DataprepConfig
    inputs: list[str]
    log: StructLogger = field(default_factory=lambda: get_logger("dataprep"))
    processes: int = 1

    @property
    def n_inputs(self) -> int:
        return len(self.inputs)

    _executor: Executor | None = field(default=None, init=False, repr=False)

    def executor(self) -> Executor:
        """What runs this run's tasks on this machine: inline, or over `processes` processes
        (started once, for every phase of the run, until close())."""
        if self._executor is None:
            self._executor = local_executor(self.store, self.config, self.processes)
        return self._executor

    def close(self) -> None:
        if self._executor is not None:
            self._executor.close()
            self._executor = None

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
