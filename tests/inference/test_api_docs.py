"""The API's description (/docs, /redoc, /openapi.json) is a setting: served without an API key
when on (lmforge-serve's default), not served at all when off (the chart's default)."""

from __future__ import annotations

import pytest
from helm_python import HelmRenderError
from starlette.testclient import TestClient

from lmforge.inference.api import create_app
from lmforge.inference.cli import CLI
from lmforge.inference.config import ServeConfig
from lmforge.inference.service import InferenceService
from tests.helm_chart import find, render

DESCRIPTION = ("/docs", "/redoc", "/openapi.json")


@pytest.mark.parametrize("api_docs", [True, False])
def test_the_description_is_served_only_when_the_setting_is_on(tiny_package, tmp_path, api_docs):
    keys = tmp_path / "api-keys"
    keys.write_text("key-one\n")
    service = InferenceService(ServeConfig(model=str(tiny_package), api_keys_file=str(keys), api_docs=api_docs))
    with TestClient(create_app(service)) as client:
        for path in DESCRIPTION:  # no API key: the description never needs one
            assert client.get(path).status_code == (200 if api_docs else 404), path
        if api_docs:
            assert "/v1/completions" in client.get("/openapi.json").json()["paths"]
        assert client.get("/v1/models").status_code == 401  # the API itself still does
    service.stop()


def served_config(values: dict) -> ServeConfig:
    """The ServeConfig the chart's inference container starts with, as lmforge-serve builds it."""
    (deployment,) = find(list(render(values)), "Deployment", "lmforge-inference")
    (server,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "inference"]
    return CLI.load_config(CLI.parse_args(server["args"]))


def test_the_chart_serves_no_description_unless_asked():
    assert served_config({}).api_docs is False
    assert served_config({"inference": {"apiDocs": True}}).api_docs is True
    with pytest.raises(HelmRenderError, match="inference.apiDocs"):
        render({"inference": {"config": {"api_docs": True}}})  # the chart owns the setting
