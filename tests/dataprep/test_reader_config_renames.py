"""The reader's retry setting is named like every other (`open_attempts`): the old key is an
error that names the new one."""

from __future__ import annotations

import pytest

from lmforge.common.errors import ConfigError
from lmforge.dataprep.config import load_dataprep_config


def test_open_retries_is_now_open_attempts():
    with pytest.raises(ConfigError, match="reader: Value error, 'open_retries' is now 'open_attempts'"):
        load_dataprep_config(overrides=["reader.open_retries=2"])
    assert load_dataprep_config(overrides=["reader.open_attempts=2"]).reader.open_attempts == 2
