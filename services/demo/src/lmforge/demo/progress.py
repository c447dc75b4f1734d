"""What the demo prints while it runs: a numbered line when a stage starts, indented notes, the
stage's time when it ends."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from typing import TextIO


class Progress:
    def __init__(self, total: int, stream: TextIO = sys.stdout):
        self.total, self.stream = total, stream
        self.started = time.monotonic()

    @contextlib.contextmanager
    def stage(self, number: int, title: str) -> Iterator[None]:
        self.header(number, title)
        began = time.monotonic()
        yield
        self.note(f"done in {time.monotonic() - began:.0f} s")

    def header(self, number: int, title: str) -> None:
        self._print(f"[{number}/{self.total}] {title}")

    def note(self, text: str) -> None:
        self._print(f"      {text}")

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def _print(self, line: str) -> None:
        self.stream.write(line + "\n")
        self.stream.flush()
