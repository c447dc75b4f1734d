"""Child processes of the tests: wait until one answers over HTTP, stop one for good."""

from __future__ import annotations

import contextlib
import subprocess
import time

import httpx


def wait_http_ok(url: str, process: subprocess.Popen | None, what: str, timeout: float,
                 interval: float = 0.1) -> None:
    """Poll `url` until it answers 200; fail at once if `process` exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode} before it was ready")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2).status_code == 200:
                return
        time.sleep(interval)
    raise TimeoutError(f"{what} not ready at {url} within {timeout}s")


def stop(process: subprocess.Popen, timeout: float = 15) -> None:
    """SIGTERM, then SIGKILL if it has not exited within `timeout` seconds."""
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
