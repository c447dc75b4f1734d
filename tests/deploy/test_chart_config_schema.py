"""The services' `config:` sections of the chart's values, checked by Helm against the schema
generated from each service's model: a bad key or value fails the install naming it, whatever
the service accepts passes, and a number Helm's --set leaves a string still reaches the service."""

from __future__ import annotations

import pytest
from helm_python import Chart, HelmValuesError

from lmforge.canary.config import CanaryConfig
from lmforge.dataprep.config import DataprepConfig, load_dataprep_config
from lmforge.inference.config import ServeConfig, load_serve_config
from lmforge.trainer.config import TrainConfig
from lmforge.uploader.config import UploaderConfig
from tests.deploy.chart_values import NAMESPACE, container, set_values
from tests.helm_chart import CHART, find, render

BAD_CONFIGS = [
    ({"dataprep": {"config": {"langid": {"treshold": 0.5}}}}, "'treshold' not allowed"),
    ({"dataprep": {"config": {"langid": {"threshold": 1.5}}}}, "/dataprep/config/langid/threshold"),
    ({"training": {"config": {"optim": {"schedule": "linear"}}}}, "/training/config/optim/schedule"),
    ({"training": {"config": {"data": {"sources": []}}}}, "/training/config/data/sources"),
    ({"training": {"uploader": {"config": {"transfer": {"concurrency": 0}}}}},
     "/training/uploader/config/transfer/concurrency"),
    ({"inference": {"config": {"engine": {"max_running": "eight"}}}}, "/inference/config/engine/max_running"),
    ({"canary": {"config": {"tolerance": {"max_score_drop": "a lot"}}}}, "/canary/config/tolerance/max_score_drop"),
]


@pytest.fixture(scope="module")
def chart():
    return Chart.load(CHART)


@pytest.mark.parametrize("values, field", BAD_CONFIGS, ids=[f for _, f in BAD_CONFIGS])
def test_the_schema_rejects_bad_service_config_naming_the_field(chart, values, field):
    with pytest.raises(HelmValuesError) as caught:
        chart.validate_schema(values)
    assert field in str(caught.value)


def test_the_schema_accepts_every_field_each_service_accepts(chart):
    """Each service's whole config, as the service writes it (every field, nulls included)."""
    train = TrainConfig(data={"sources": [{"path": "s3://lmforge/datasets/x"}]})
    chart.validate_schema({
        "dataprep": {"config": DataprepConfig().model_dump(mode="json")},
        "training": {"config": train.model_dump(mode="json"),
                     "uploader": {"config": UploaderConfig().model_dump(mode="json")}},
        "inference": {"config": ServeConfig().model_dump(mode="json")},
        "canary": {"config": CanaryConfig().model_dump(mode="json")},
    })


def test_numbers_helm_set_leaves_as_strings_reach_the_services_as_numbers():
    """`helm install --set dataprep.config.langid.threshold=0.5` gives the chart the string "0.5"."""
    objects = render({"dataprep": {"enabled": True, "config": {"langid": {"threshold": "0.5"}}},
                      "inference": {"config": {"engine": {"step_delay_seconds": "1e-3"}}}}, namespace=NAMESPACE)
    workers = next(j for j in find(objects, "Job") if j["metadata"]["name"].endswith("-workers"))
    args = container(workers["spec"]["template"]["spec"], "dataprep")["args"]
    assert load_dataprep_config(None, set_values(args)).langid.threshold == 0.5
    (deployment,) = find(objects, "Deployment")
    args = container(deployment["spec"]["template"]["spec"], "inference")["args"]
    assert load_serve_config(None, set_values(args)).engine.step_delay_seconds == pytest.approx(1e-3)
