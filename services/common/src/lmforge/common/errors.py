"""Typed errors. A CLI maps any LmforgeError to a clear message and a non-zero exit."""


class LmforgeError(Exception):
    """Base class of every error lmforge raises on purpose."""

    exit_code = 1


class ConfigError(LmforgeError):
    """Invalid configuration; the message names the offending field."""

    exit_code = 2


class InputError(LmforgeError):
    """Input that cannot be used: missing, unreadable, malformed."""

    exit_code = 3


class StorageError(LmforgeError):
    """An object-store or filesystem operation failed."""

    exit_code = 4


class ShardFormatError(InputError):
    """A token shard whose header, size or checksum is wrong."""


def report_failure(log, program: str, exc: LmforgeError, **context) -> int:
    """What every CLI does with an LmforgeError: a `failed` log line, one line on stderr,
    and the error's exit code to return."""
    import sys

    log.error("failed", **context, error=str(exc), kind=type(exc).__name__)
    sys.stderr.write(f"{program}: error: {exc}\n")
    return exc.exit_code
