"""The command line of a generated file (`make docs`): print it, write it, or check that the
checked-in copy is current (exit 1 when stale, so a test or CI can fail on it)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from lmforge.common.errors import LmforgeError


def generated_file_main(argv: Sequence[str] | None, *, prog: str, description: str | None, what: str,
                        render: Callable[[], str], update: Callable[[Path, str], bool],
                        is_current: Callable[[Path, str], bool], write_flag: str = "--write",
                        write_help: str = "write it to FILE") -> int:
    """`update(path, text)` writes and returns False when the file was already current;
    `what` names the generated thing in the messages ("configuration reference")."""
    parser = argparse.ArgumentParser(prog=prog, description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    group = parser.add_mutually_exclusive_group()
    group.add_argument(write_flag, dest="write", type=Path, metavar="FILE", help=write_help)
    group.add_argument("--check", type=Path, metavar="FILE", help=f"exit 1 when the {what} in FILE is out of date")
    args = parser.parse_args(argv)
    try:
        text = render()
        if args.write:
            changed = update(args.write, text)
            sys.stdout.write(f"{args.write}: {what} {'updated' if changed else 'up to date'}\n")
        elif args.check:
            if not is_current(args.check, text):
                sys.stderr.write(f"{args.check} {what} is out of date: run `make docs`\n")
                return 1
        else:
            sys.stdout.write(text)
    except OSError as exc:
        sys.stderr.write(f"{prog}: error: {exc}\n")
        return 3
    except LmforgeError as exc:
        sys.stderr.write(f"{prog}: error: {exc}\n")
        return exc.exit_code
    return 0
