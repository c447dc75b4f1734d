"""The chart names each uploader sidecar after its pod (the lease identity uploaders sharing
a destination go by), and refuses to let values set it."""

from __future__ import annotations

import pytest
from helm_python import HelmRenderError

from lmforge.uploader.config import load_uploader_config
from tests.helm_chart import find, render


def test_each_sidecar_takes_its_pod_name_as_its_identity(monkeypatch):
    (job,) = find(render({"training": {"enabled": True}}), "PyTorchJob")
    pod = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    (uploader,) = [c for c in pod["initContainers"] if c["name"] == "uploader"]
    (env,) = [e for e in uploader["env"] if e["name"] == "LMFORGE_UPLOADER__IDENTITY"]
    assert env["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    monkeypatch.setenv(env["name"], "lmforge-trainer-master-0")  # what the kubelet sets it to
    assert load_uploader_config(None).identity == "lmforge-trainer-master-0"


def test_values_cannot_set_the_identity():
    with pytest.raises(HelmRenderError, match="training.uploader.config.identity"):
        render({"training": {"enabled": True, "uploader": {"config": {"identity": "same-for-all"}}}})
