"""Canary fixtures: a tiny model that has memorized tests.serving.SENTENCES and a worse copy of
it (perturbed weights), each behind a real lmforge-serve; a real Pushgateway; the eval set.
Packages are built once per session; servers live as long as the module that uses them."""

from __future__ import annotations

import pytest

from tests.canary.helpers import run_canary, write_eval_set
from tests.prometheus_tools import running_pushgateway
from tests.serving import perturbed_package, running_server, train_tiny_package

WORSE_SCALE = 0.5  # noise × each tensor's std: perplexity ≈ 1.04 → ≈ 1.9, most checks fail


@pytest.fixture(scope="session")
def canary_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("canary")


@pytest.fixture(scope="session")
def good_package(canary_dir):
    return train_tiny_package(canary_dir / "models" / "canary-good")


@pytest.fixture(scope="session")
def worse_package(canary_dir, good_package):
    return perturbed_package(good_package, canary_dir / "models" / "canary-worse", WORSE_SCALE)


@pytest.fixture(scope="module")
def good_server(canary_dir, good_package):
    with running_server(good_package, log_path=canary_dir / "good-server.log") as url:
        yield url


@pytest.fixture(scope="module")
def worse_server(canary_dir, worse_package):
    with running_server(worse_package, log_path=canary_dir / "worse-server.log") as url:
        yield url


@pytest.fixture(scope="module")
def pushgateway(canary_dir):
    try:
        with running_pushgateway(log_path=canary_dir / "pushgateway.log") as url:
            yield url
    except FileNotFoundError as exc:
        pytest.fail(str(exc))


@pytest.fixture(scope="session")
def eval_set(canary_dir):
    return write_eval_set(canary_dir / "eval-set.yaml")


@pytest.fixture(scope="module")
def baseline(canary_dir, good_server, eval_set):
    """A baseline recorded with `make-baseline` from the good deployment."""
    path = canary_dir / "baselines" / "baseline.json"
    result = run_canary("make-baseline", "--endpoint", good_server, "--eval-set", str(eval_set),
                        "--output", str(path))
    assert result.code == 0, str(result)
    return path, result
