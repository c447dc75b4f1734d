"""`lmforge-train presets`: every model preset's parameter count, checked against the published
count of the model it is shaped after (within 1%), or against the count from its shapes where
no model was published."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from lmforge.model.config import PRESETS
from lmforge.trainer.cli import main as train_cli

# GPT-2 124M/350M: the released checkpoints (Radford et al. 2019; theirs have learned positions,
# biases and a 50,257 vocabulary, ours RoPE, no biases, 50,304); 760m/1.3b: GPT-3 Large/XL (Brown
# et al. 2020, Table 2.1); llama-125m/350m: MobileLLM-125M/350M (Liu et al. 2024, 124.6M/345.3M);
# llama-1b/3b: Llama-3.2-1B/3B; llama-8b/70b: Meta-Llama-3-8B/70B (the safetensors totals of the
# Hugging Face checkpoints).
PUBLISHED = {
    "124m": 124_439_808, "350m": 354_823_168, "760m": 760e6, "1.3b": 1.3e9,
    "llama-125m": 124.6e6, "llama-350m": 345.3e6, "llama-1b": 1_235_814_400, "llama-3b": 3_212_749_824,
    "llama-8b": 8_030_261_248, "llama-70b": 70_553_706_496,
}
# No published model: (total, active) from the shapes, by hand.
LLAMA_DEBUG_ATTENTION = 2 * 256**2 + 2 * 256 * 64  # q and output 256×256, k and v 256×(2 heads × 32)
EXACT = {
    "tiny": (4 * (12 * 128**2 + 2 * 128) + 8192 * 128 + 128,) * 2,
    "llama-debug": (4 * (LLAMA_DEBUG_ATTENTION + 3 * 256 * 768 + 2 * 256) + 8192 * 256 + 256,) * 2,
    # llama-debug's MLP as 4 experts and a router; a token uses 2 of the 4
    "moe-debug": (4 * (LLAMA_DEBUG_ATTENTION + 4 * 3 * 256 * 768 + 4 * 256 + 2 * 256) + 8192 * 256 + 256,
                  4 * (LLAMA_DEBUG_ATTENTION + 2 * 3 * 256 * 768 + 4 * 256 + 2 * 256) + 8192 * 256 + 256),
    "moe-8x1b": (1_235_814_400 + 16 * (7 * 3 * 2048 * 8192 + 8 * 2048),
                 1_235_814_400 + 16 * (1 * 3 * 2048 * 8192 + 8 * 2048)),
}


@pytest.fixture(scope="module")
def printed() -> dict[str, dict]:
    """The command's JSON output by preset (it builds each preset on the meta device: 70B allocates nothing)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert train_cli(["presets", "--json"]) == 0
    return {row["preset"]: row for row in json.loads(out.getvalue())}


def test_every_preset_matches_its_published_or_exact_parameter_count(printed):
    assert list(printed) == list(PRESETS) and set(PRESETS) == set(PUBLISHED) | set(EXACT)
    for name, row in printed.items():
        if name in PUBLISHED:
            assert row["parameters"] == pytest.approx(PUBLISHED[name], rel=0.01), name
            assert row["active_parameters"] == row["parameters"]
        else:
            assert (row["parameters"], row["active_parameters"]) == EXACT[name], name
    for name in ("llama-1b", "llama-3b", "llama-8b", "llama-70b"):  # the Hugging Face checkpoints' tensors
        assert printed[name]["parameters"] == PUBLISHED[name], name


def test_the_table_lists_each_preset_with_its_count(capsys):
    assert train_cli(["presets"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:2] == ["preset", "layers"]
    rows = {line.split()[0]: line for line in lines[1:]}
    assert list(rows) == list(PRESETS)
    assert "70,553,706,496" in rows["llama-70b"] and "8×top-2" in rows["moe-8x1b"]
    assert rows["llama-8b"].split()[-1] == "131,072"  # bf16 KV cache: 2 × 32 layers × 8 KV heads × 128 × 2 bytes
