"""The services' `config:` sections of the chart's values, checked by Helm against the schema
generated from each service's model (bad ones are in test_chart_render's BAD_VALUES): whatever
the service accepts passes, and a number Helm's --set leaves a string still reaches the service."""

from __future__ import annotations

import pytest

from lmforge.canary.config import CanaryConfig
from lmforge.dataprep.config import DataprepConfig, load_dataprep_config
from lmforge.inference.config import ServeConfig, load_serve_config
from lmforge.trainer.config import TrainConfig
from lmforge.uploader.config import UploaderConfig
from tests.deploy.chart_values import NAMESPACE, container, set_values
from tests.helm_chart import find, render


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
    """`helm install --set dataprep.config.steps.langid.threshold=0.5` gives the chart the string "0.5"."""
    objects = render({"dataprep": {"enabled": True, "config": {"steps": {"langid": {"threshold": "0.5"}}}},
                      "inference": {"config": {"engine": {"step_delay_seconds": "1e-3"}}}}, namespace=NAMESPACE)
    workers = next(j for j in find(objects, "Job") if j["metadata"]["name"].endswith("-workers"))
    args = container(workers["spec"]["template"]["spec"], "dataprep")["args"]
    assert load_dataprep_config(None, set_values(args)).steps.langid.threshold == 0.5
    (deployment,) = find(objects, "Deployment")
    args = container(deployment["spec"]["template"]["spec"], "inference")["args"]
    assert load_serve_config(None, set_values(args)).engine.step_delay_seconds == pytest.approx(1e-3)
