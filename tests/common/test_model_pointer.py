"""The model pointer (what the inference server follows) and the package checksums it relies on:
pointer vs package, set / roll back with the previous value, a hand-written pointer, S3 and local
files; a package whose files do not match its checksums is refused."""

from __future__ import annotations

import json
import shutil

import pytest

from lmforge.common.errors import InputError
from lmforge.model.config import GPTConfig
from lmforge.model.package import load_package, verify_package, write_package
from lmforge.model.pointer import (
    HISTORY,
    ModelPointer,
    point_to,
    read_pointer,
    resolve_model,
    rollback,
    write_pointer,
)
from lmforge.model.transformer import GPT


@pytest.fixture
def package(tmp_path):
    tokenizer = tmp_path / "tokenizer.json"
    tokenizer.write_text("{}")
    model = GPT(GPTConfig(vocab_size=64, n_layer=1, n_head=2, n_embd=16, context_length=8))
    return write_package(model, tokenizer, tmp_path / "models" / "v1", step=3)


def test_packages_record_and_check_their_files(package, tmp_path):
    meta = verify_package(package, require_checksums=True)
    assert set(meta["files"]) == {"model.safetensors", "tokenizer.json"}
    assert meta["files"]["model.safetensors"]["bytes"] == (package / "model.safetensors").stat().st_size

    corrupt = tmp_path / "corrupt"
    shutil.copytree(package, corrupt)
    data = bytearray((corrupt / "model.safetensors").read_bytes())
    data[-1] ^= 0xFF  # one flipped byte in the last weight: same size, another sha256
    (corrupt / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(InputError, match=r"model.safetensors: sha256 does not match config.json"):
        load_package(corrupt)

    old = tmp_path / "old"  # exported before checksums: loads, but a pointer's package needs them
    shutil.copytree(package, old)
    meta = json.loads((old / "config.json").read_text())
    del meta["files"]
    (old / "config.json").write_text(json.dumps(meta))
    assert load_package(old)[1]["step"] == 3
    with pytest.raises(InputError, match="no file checksums"):
        verify_package(old, require_checksums=True)
    (old / "config.json").write_text("{not json")
    with pytest.raises(InputError, match="config.json: not valid JSON"):
        verify_package(old)


def pointer_semantics(uri: str, a: str, b: str, c: str) -> None:
    assert read_pointer(uri) is None
    with pytest.raises(InputError, match="no model pointer to roll back"):
        rollback(uri, set_by="ops")
    first = point_to(uri, a, set_by="rollout r1")
    assert read_pointer(uri) == first and first.previous == ()
    with pytest.raises(InputError, match="names no previous model"):
        rollback(uri, set_by="ops")
    second = point_to(uri, b, set_by="rollout r2")
    assert second.previous == (first.without_previous(),)
    assert resolve_model(uri) == (second, b)
    assert point_to(uri, b, set_by="rollout r2, retried").previous == second.previous  # no duplicate entry
    third = point_to(uri, c, set_by="rollout r3")
    assert [p.model for p in third.previous] == [b, a]
    back = rollback(uri, set_by="ops")
    assert (back.model, back.set_by, [p.model for p in back.previous]) == (b, f"ops (rollback from {c})", [a])
    assert read_pointer(uri) == back
    assert rollback(uri, set_by="ops").model == a  # further back, never forward to what was rolled back from
    for n in range(HISTORY + 3):
        point_to(uri, f"{a}-{n}", set_by="many")
    assert len(read_pointer(uri).previous) == HISTORY


def test_pointer_in_a_local_file(tmp_path, package):
    pointer = str(tmp_path / "models" / "current")
    pointer_semantics(pointer, str(package), str(tmp_path / "models" / "v2"), str(tmp_path / "models" / "v3"))
    assert resolve_model(str(package)) == (None, str(package))  # a directory is a package
    (tmp_path / "models" / "current").write_text('{"model": " /srv/models/v7 "}')  # written by hand
    assert resolve_model(pointer) == (ModelPointer("/srv/models/v7"), "/srv/models/v7")
    for text, problem in [("[]", "a JSON object"), ('{"model": ""}', "a JSON object"), ("x", "not JSON"),
                          ('{"model": "m", "previous": {}}', "must be a list")]:
        (tmp_path / "models" / "current").write_text(text)
        with pytest.raises(InputError, match=problem):
            read_pointer(pointer)


def test_pointer_in_s3(s3):
    _, make_bucket = s3
    client = make_bucket("pointers")
    client.put_object(Bucket="pointers", Key="models/v1/config.json", Body=b"{}")
    assert resolve_model("s3://pointers/models/v1") == (None, "s3://pointers/models/v1")  # a prefix: a package
    pointer_semantics("s3://pointers/models/current", "s3://pointers/models/v1", "s3://pointers/models/v2",
                      "s3://pointers/models/v3")
    body = json.loads(client.get_object(Bucket="pointers", Key="models/current")["Body"].read())
    assert body["kind"] == "lmforge-model-pointer" and body["previous"][0]["model"] == "s3://pointers/models/v1-11"
    write_pointer("s3://pointers/models/current", ModelPointer("s3://pointers/models/v1"))
    assert read_pointer("s3://pointers/models/current").model == "s3://pointers/models/v1"
