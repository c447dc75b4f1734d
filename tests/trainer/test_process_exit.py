"""A trainer process run as `python -m` freezes its heap as it exits (process_exit); a `main` called
inside another process (a test's, a pipeline step's) leaves that process's collector alone."""

from __future__ import annotations

import gc
import subprocess
import sys

from lmforge.trainer.__main__ import main


def test_frozen_exit_returns_the_code_with_the_heap_frozen():
    script = ("import gc; from lmforge.trainer.process_exit import frozen_exit; "
              "code = frozen_exit(3); print(code, gc.get_freeze_count() > 0)")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["3", "True"]


def test_main_called_in_a_process_does_not_freeze_its_heap(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "2")  # refused at start, before any process group
    frozen = gc.get_freeze_count()
    refused = [f"data.sources=[{{path: {tmp_path}}}]", f"run_dir={tmp_path / 'run'}", "parallel.mode=ddp",
               "parallel.cp=2"]
    assert main(refused) == 2
    assert "context parallelism runs under FSDP" in capsys.readouterr().err
    assert gc.get_freeze_count() == frozen
