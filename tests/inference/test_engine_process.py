"""lmforge-serve with its engine in a process of its own, as deployed: the engine process dying
takes /healthz down (the pod is restarted) and fails the requests it held; the API process killed
without a word takes the engine process with it (no orphan holding the model's memory)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx

from tests.serving import free_port, running_server, wait_ready


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie is gone too
        return stat.read().split(") ")[1][0] != "Z"


def wait_until(condition, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def test_the_engine_process_dying_fails_healthz_and_readyz(tiny_package):
    with running_server(tiny_package) as url:
        ready = httpx.get(f"{url}/readyz").json()
        engine_pid = ready["engine_pid"]
        assert httpx.post(f"{url}/v1/completions", json={"prompt": "The", "max_tokens": 3}).status_code == 200
        os.kill(engine_pid, signal.SIGKILL)
        assert wait_until(lambda: httpx.get(f"{url}/healthz").status_code == 503, 10)
        health = httpx.get(f"{url}/healthz").json()
        assert "exited with code -9" in health["reason"]
        assert httpx.get(f"{url}/readyz").status_code == 503
        assert httpx.post(f"{url}/v1/completions", json={"prompt": "The", "max_tokens": 3}).status_code == 503


def test_an_api_process_killed_takes_its_engine_process_with_it(tiny_package):
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "lmforge.inference", "--model", str(tiny_package),
                               "--host", "127.0.0.1", "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_ready(url, server)
        engine_pid = httpx.get(f"{url}/readyz").json()["engine_pid"]
        assert engine_pid != server.pid and alive(engine_pid)
        server.kill()
        server.wait(timeout=10)
        assert wait_until(lambda: not alive(engine_pid), 10), "the engine process outlived its API process"
    finally:
        if server.poll() is None:
            server.kill()
