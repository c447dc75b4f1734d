import pytest
from helm_python import Chart

from tests.helm_chart import CHART


@pytest.fixture(scope="module")
def chart():
    """The chart loaded once per module through Helm's Go SDK."""
    return Chart.load(CHART)
