"""The CLI skeleton every lmforge command line is built on (lmforge.common.cli): the config
options and their loading, and what a caught error becomes (one stderr line, a `failed` log
line, the exit code). The services' own CLIs are run in their tests and tests/common/test_cli_errors.py."""

from __future__ import annotations

import errno
import functools
import io
import json
import sys

import pytest

from lmforge.common.cli import ServiceCli
from lmforge.common.config import StrictModel, load_config
from lmforge.common.errors import ConfigError, LmforgeError
from lmforge.common.logging import configure_logging


class Settings(StrictModel):
    name: str = "default"
    size: int = 1


load_settings = functools.partial(load_config, Settings, env_prefix="LMFORGE_CLITEST")


@pytest.fixture
def logs():
    stream = io.StringIO()
    configure_logging("INFO", stream=stream)
    yield lambda: [json.loads(line) for line in stream.getvalue().splitlines()]
    configure_logging("INFO", stream=sys.__stdout__)  # the session's stdout, which outlives this test


def recording_cli(**kwargs) -> tuple[ServiceCli, list]:
    seen = []

    def handler(args, config):
        seen.append((args.command, config))
        return 0

    cli = ServiceCli("lmforge-x", service="x", load_config=load_settings, **kwargs)
    cli.command("run", handler, config="load").add_argument("--size", type=int)
    cli.command("stage", handler, config="explicit")
    cli.command("show", handler)
    return cli, seen


def test_config_from_file_env_and_set_in_that_order(tmp_path, monkeypatch):
    (tmp_path / "c.yaml").write_text("name: from-file\nsize: 2\n")
    monkeypatch.setenv("LMFORGE_CLITEST__SIZE", "3")
    cli, seen = recording_cli(flag_fields=("size",))
    assert cli.main(["run", "--config", str(tmp_path / "c.yaml")]) == 0
    assert cli.main(["run", "--config", str(tmp_path / "c.yaml"), "--set", "size=4", "--set", "name=set"]) == 0
    assert cli.main(["run", "--size", "5", "--set", "size=4"]) == 0  # a flag field wins over --set
    assert [config for _, config in seen] == [
        Settings(name="from-file", size=3),
        Settings(name="set", size=4),
        Settings(size=5),
    ]


def test_explicit_config_only_when_given_and_none_without_options(capsys):
    cli, seen = recording_cli()
    assert cli.main(["stage"]) == 0 and cli.main(["stage", "--set", "size=7"]) == 0 and cli.main(["show"]) == 0
    assert seen == [("stage", None), ("stage", Settings(size=7)), ("show", None)]
    with pytest.raises(SystemExit):
        cli.main(["show", "--set", "size=7"])  # a command without config has no such option
    assert "unrecognized arguments: --set" in capsys.readouterr().err


def test_a_bad_config_is_one_line_a_failed_log_line_and_exit_2(capsys, logs):
    cli, seen = recording_cli()
    assert cli.main(["run", "--set", "size=big"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("lmforge-x run: error: invalid configuration (argument size=big):\n  size: ")
    (failed,) = [line for line in logs() if line["event"] == "failed"]
    assert (failed["service"], failed["command"], failed["exit_code"], failed["kind"]) == ("x", "run", 2, "ConfigError")
    assert seen == []


def test_an_os_error_is_a_storage_error_exit_4(capsys, logs):
    def handler(args, config):
        raise NotADirectoryError(errno.ENOTDIR, "Not a directory", "/a-file/out")

    cli = ServiceCli("lmforge-y", service="y")
    cli.command(None, handler)  # a CLI without subcommands
    assert cli.main([]) == 4
    assert capsys.readouterr().err == "lmforge-y: error: storage error: Not a directory (ENOTDIR): /a-file/out\n"
    (failed,) = logs()
    assert (failed["errno"], failed["kind"], failed["exit_code"]) == ("ENOTDIR", "NotADirectoryError", 4)
    assert "command" not in failed


@pytest.mark.parametrize(
    "raised, code, line",
    [
        (LmforgeError("untyped"), 70, "lmforge-c run: error: untyped"),
        (ConfigError("bad key"), 2, "lmforge-c run: error: bad key"),
        (ValueError("a bug"), 70, "lmforge-c run: internal error: ValueError('a bug')"),
    ],
)
def test_where_exit_1_is_a_verdict_untyped_errors_and_bugs_are_internal(raised, code, line, capsys, logs):
    def handler(args, config):
        raise raised

    cli = ServiceCli("lmforge-c", service="c", default_command="run", internal_exit_code=70)
    cli.command("run", handler)
    cli.command("other", handler)
    assert cli.main([]) == code  # no command named: the default one
    assert capsys.readouterr().err == line + "\n"
    (logged,) = logs()
    assert logged["event"] == ("internal_error" if isinstance(raised, ValueError) else "failed")
    if isinstance(raised, ValueError):
        assert "ValueError: a bug" in logged["exception"]


def test_without_an_internal_code_a_bug_propagates_and_ctrl_c_exits_130_when_asked(capsys):
    def buggy(args, config):
        raise ValueError("a bug")

    def interrupted(args, config):
        raise KeyboardInterrupt

    cli = ServiceCli("lmforge-z", service="z", interrupted="interrupted; rerun to resume")
    cli.command("bug", buggy)
    cli.command("stop", interrupted)
    with pytest.raises(ValueError, match="a bug"):
        cli.main(["bug"])
    assert cli.main(["stop"]) == 130
    assert capsys.readouterr().err == "interrupted; rerun to resume\n"


def test_positional_overrides_are_passed_on_as_given():
    seen = []
    cli = ServiceCli("lmforge-t", service="t", set_help=None)
    cli.command("run", lambda args, config: seen.append((args.config, args.overrides, config)) or 0, config="pass")
    assert cli.main(["run", "--config", "t.yaml", "steps=5", "model.preset=tiny"]) == 0
    assert seen == [("t.yaml", ["steps=5", "model.preset=tiny"], None)]
