"""A checkpoint is data, never code: a tampered `.metadata` or `.distcp` is refused by
resume (load_latest) and by `lmforge-train export`, with one line naming the file, and
the code it carries never runs; a real checkpoint still loads."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import pickle
from pathlib import Path

import pytest
import torch

from lmforge.common.checkpoint_layout import BAD_MARKER, committed_steps, step_dir
from lmforge.common.logging import JsonLineFormatter, get_logger
from lmforge.model.package import load_package
from lmforge.model.transformer import GPT
from lmforge.trainer.checkpoint import Checkpointer, NoLoadableCheckpointError, load_latest
from lmforge.trainer.checkpoint_reader import METADATA_FILE, read_metadata
from lmforge.trainer.cli import main as cli
from lmforge.trainer.config import load_train_config
from lmforge.trainer.optim import build_optimizer
from tests.trainer.helpers import random_output

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # DCP warns when no process group exists


class Payload:
    """Unpickles to a call that creates `target` (what an attacker would replace by anything)."""

    def __init__(self, how: str, target: Path):
        self.how, self.target = how, target

    def __reduce__(self):
        if self.how == "os.system":
            return os.system, (f"touch {self.target}",)
        return open, (str(self.target), "w")  # builtins are refused too, not only os


def hostile_metadata(checkpoint: Path, how: str, target: Path, *, nested: bool) -> None:
    """Replace `.metadata` by the payload itself, or by the real metadata carrying it in a field."""
    if nested:
        metadata = read_metadata(checkpoint / METADATA_FILE)
        metadata.planner_data = Payload(how, target)
        data = pickle.dumps(metadata)
    else:
        data = pickle.dumps(Payload(how, target))
    (checkpoint / METADATA_FILE).write_bytes(data)


def hostile_bytes_item(checkpoint: Path, target: Path) -> None:
    """Point the optimizer's `lr` (a non-tensor item DCP torch.load()s) at a payload in a new
    shard file; the metadata itself stays plain DCP classes."""
    metadata = read_metadata(checkpoint / METADATA_FILE)
    [index] = [i for i in metadata.storage_data if i.fqn.endswith("param_groups.0.lr")]
    buffer = io.BytesIO()
    torch.save(Payload("os.system", target), buffer)
    (checkpoint / "__9_0.distcp").write_bytes(buffer.getvalue())
    info = metadata.storage_data[index]
    info.relative_path, info.offset, info.length = "__9_0.distcp", 0, len(buffer.getvalue())
    (checkpoint / METADATA_FILE).write_bytes(pickle.dumps(metadata))


@pytest.fixture(scope="module")
def trainer_checkpoints(tmp_path_factory):
    """Two committed checkpoints (steps 1 and 2) as the trainer writes them (config and
    tokenizer hash in meta.json, a GPT and its AdamW), written in this process."""
    tmp = tmp_path_factory.mktemp("safety")
    data = random_output(tmp / "data", train_tokens=5_000)
    config = load_train_config(None, [f"data.sources=[{{path: {data}}}]", f"run_dir={tmp / 'run'}",
                                      "model.overrides={n_layer: 1, n_head: 2, n_embd: 16, context_length: 16}"])
    model, optimizer = gpt_and_optimizer(config, data)
    meta = {"config": config.model_dump(mode="json"), "world_size": 1,
            "tokenizer_sha256": hashlib.sha256((data / "tokenizer.json").read_bytes()).hexdigest()}
    checkpointer = Checkpointer(tmp / "run" / "checkpoints", keep=3, async_save=False)
    weights = {}
    for step in (1, 2):
        model(torch.randint(0, 256, (2, 16)), torch.randint(0, 256, (2, 16)))[1].backward()
        optimizer.step()
        checkpointer.save(step, model, optimizer, meta)
        weights[step] = {k: v.clone() for k, v in model.state_dict().items()}
    checkpointer.close()
    return tmp / "run" / "checkpoints", config, data, weights


def gpt_and_optimizer(config, data: Path):
    vocab = json.loads((data / "manifest.json").read_text())["tokenizer"]["vocab_size"]
    torch.manual_seed(0)
    model = GPT(config.model.build(vocab_size=vocab))
    return model, build_optimizer(model, config.optim, fused=False)


@pytest.fixture
def log_lines():
    """The JSON log lines lmforge writes during the test, parsed."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonLineFormatter())
    get_logger("trainer")  # configures the `lmforge` logger first
    logging.getLogger("lmforge").addHandler(handler)
    yield lambda: [json.loads(line) for line in stream.getvalue().splitlines()]
    logging.getLogger("lmforge").removeHandler(handler)


@pytest.fixture
def checkpoints(trainer_checkpoints, tmp_path):
    """A private copy of the two checkpoints."""
    import shutil

    root, config, data, weights = trainer_checkpoints
    shutil.copytree(root, tmp_path / "checkpoints")
    return tmp_path / "checkpoints", config, data, weights


def test_a_real_checkpoint_loads_and_exports(checkpoints, tmp_path):
    root, config, data, weights = checkpoints
    model, optimizer = gpt_and_optimizer(config, data)
    assert load_latest(root, model, optimizer)["step"] == 2
    assert all(torch.equal(v, weights[2][k]) for k, v in model.state_dict().items())
    assert optimizer.param_groups[0]["lr"] == config.optim.lr  # a non-tensor item, read with weights_only
    assert cli(["export", "--checkpoint", str(step_dir(root, 2)), "--output", str(tmp_path / "pkg")]) == 0
    exported, meta = load_package(tmp_path / "pkg")
    assert meta["step"] == 2 and torch.equal(exported.wte.weight, weights[2]["wte.weight"])


