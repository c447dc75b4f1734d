"""The skeleton every lmforge command line shares: the argparse parser with the configuration
options, the pydantic config loaded and validated, logging, and what a caught error becomes
(one line on stderr and the documented exit code: 2 config, 3 input, 4 storage, …).

    CLI = ServiceCli("lmforge-uploader", service="uploader", description=__doc__,
                     load_config=load_uploader_config)
    watch = CLI.command("watch", run_watch, help="…", config="load")  # handler(args, config) -> int
    watch.add_argument("--dir", required=True)
    main = CLI.main

A command's `config` says what it does with the configuration options: None, it has none;
"load", they are loaded (defaults < --config < environment < --set) and passed to the handler;
"explicit", loaded only when --config or --set is given, else the handler gets None (a
data-prep stage then reuses the config its workers recorded); "pass", the handler only passes
them on (the trainer's torchrun launch) and gets None.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any, Literal

from lmforge.common.errors import CLI_ERRORS, as_lmforge_error, report_failure
from lmforge.common.logging import get_logger

ConfigMode = Literal["load", "explicit", "pass"] | None
Handler = Callable[[argparse.Namespace, Any], int]
EXIT_INTERRUPTED = 130


def add_config_options(parser: argparse.ArgumentParser, *, config_help: str, set_help: str | None) -> None:
    """--config FILE, then --set KEY=VALUE (repeatable) into `overrides`; without `set_help`,
    plain KEY=VALUE arguments instead (the trainer's style, which torchrun passes through)."""
    group = parser.add_argument_group("configuration")
    group.add_argument("--config", metavar="FILE", help=config_help)
    if set_help is None:
        group.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides")
    else:
        group.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help=set_help)


class ServiceCli:
    """One lmforge command line: its parser (subcommands, or one command), and main().

    prog: the name in usage and in error lines (`name` when they differ, e.g. a `python -m`
    entry point). service: the logger's service (None: no logger, for a `report` that logs
    nothing, as the demo's, whose stdout is its progress display). load_config:
    (path, overrides) -> the validated config. flag_fields: options that set the config field of
    the same name, after every --set (lmforge-serve's --model, --host, --port).
    default_command: the subcommand run when the first argument names none. interrupted: Ctrl-C
    prints this and exits 130 (else it propagates). internal_exit_code: for a CLI where exit 1
    is a verdict (the canary's regression), an untyped error and any unexpected exception exit
    with this code instead, the latter with an `internal_error` log line and its traceback.
    report: how a caught error is shown; report_failure's signature and return value.
    """

    def __init__(
        self,
        prog: str,
        *,
        service: str | None,
        description: str | None = None,
        epilog: str | None = None,
        name: str | None = None,
        load_config: Callable[[str | None, Sequence[str]], Any] | None = None,
        config_help: str = "YAML config file",
        set_help: str | None = "config override",
        flag_fields: Sequence[str] = (),
        default_command: str | None = None,
        interrupted: str | None = None,
        internal_exit_code: int | None = None,
        report: Callable[..., int] = report_failure,
    ):
        self.name = name or prog
        self.service = service
        self.epilog = epilog
        self.config_help, self.set_help = config_help, set_help
        self.flag_fields = tuple(flag_fields)
        self.default_command = default_command
        self.interrupted = interrupted
        self.internal_exit_code = internal_exit_code
        self.report = report
        self._load = load_config
        self._formatter = argparse.RawDescriptionHelpFormatter
        self.parser = argparse.ArgumentParser(
            prog=prog, description=description, epilog=epilog, formatter_class=self._formatter
        )
        self._subparsers: argparse._SubParsersAction | None = None
        self._handlers: dict[str | None, tuple[Handler, ConfigMode]] = {}

    def command(
        self,
        name: str | None,
        handler: Handler,
        *,
        help: str | None = None,
        config: ConfigMode = None,
        config_help: str | None = None,
    ) -> argparse.ArgumentParser:
        """Declare a subcommand (name None: the CLI's only command, on the top-level parser) and
        return its parser, for the command's own options."""
        if name is None:
            parser = self.parser
        else:
            if self._subparsers is None:
                self._subparsers = self.parser.add_subparsers(dest="command", required=True)
            parser = self._subparsers.add_parser(name, help=help, epilog=self.epilog, formatter_class=self._formatter)
        if config is not None:
            add_config_options(parser, config_help=config_help or self.config_help, set_help=self.set_help)
        self._handlers[name] = (handler, config)
        return parser

    def parse_args(self, argv: Sequence[str] | None = None) -> argparse.Namespace:
        argv = list(sys.argv[1:] if argv is None else argv)
        if self.default_command and (not argv or argv[0] not in (*self._handlers, "-h", "--help")):
            argv = [self.default_command, *argv]
        args = self.parser.parse_args(argv)
        if self._subparsers is None:
            args.command = None
        return args

    def load_config(self, args: argparse.Namespace) -> Any:
        """The config a command's handler gets (None where it takes or loads none)."""
        _, mode = self._handlers[args.command]
        overrides = [*getattr(args, "overrides", ()), *self._flag_overrides(args)]
        if mode == "load" or (mode == "explicit" and (args.config or overrides)):
            return self._load(args.config, overrides)
        return None

    def _flag_overrides(self, args: argparse.Namespace) -> list[str]:
        return [f"{key}={getattr(args, key)}" for key in self.flag_fields if getattr(args, key) is not None]

    def main(self, argv: Sequence[str] | None = None) -> int:
        args = self.parse_args(argv)
        log = get_logger(self.service) if self.service else None
        program = f"{self.name} {args.command}" if args.command else self.name
        context = {"command": args.command} if args.command else {}
        handler, _ = self._handlers[args.command]
        try:
            return handler(args, self.load_config(args))
        except CLI_ERRORS as exc:
            code = as_lmforge_error(exc).exit_code
            if self.internal_exit_code is not None and code == 1:  # 1 is the verdict: an untyped error is a bug
                code = self.internal_exit_code
            self.report(log, program, exc, **context, exit_code=code)
            return code
        except KeyboardInterrupt:
            if self.interrupted is None:
                raise
            sys.stderr.write(f"{self.interrupted}\n")
            return EXIT_INTERRUPTED
        except Exception as exc:
            if self.internal_exit_code is None:
                raise
            if log is not None:
                log.error("internal_error", **context, error=repr(exc), exc_info=True)
            sys.stdout.flush()
            sys.stderr.write(f"{program}: internal error: {exc!r}\n")
            return self.internal_exit_code
