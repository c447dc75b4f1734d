"""The command line of a generated file (`make docs`): print it, write it, or check that the
checked-in copy is current (exit 1 when stale, so a test or CI can fail on it). A write is atomic,
keeps an existing file's mode, and leaves a current file alone."""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from lmforge.common.atomic_files import atomic_path
from lmforge.common.errors import LmforgeError


def is_current(path: Path, text: str) -> bool:
    return path.is_file() and path.read_text(encoding="utf-8") == text


def write_if_changed(path: Path, text: str) -> bool:
    """Write `text` to `path`; False when it was already current."""
    if is_current(path, text):
        return False
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
        if path.exists():
            shutil.copymode(path, tmp)
    return True


def generated_file_main(argv: Sequence[str] | None, *, prog: str, description: str | None, what: str,
                        render: Callable[[], str]) -> int:
    """`what` names the generated thing in the messages ("configuration reference")."""
    parser = argparse.ArgumentParser(prog=prog, description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--write", type=Path, metavar="FILE", help=f"write the {what} to FILE")
    group.add_argument("--check", type=Path, metavar="FILE", help=f"exit 1 when the {what} in FILE is out of date")
    args = parser.parse_args(argv)
    try:
        text = render()
        if args.write:
            changed = write_if_changed(args.write, text)
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
