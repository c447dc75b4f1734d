"""Typed errors. A CLI maps any LmforgeError to a clear message and a non-zero exit, and an
OSError that reaches it (disk full, a file where a directory belongs, no permission) to a
StorageError: `except CLI_ERRORS as exc: return report_failure(...)`, which every CLI's
skeleton (lmforge.common.cli) does."""

import errno as _errno


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


# What a CLI's main() catches: its own errors, and the operating system's.
CLI_ERRORS = (LmforgeError, OSError)


def describe_os_error(exc: OSError) -> str:
    """`No space left on device (ENOSPC): /out/x`: the reason, its errno name and the file(s)."""
    if exc.errno is None or not exc.strerror:
        return str(exc)  # e.g. urllib's URLError: its str already says what and where
    text = f"{exc.strerror} ({_errno.errorcode.get(exc.errno, exc.errno)})"
    files = [str(f) for f in (exc.filename, exc.filename2) if f is not None]
    return f"{text}: {' -> '.join(files)}" if files else text


def as_lmforge_error(exc: BaseException) -> LmforgeError:
    """An LmforgeError as it is; an OSError as the StorageError (exit 4) it is to a user."""
    if isinstance(exc, LmforgeError):
        return exc
    if isinstance(exc, OSError):
        error = StorageError(f"storage error: {describe_os_error(exc)}")
        error.__cause__ = exc
        return error
    raise TypeError(f"not an error a CLI reports: {exc!r}")


def report_failure(log, program: str, exc: LmforgeError | OSError, **context) -> int:
    """What every CLI does with what it caught (CLI_ERRORS): a `failed` log line, one line on
    stderr, and the error's exit code to return."""
    import sys

    error = as_lmforge_error(exc)
    if error is not exc:
        context["errno"] = _errno.errorcode.get(exc.errno, exc.errno) if exc.errno is not None else None
    log.error("failed", **context, error=str(error), kind=type(exc).__name__)
    sys.stdout.flush()  # the log line first, then stderr: in a merged terminal the order reads right
    sys.stderr.write(f"{program}: error: {error}\n")
    return error.exit_code