@pytest.mark.parametrize("how,nested", [("os.system", False), ("os.system", True), ("open", True)])
def test_resume_refuses_hostile_metadata_and_falls_back(checkpoints, tmp_path, log_lines, how, nested):
    root, config, data, weights = checkpoints
    target = tmp_path / "pwned"
    hostile_metadata(step_dir(root, 2), how, target, nested=nested)
    model, optimizer = gpt_and_optimizer(config, data)
    assert load_latest(root, model, optimizer)["step"] == 1
    assert not target.exists()
    assert all(torch.equal(v, weights[1][k]) for k, v in model.state_dict().items())
    [line] = [x for x in log_lines() if x["event"] == "checkpoint_unloadable"]
    assert line["step"] == 2 and line["file"] == str(step_dir(root, 2) / METADATA_FILE)
    assert "refused to load" in line["error"] and ("system" in line["error"] or "open" in line["error"])
    assert committed_steps(root) == [1] and (step_dir(root, 2) / BAD_MARKER).is_file()


def test_resume_refuses_a_hostile_non_tensor_item(checkpoints, tmp_path, log_lines):
    root, config, data, _ = checkpoints
    target = tmp_path / "pwned"
    hostile_bytes_item(step_dir(root, 2), target)
    hostile_bytes_item(step_dir(root, 1), target)
    model, optimizer = gpt_and_optimizer(config, data)
    with pytest.raises(NoLoadableCheckpointError, match="no checkpoint loads") as failure:
        load_latest(root, model, optimizer)
    assert not target.exists()
    assert failure.value.exit_code == 7 and "\n" not in str(failure.value)
    assert "__9_0.distcp: refused to load" in str(failure.value)
    lines = [x for x in log_lines() if x["event"] == "checkpoint_unloadable"]
    assert [x["step"] for x in lines] == [2, 1]
    assert all(x["file"].endswith("__9_0.distcp") for x in lines)


@pytest.mark.parametrize("how,nested", [("os.system", False), ("open", True)])
def test_export_refuses_hostile_metadata(checkpoints, tmp_path, capfd, how, nested):
    root, *_ = checkpoints
    target = tmp_path / "pwned"
    hostile_metadata(step_dir(root, 2), how, target, nested=nested)
    assert cli(["export", "--checkpoint", str(step_dir(root, 2)), "--output", str(tmp_path / "pkg")]) == 3
    assert not target.exists() and not (tmp_path / "pkg").exists()
    [line] = capfd.readouterr().err.strip().splitlines()
    assert line.startswith(f"lmforge-train export: error: {step_dir(root, 2) / METADATA_FILE}: refused to load")


def test_export_refuses_a_truncated_shard_in_one_line(checkpoints, tmp_path, capfd):
    root, *_ = checkpoints
    shard = step_dir(root, 2) / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:1000])
    assert cli(["export", "--checkpoint", str(step_dir(root, 2)), "--output", str(tmp_path / "pkg")]) == 3
    [line] = capfd.readouterr().err.strip().splitlines()
    assert line.startswith(f"lmforge-train export: error: {shard}: truncated")


def test_a_changed_model_config_is_a_config_error_not_a_bad_checkpoint(checkpoints):
    root, config, data, _ = checkpoints
    other = config.model_copy(update={"model": config.model.model_copy(
        update={"overrides": {**config.model.overrides, "n_embd": 32}})})
    model, optimizer = gpt_and_optimizer(other, data)
    with pytest.raises(Exception, match="saved for another model config") as failure:
        load_latest(root, model, optimizer)
    assert failure.value.exit_code == 2
    assert committed_steps(root) == [1, 2]  # nothing marked bad: the config is at fault


class _Lookup:
    def __reduce__(self):
        from torch.distributed.checkpoint.metadata import Metadata

        return getattr, (Metadata, "__init__")  # a step towards __globals__ and anything


def test_enum_members_pickled_by_name_load_and_other_lookups_are_refused(checkpoints, tmp_path, monkeypatch):
    """Debian's Python 3.11.2 (the trainer image) and Python ≥ 3.12 pickle an enum member as
    getattr(Enum, "NAME"): such a `.metadata` loads; any other getattr is refused."""
    from torch.distributed.checkpoint.metadata import _MEM_FORMAT_ENCODING

    root, *_ = checkpoints
    metadata = read_metadata(step_dir(root, 2) / METADATA_FILE)
    with monkeypatch.context() as patch:
        patch.setattr(_MEM_FORMAT_ENCODING, "__reduce_ex__", lambda self, _protocol: (getattr, (type(self), self.name)))
        by_name = tmp_path / "by-name.metadata"
        by_name.write_bytes(pickle.dumps(metadata))
    assert b"getattr" in by_name.read_bytes()
    assert read_metadata(by_name) == metadata

    metadata.planner_data = _Lookup()
    hostile = tmp_path / "lookup.metadata"
    hostile.write_bytes(pickle.dumps(metadata))
    with pytest.raises(Exception, match=r"refused to load: it looks up getattr\(Metadata, '__init__'\)"):
        read_metadata(hostile)
