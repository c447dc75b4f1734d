"""The services' console scripts, from the environment the demo runs in."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path


def script(name: str) -> str:
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if not found:
        raise FileNotFoundError(f"{name} not found: install the services (`make setup`)")
    return found
