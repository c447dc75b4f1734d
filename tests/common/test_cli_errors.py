"""Every lmforge CLI turns an operating-system error (a file where a directory belongs, a full
disk) into one line on stderr and exit 4 (the storage error, docs/design.md), through the one mechanism
in lmforge.common.errors (CLI_ERRORS, report_failure); a taken port is a configuration error (2).
(Data prep's own storage errors, with a rerun after the fault: tests/dataprep/test_storage_errors.py.)

A full disk is made with RLIMIT_FSIZE in the child (writes past the limit fail with EFBIG, which
Python's ignored SIGXFSZ turns into an OSError): no root, no mount, any CI runner."""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from lmforge.common.errors import ConfigError, StorageError, as_lmforge_error, report_failure
from lmforge.common.logging import get_logger
from lmforge.common.metrics import new_registry, serve_metrics
from tests.trainer.helpers import random_output

TINY = ["data.seq_len=32", "data.batch_size=4", "optim.warmup_steps=1",
        "model.overrides={n_layer: 1, n_head: 2, n_embd: 32, context_length: 32}"]
LIMITED = ("import resource, runpy, signal, sys; limit = int(sys.argv.pop(1)); module = sys.argv.pop(1); "
           "resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)); signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
           "runpy.run_module(module, run_name='__main__')")
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
get_logger("tests")  # JSON logs go to the session's stdout, not to the first capsys that happens to configure them


class RecordingLog:
    def __init__(self):
        self.records: list[tuple[str, dict]] = []

    def error(self, event: str, **fields) -> None:
        self.records.append((event, fields))


def run_module(module: str, *args, limit: int | None = None) -> subprocess.CompletedProcess:
    command = ([sys.executable, "-c", LIMITED, str(limit), module] if limit else [sys.executable, "-m", module])
    return subprocess.run([*command, *map(str, args)], capture_output=True, text=True, timeout=300, env=ENV)


def one_line(stderr: str) -> str:
    """The last line of stderr, checked to be the only one lmforge wrote (no traceback)."""
    assert "Traceback" not in stderr, stderr[-3000:]
    return stderr.strip().splitlines()[-1]


@pytest.fixture
def a_file(tmp_path) -> Path:
    path = tmp_path / "a-file"
    path.write_text("not a directory")
    return path


def test_report_failure_maps_an_os_error_to_one_line_and_exit_4(capsys):
    error = OSError(errno.ENOSPC, "No space left on device")
    error.filename = "/data/out/shards/train_00000.bin"
    log = RecordingLog()
    assert report_failure(log, "lmforge-x run", error, command="run") == 4
    assert capsys.readouterr().err == ("lmforge-x run: error: storage error: No space left on device (ENOSPC): "
                                       "/data/out/shards/train_00000.bin\n")
    message = "storage error: No space left on device (ENOSPC): /data/out/shards/train_00000.bin"
    assert log.records == [("failed", {"command": "run", "errno": "ENOSPC", "kind": "OSError", "error": message})]
    assert isinstance(as_lmforge_error(NotADirectoryError(errno.ENOTDIR, "Not a directory", "x")), StorageError)


def test_a_taken_metrics_port_is_a_configuration_error():
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=f"cannot serve metrics on 127.0.0.1:{port}: Address already in use"):
            serve_metrics(new_registry(), port, host="127.0.0.1")


def test_serve_with_a_taken_port_says_so_in_one_line(tmp_path, capsys):
    from lmforge.inference.cli import main

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        assert main(["--model", str(tmp_path / "model"), "--host", "127.0.0.1", "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert err == f"lmforge-serve: error: cannot listen on 127.0.0.1:{port}: Address already in use\n"


def test_uploader_restore_into_a_file(tmp_path, a_file, capsys):
    from lmforge.uploader.cli import main

    (tmp_path / "store").mkdir()
    assert main(["restore", "--src", f"file://{tmp_path / 'store'}", "--dir", str(a_file / "checkpoints")]) == 4
    err = capsys.readouterr().err
    assert err == f"lmforge-uploader restore: error: storage error: Not a directory (ENOTDIR): {a_file}/checkpoints\n"


def test_pipeline_clis_with_a_file_in_the_way(a_file, capsys):
    from lmforge_pipelines import compile as compile_cli
    from lmforge_pipelines import run_local

    assert compile_cli.main(["--output", str(a_file)]) == 4
    assert "storage error: File exists (EEXIST)" in one_line(capsys.readouterr().err)
    assert run_local.main(["--workdir", str(a_file / "work"), "--data-only"]) == 4
    assert "storage error: Not a directory (ENOTDIR)" in one_line(capsys.readouterr().err)


def test_demo_with_a_file_for_its_workdir(a_file):
    result = run_module("lmforge.demo", "run", "--set", f"workdir={a_file}", "--no-hold")
    assert result.returncode == 4, result.stderr[-3000:]
    assert one_line(result.stderr) == f"lmforge-demo: storage error: File exists (EEXIST): {a_file}"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A two-step run with a committed checkpoint; the data it trained on."""
    tmp = tmp_path_factory.mktemp("cli-errors")
    data = random_output(tmp / "data", train_tokens=8_000)
    run = tmp / "run"
    result = run_module("lmforge.trainer", f"data.sources=[{{path: {data}}}]", "steps=2", "checkpoint.every=1",
                        f"run_dir={run}", *TINY)
    assert result.returncode == 0, result.stderr[-3000:]
    return data, sorted((run / "checkpoints").glob("step-*"))[-1]


def test_trainer_disk_full_while_checkpointing(tmp_path, trained):
    data, checkpoint = trained
    limit = max(p.stat().st_size for p in checkpoint.rglob("*.distcp")) - 1  # the rest of the run fits
    result = run_module("lmforge.trainer", f"data.sources=[{{path: {data}}}]", "steps=2", "checkpoint.every=1",
                        f"run_dir={tmp_path / 'run'}", *TINY, limit=limit)
    assert result.returncode == 4, result.stderr[-3000:]
    line = one_line(result.stderr)
    assert line.startswith(f"lmforge trainer: error: cannot write checkpoint {tmp_path / 'run'}/checkpoints/step-")
    assert line.endswith("(rank 0): File too large (EFBIG)")


def test_trainer_with_a_file_for_its_run_dir(a_file, trained):
    data, _ = trained
    result = run_module("lmforge.trainer", f"data.sources=[{{path: {data}}}]", "steps=2", f"run_dir={a_file / 'run'}",
                        *TINY)
    assert result.returncode == 4, result.stderr[-3000:]
    assert one_line(result.stderr) == f"lmforge trainer: error: storage error: Not a directory (ENOTDIR): {a_file}/run"


def test_export_into_a_file_and_onto_a_full_disk(tmp_path, a_file, trained, capsys):
    from lmforge.trainer.cli import main

    _, checkpoint = trained
    assert main(["export", "--checkpoint", str(checkpoint), "--output", str(a_file)]) == 4
    err = capsys.readouterr().err
    assert err == f"lmforge-train export: error: storage error: Not a directory (ENOTDIR): {a_file}\n"
    assert a_file.read_text() == "not a directory"
    package = tmp_path / "package"
    result = run_module("lmforge.trainer.cli", "export", "--checkpoint", checkpoint, "--output", package, limit=4096)
    assert result.returncode == 4, result.stderr[-3000:]
    assert one_line(result.stderr).startswith(f"lmforge-train export: error: cannot write {package}/model.safetensors:")
    assert not package.exists() and not list(tmp_path.glob(".tmp-*"))
