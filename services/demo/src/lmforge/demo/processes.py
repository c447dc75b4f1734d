"""The demo's child processes: each in its own process group with its log in WORKDIR/logs, recorded
in WORKDIR/processes.json so that `lmforge-demo stop` can end what a killed demo left running."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import httpx

from lmforge.common.atomic_files import atomic_write_bytes

STATE_FILE = "processes.json"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http_ok(url: str, process: subprocess.Popen | None, what: str, timeout: float,
                 interval: float = 0.1, headers: Mapping[str, str] | None = None) -> None:
    """Poll `url` until it answers 200; fail at once if `process` exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode} before it was ready")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2, headers=headers).status_code == 200:
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


def _start_time(pid: int) -> str | None:
    """The kernel's start time of `pid` (field 22 of /proc/PID/stat): tells a recorded process from
    a later one that reused its pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _end_group(pgid: int, timeout: float, leader: subprocess.Popen | None = None) -> None:
    """SIGTERM the whole group (torchrun's workers, kfp's step processes included), SIGKILL what
    is left after `timeout` seconds. Our own child `leader` is reaped as soon as it exits: a
    zombie would keep the group "alive"."""
    _signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if leader is not None:
            leader.poll()
        if not _group_alive(pgid):
            return
        time.sleep(0.1)
    _signal_group(pgid, signal.SIGKILL)


class StepFailed(RuntimeError):
    """A command the demo ran failed; the message ends with the tail of its log."""


class Supervisor:
    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.logs = workdir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.state_path = workdir / STATE_FILE
        self._children: dict[str, subprocess.Popen] = {}

    def start(self, name: str, command: Sequence[str], env: Mapping[str, str] | None = None) -> subprocess.Popen:
        """`command` in the background, its output in logs/NAME.log."""
        if name in self._children and self._children[name].poll() is None:
            raise RuntimeError(f"{name} is already running")
        with open(self.log_path(name), "ab") as log:
            process = subprocess.Popen(list(command), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       env={**os.environ, **(env or {})}, start_new_session=True)
        self._children[name] = process
        self._record()
        return process

    def run(self, name: str, command: Sequence[str], env: Mapping[str, str] | None = None,
            timeout: float = 600, expect_failure: bool = False, tick: Callable[[], None] | None = None,
            tick_seconds: float = 10) -> int:
        """`command` to completion (a StepFailed if it fails, unless `expect_failure`); returns its
        exit code. `tick` is called every `tick_seconds` while it runs (progress lines)."""
        process = self.start(name, command, env)
        deadline = time.monotonic() + timeout
        while (code := process.poll()) is None:
            if time.monotonic() > deadline:
                self.stop(name)
                raise StepFailed(f"{name} did not finish within {timeout:.0f}s\n{self.tail(name)}")
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = process.wait(timeout=tick_seconds if tick else 1)
            if code is None and tick:
                tick()
        self._children.pop(name)
        self._record()
        if code != 0 and not expect_failure:
            raise StepFailed(f"{name} exited with {code}\n{self.tail(name)}")
        return code

    def wait(self, name: str, timeout: float) -> int:
        try:
            code = self._children[name].wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise StepFailed(f"{name} still running after {timeout:.0f}s\n{self.tail(name)}") from None
        self._children.pop(name)
        self._record()
        return code

    def exited(self) -> list[str]:
        """The background processes that have ended."""
        return [name for name, process in self._children.items() if process.poll() is not None]

    def stop(self, name: str, timeout: float = 15) -> None:
        process = self._children.pop(name, None)
        if process is not None:
            _end_group(process.pid, timeout, process)
            process.wait()
            self._record()

    def stop_all(self) -> None:
        for name in reversed(list(self._children)):
            self.stop(name)
        self.state_path.unlink(missing_ok=True)

    def log_path(self, name: str) -> Path:
        return self.logs / f"{name}.log"

    def tail(self, name: str, lines: int = 25) -> str:
        try:
            text = self.log_path(name).read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(f"  | {line}" for line in text[-lines:]) + f"\n  (whole log: {self.log_path(name)})"

    def _record(self) -> None:
        state = [{"name": name, "pid": p.pid, "start_time": _start_time(p.pid)}
                 for name, p in self._children.items() if p.poll() is None]
        me = os.getpid()
        record = {"supervisor_pid": me, "supervisor_start_time": _start_time(me), "processes": state}
        atomic_write_bytes(self.state_path, json.dumps(record, indent=1).encode())


def stop_recorded(workdir: Path, timeout: float = 15) -> list[str]:
    """End every process group a demo in `workdir` recorded that is still the same process;
    returns their names. The demo's own process is ended first, so it cannot start more."""
    path = workdir / STATE_FILE
    if not path.exists():
        return []
    state = json.loads(path.read_text())
    supervisor = state.get("supervisor_pid")
    if supervisor and supervisor != os.getpid() and _start_time(supervisor) == state.get("supervisor_start_time"):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(supervisor, signal.SIGTERM)
    stopped = []
    for entry in state["processes"]:
        if entry["start_time"] is not None and _start_time(entry["pid"]) == entry["start_time"]:
            _end_group(entry["pid"], timeout)
            stopped.append(entry["name"])
    path.unlink(missing_ok=True)
    return stopped
