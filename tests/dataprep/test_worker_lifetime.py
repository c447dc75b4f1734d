"""`kill -9` of `lmforge-dataprep run` takes its worker processes with it: an orphaned worker
would finish its input and write into an output directory that a rerun may already be using.

The inputs are served over HTTP by a local server that trickles them out slowly, so both workers
are inside an input (blocked on the network, not on the CPU) when the main process is killed."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.dataprep.wet_records import english, wet_record

BODY = b"".join(wet_record(f"https://slow.example/{i}", english(i)) for i in range(40))
CHUNK, PAUSE = 256, 0.05  # BODY takes ~10 s to send: far longer than the test waits


class TrickleServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), TrickleHandler)
        self.started: list[str] = []
        self.outcomes: dict[str, str] = {}  # path -> "complete" | "cut off"
        self.lock = threading.Lock()

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/{name}"


class TrickleHandler(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - the http.server API
        server: TrickleServer = self.server
        with server.lock:
            server.started.append(self.path)
        self.send_response(200)
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        outcome = "complete"
        try:
            for start in range(0, len(BODY), CHUNK):
                self.wfile.write(BODY[start : start + CHUNK])
                self.wfile.flush()
                time.sleep(PAUSE)
        except (BrokenPipeError, ConnectionResetError):
            outcome = "cut off"
        with server.lock:
            server.outcomes[self.path] = outcome

    def log_message(self, *args):
        pass


@pytest.fixture
def trickle_server():
    server = TrickleServer()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid:
                found.append(int(stat.parent.name))
    return found


def is_pool_worker(pid: int) -> bool:
    with contextlib.suppress(OSError):
        return b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()  # not the resource tracker
    return False


def alive(pid: int) -> bool:
    """Running (a zombie waiting for init to reap it counts as dead)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def wait_until(condition, timeout: float, step: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(step)
    return condition()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_workers_die_with_the_killed_main_process(tmp_path, trickle_server):
    out = tmp_path / "out"
    urls = [trickle_server.url(f"part-{i}.warc.wet") for i in range(2)]
    command = [sys.executable, "-m", "lmforge.dataprep", "run", "--input", *urls, "--output", str(out),
               "--workers", "2", "--set", "steps.langid.enabled=false"]
    main = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    workers: list[int] = []
    try:
        assert wait_until(lambda: len(trickle_server.started) == 2, timeout=120), "the workers never asked for input"
        workers = [pid for pid in children(main.pid) if is_pool_worker(pid)]
        assert len(workers) == 2, workers
        main.send_signal(signal.SIGKILL)
        main.wait(timeout=10)

        assert wait_until(lambda: not any(alive(pid) for pid in workers), timeout=5), \
            f"workers outlived their parent: {[pid for pid in workers if alive(pid)]}"
        assert wait_until(lambda: len(trickle_server.outcomes) == 2, timeout=5)
        assert sorted(trickle_server.outcomes.values()) == ["cut off", "cut off"]
        assert not list(out.glob("work/done/input-*")) and not list(out.glob("work/docs/*.parquet"))
    finally:
        for pid in [main.pid, *workers]:  # only what this test started, whatever happened above
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            main.wait(timeout=5)
