"""API keys from a file (a mounted Secret, one key per line, `#` comments), re-read when the
file changes so a rotated Secret takes effect without a restart. Every key is compared in
constant time, and all of them always are, so timing reveals neither a key nor which matched."""

from __future__ import annotations

import hmac
import os
from pathlib import Path

from lmforge.common.errors import ConfigError


class ApiKeys:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._mtime: float | None = None
        self._keys: list[bytes] = []
        self._reload()
        if not self._keys:
            raise ConfigError(f"api_keys_file {self.path} holds no keys")

    def _reload(self) -> None:
        try:
            mtime = os.stat(self.path).st_mtime_ns
        except OSError as exc:
            if self._mtime is None:
                raise ConfigError(f"api_keys_file {self.path}: {exc.strerror}") from exc
            return  # mid-rotation: keep the keys we have
        if mtime != self._mtime:
            lines = (line.strip() for line in self.path.read_text(encoding="utf-8").splitlines())
            self._keys = [line.encode() for line in lines if line and not line.startswith("#")]
            self._mtime = mtime

    def check(self, authorization: str | None) -> bool:
        """True when `authorization` is `Bearer <one of the keys>`."""
        self._reload()
        scheme, _, token = (authorization or "").partition(" ")
        presented = token.strip().encode()
        matched = False
        for key in self._keys:
            matched |= hmac.compare_digest(presented, key)
        return scheme.lower() == "bearer" and bool(presented) and matched
