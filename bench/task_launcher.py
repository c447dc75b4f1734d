"""Runs commands for bench/dataprep_scaling.py and measures each one's own peak RSS and local disk.

Why a separate process: on Linux a child's peak RSS (its rusage ru_maxrss, and the ru_maxrss it
reports for itself) starts at the peak RSS of the process that spawned it (vfork + exec carries
that memory's high-water mark over), so commands started by the benchmark after it has read a
100 MB corpus, or while it hosts an in-memory S3 server, would all report at least that. This
process's own memory stays small (its own inherited figure is not passed on), so what it
reports is the command's.

Protocol: one JSON object per line on stdin, {"command", "env", "log", "tmpdir_root",
"disk_interval"}; one JSON line back per command: exit code, wall and CPU seconds, peak RSS
(wait4) and, with tmpdir_root, the peak bytes under the fresh TMPDIR made for the command there.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time


def dir_bytes(root: str) -> int:
    total, stack = 0, [root]
    while stack:
        try:
            with os.scandir(stack.pop()) as entries:
                for entry in entries:
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            stack.append(entry.path)
                        elif entry.is_file(follow_symlinks=False):
                            total += entry.stat(follow_symlinks=False).st_size
                    except FileNotFoundError:
                        pass  # a temp file gone between the listing and the stat
        except FileNotFoundError:
            pass
    return total


def run_one(request: dict) -> dict:
    env = dict(request["env"])
    tmpdir = tempfile.mkdtemp(prefix="task-", dir=request["tmpdir_root"]) if request.get("tmpdir_root") else None
    if tmpdir:
        env["TMPDIR"] = tmpdir
    interval = request.get("disk_interval", 0.01)
    started = time.perf_counter()
    peak_disk = 0
    with open(request["log"], "ab") as log:
        log.write(f"$ {' '.join(request['command'])}\n".encode())
        log.flush()
        proc = subprocess.Popen(request["command"], stdout=log, stderr=subprocess.STDOUT, env=env)
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG if tmpdir else 0)
            if tmpdir:
                peak_disk = max(peak_disk, dir_bytes(tmpdir))
            if pid:
                break
            time.sleep(interval)
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, so Popen does not wait again
    if tmpdir:
        shutil.rmtree(tmpdir, ignore_errors=True)
    return {"returncode": proc.returncode, "wall_seconds": round(time.perf_counter() - started, 3),
            "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 3),
            "peak_rss_bytes": usage.ru_maxrss * 1024, "peak_tmpdir_bytes": peak_disk}


def serve() -> None:
    for line in sys.stdin:
        sys.stdout.write(json.dumps(run_one(json.loads(line))) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    serve()
