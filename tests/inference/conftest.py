from __future__ import annotations

import pytest

from tests.serving import running_server, train_tiny_package


@pytest.fixture(scope="session")
def tiny_package(tmp_path_factory):
    """The memorizing tiny model's serving package (trained once per session)."""
    return train_tiny_package(tmp_path_factory.mktemp("models") / "tiny-v1")


@pytest.fixture(scope="module")
def server(tiny_package, tmp_path_factory):
    """A default lmforge-serve (4 slots), its log file beside it."""
    log = tmp_path_factory.mktemp("server") / "serve.log"
    with running_server(tiny_package, "engine.max_running=4", log_path=log) as url:
        yield url, log
