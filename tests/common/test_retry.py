"""The one retry policy (lmforge.common.retry): jitter, limits, the predicate, the log line, cancelling."""

from __future__ import annotations

import io
import json
import time

import pytest

from lmforge.common.config import load_config
from lmforge.common.errors import ConfigError
from lmforge.common.logging import configure_logging
from lmforge.common.retry import Cancelled, RetryPolicy, RetrySettings


class Flaky(Exception):
    pass


class Fatal(Exception):
    pass


class RecordingLog:
    def __init__(self):
        self.events: list[tuple[str, dict]] = []

    def warning(self, event: str, **fields):
        self.events.append((event, fields))


def failing(times: int, error: type[Exception] = Flaky, result="done"):
    """A function that raises `error` its first `times` calls, then returns `result`; .calls counts."""

    def fn():
        fn.calls += 1
        if fn.calls <= times:
            raise error(f"failure {fn.calls}")
        return result

    fn.calls = 0
    return fn


def test_retries_until_success_with_full_jitter_under_a_doubling_cap():
    log = RecordingLog()
    fn = failing(6)
    policy = RetryPolicy(attempts=7, backoff_seconds=0.002, backoff_max_seconds=0.01, log=log, event="thing_retry")
    assert policy.call("thing", fn, url="http://x") == "done"
    assert fn.calls == 7
    assert [name for name, _ in log.events] == ["thing_retry"] * 6
    waits = [fields["retry_in_seconds"] for _, fields in log.events]
    ceilings = [0.002, 0.004, 0.008, 0.01, 0.01, 0.01]
    assert all(0 <= wait <= ceiling for wait, ceiling in zip(waits, ceilings)), waits
    first = log.events[0][1]
    assert first["what"] == "thing" and first["attempt"] == 1 and first["attempts"] == 7
    assert first["error"] == "Flaky: failure 1" and first["url"] == "http://x"


def test_waits_are_jittered_not_fixed():
    log = RecordingLog()
    RetryPolicy(attempts=21, backoff_seconds=0.001, backoff_max_seconds=0.001, log=log).call("x", failing(20))
    waits = {fields["retry_in_seconds"] for _, fields in log.events}
    assert len(waits) > 1 and max(waits) <= 0.001


def test_an_error_not_retryable_propagates_at_once():
    log = RecordingLog()
    fn = failing(1, Fatal)
    with pytest.raises(Fatal, match="failure 1"):
        RetryPolicy(retryable=lambda exc: isinstance(exc, Flaky), log=log).call("x", fn)
    assert fn.calls == 1 and log.events == []


def test_the_last_error_propagates_after_the_attempts():
    fn = failing(10)
    with pytest.raises(Flaky, match="failure 3"):
        RetryPolicy(attempts=3, backoff_seconds=0, log=RecordingLog()).call("x", fn)
    assert fn.calls == 3


def test_a_predicate_given_to_the_call_replaces_the_policys():
    fn = failing(2, Fatal)
    policy = RetryPolicy(backoff_seconds=0, retryable=lambda exc: isinstance(exc, Flaky), log=RecordingLog())
    assert policy.call("x", fn, retryable=lambda exc: isinstance(exc, Fatal)) == "done"
    assert fn.calls == 3


def test_max_elapsed_ends_the_retries_before_the_attempts_do():
    fn = failing(100)
    started = time.monotonic()
    with pytest.raises(Flaky):
        RetryPolicy(attempts=100, backoff_seconds=0.05, backoff_max_seconds=0.05, max_elapsed_seconds=0.3,
                    log=RecordingLog()).call("x", fn)
    assert time.monotonic() - started < 2
    assert 2 <= fn.calls < 100


def test_wait_at_least_is_a_floor_capped_by_backoff_max_seconds():
    log = RecordingLog()
    floors = iter([0.03, 5.0])
    policy = RetryPolicy(attempts=3, backoff_seconds=0.001, backoff_max_seconds=0.05, log=log,
                         wait_at_least=lambda exc: next(floors))
    assert policy.call("x", failing(2)) == "done"
    assert [fields["retry_in_seconds"] for _, fields in log.events] == [0.03, 0.05]


def test_should_stop_cancels_before_the_next_try():
    stop = {"now": False}
    calls = []

    def fn():
        calls.append(1)
        stop["now"] = True
        raise Flaky("boom")

    policy = RetryPolicy(backoff_seconds=0, log=RecordingLog(), should_stop=lambda: stop["now"])
    with pytest.raises(Cancelled, match="upload"):
        policy.call("upload", fn)
    assert len(calls) == 1


def test_logs_through_the_project_logger_by_default():
    stream = io.StringIO()
    configure_logging("INFO", stream=stream)
    RetryPolicy(attempts=2, backoff_seconds=0).call("ping", failing(1))
    line = json.loads(stream.getvalue().splitlines()[-1])
    assert (line["level"], line["service"], line["event"], line["what"], line["attempt"]) == (
        "warning", "lmforge", "retrying", "ping", 1)


class Transfer(RetrySettings):
    renamed = {"max_attempts": "attempts"}


def test_retry_settings_are_one_set_of_names_that_make_the_policy():
    settings = load_config(Transfer, overrides=["attempts=3", "backoff_seconds=0.001", "backoff_max_seconds=0.002"])
    log = RecordingLog()
    policy = settings.policy(log=log, event="transfer_retry")
    with pytest.raises(Flaky):
        policy.call("x", fn := failing(10))
    assert fn.calls == 3 and [fields["attempts"] for _, fields in log.events] == [3, 3]
    assert all(fields["retry_in_seconds"] <= 0.002 for _, fields in log.events)


def test_a_renamed_retry_key_is_an_error_that_names_the_new_one():
    with pytest.raises(ConfigError, match="'max_attempts' is now 'attempts'"):
        load_config(Transfer, overrides=["max_attempts=3"])
    with pytest.raises(ConfigError, match="attempts: Input should be greater than or equal to 1"):
        load_config(Transfer, overrides=["attempts=0"])
