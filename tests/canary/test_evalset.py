"""The eval-set file: what is accepted, and errors that name the bad entry."""

from __future__ import annotations

import json

import pytest

from lmforge.canary.evalset import continuation_passes, load_eval_set
from lmforge.common.errors import InputError
from tests.canary.helpers import eval_set_data, write_eval_set


def test_yaml_and_json_give_the_same_set(tmp_path):
    data = eval_set_data()
    data["held_out"].append("A plain string is a text without an id.")
    from_yaml = load_eval_set(write_eval_set(tmp_path / "set.yaml", data))
    (tmp_path / "set.json").write_text(json.dumps(data))
    from_json = load_eval_set(tmp_path / "set.json")
    assert from_yaml == from_json
    assert from_yaml.held_out[-1].id == f"held_out[{len(data['held_out']) - 1}]"
    assert from_yaml.sha256 == from_json.sha256
    renamed = load_eval_set(write_eval_set(tmp_path / "renamed.yaml", {**data, "name": "other"}))
    assert renamed.sha256 == from_yaml.sha256  # the name is not what is evaluated
    changed = {**data, "checks": [{**data["checks"][0], "max_tokens": 8}, *data["checks"][1:]]}
    assert load_eval_set(write_eval_set(tmp_path / "changed.yaml", changed)).sha256 != from_yaml.sha256


def _break(mutate):
    data = eval_set_data()
    mutate(data)
    return data


@pytest.mark.parametrize("data, message", [
    (_break(lambda d: d["checks"][2].pop("prompt")), "checks[2] (id 's2'): prompt: Field required"),
    (_break(lambda d: d["checks"][0].update(expected="  ")), "checks[0] (id 's0'): expected: Value error, must not "
                                                              "be blank"),
    (_break(lambda d: d["checks"][3].update(max_tokens=0)), "checks[3] (id 's3'): max_tokens: Input should be "
                                                             "greater than or equal to 1"),
    (_break(lambda d: d["checks"][1].update(colour="red")), "checks[1] (id 's1'): colour: unknown field"),
    (_break(lambda d: d["held_out"][4].update(id="s1")), "held_out[4]: id 's1' is already used by held_out[1]"),
    (_break(lambda d: d.update(held_out=[])), "held_out: List should have at least 1 item"),
    (_break(lambda d: d.pop("checks")), "checks: Field required"),
    (_break(lambda d: d.update(extra=1)), "extra: unknown field"),
    (["not", "a", "mapping"], "must be a mapping"),
])
def test_invalid_entries_are_named(tmp_path, data, message):
    path = write_eval_set(tmp_path / "set.yaml", data) if isinstance(data, dict) else tmp_path / "set.yaml"
    if not isinstance(data, dict):
        path.write_text(json.dumps(data))
    with pytest.raises(InputError) as err:
        load_eval_set(path)
    assert message in str(err.value)
    assert str(path) in str(err.value)


def test_unreadable_and_malformed_files(tmp_path):
    with pytest.raises(InputError, match="cannot read eval set"):
        load_eval_set(tmp_path / "missing.yaml")
    (tmp_path / "broken.yaml").write_text("checks: [unclosed\n")
    with pytest.raises(InputError, match="not valid YAML"):
        load_eval_set(tmp_path / "broken.yaml")
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(InputError, match="not valid JSON"):
        load_eval_set(tmp_path / "broken.json")


@pytest.mark.parametrize("output, expected, passes", [
    (" fox jumps over the lazy dog.", " fox jumps over the lazy dog.", True),
    ("fox  jumps\nover the lazy dog. And more", "  fox jumps over the lazy dog.", True),
    (" fox jumps over", " fox jumps over the lazy dog.", False),
    (" fox leaps over the lazy dog.", " fox jumps", False),
])
def test_a_check_passes_when_the_output_starts_with_the_expected_text(output, expected, passes):
    assert continuation_passes(output, expected) is passes
