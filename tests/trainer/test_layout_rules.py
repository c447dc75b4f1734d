"""The layout rulebook (lmforge.trainer.layout_rules): each rule refuses with one line naming the
axis, rules that need the model or the sequence length wait until they are known, each refusal
message is written once in the trainer's source, the planner reads the model as the trainer does,
and the rulebook and the section's resolver import neither torch nor the trainer's config."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from lmforge.common.errors import ConfigError
from lmforge.model.config import PRESETS, GPTConfig
from lmforge.trainer.layout_rules import (
    MeshLayout,
    ModelDims,
    layout_problems,
    refuse,
    wrapper_mode,
)
from lmforge.trainer.planner.search import model_dims
from lmforge.trainer.planner.shape import ModelShape
from tests.conftest import REPO_ROOT

TRAINER_SOURCE = REPO_ROOT / "services" / "trainer" / "src" / "lmforge" / "trainer"
DENSE = ModelDims.of(GPTConfig.preset("llama-1b"))  # tied embeddings, as Llama 3.2 1B
MOE = ModelDims.of(GPTConfig.preset("moe-8x1b"))


def first_problem(layout: MeshLayout, model: ModelDims | None = DENSE, seq_len: int | None = 4096,
                  world_size: int | None = None, **options) -> str | None:
    problems = layout_problems(layout, model, seq_len, world_size or layout.world_size, **options)
    assert all("\n" not in problem for problem in problems)
    return problems[0] if problems else None


def test_the_presets_read_as_the_tests_assume():
    assert (DENSE.heads, DENSE.kv_heads, DENSE.layers, DENSE.experts, DENSE.tied) == (32, 8, 16, 0, True)
    assert MOE.is_moe and MOE.experts == 8


@pytest.mark.parametrize(("layout", "model", "seq_len", "options", "message"), [
    (MeshLayout(dp_replicate=2, cp=2, mode="ddp"), DENSE, 4096, {},
     "parallel.cp=2 with parallel.mode ddp (world size 4): context parallelism runs under FSDP"),
    (MeshLayout(dp_replicate=2, tp=2), DENSE, 4096, {}, "parallel.tp=2 with DDP (dp_replicate=2, world size 4)"),
    (MeshLayout(dp_replicate=2, pp=2, microbatches=4), None, None, {}, "parallel.pp=2 with DDP (dp_replicate=2)"),
    (MeshLayout(tp=3), DENSE, 4096, {}, "parallel.tp=3 must divide model.n_head = 32 (each rank holds whole query"),
    (MeshLayout(tp=2), DENSE, 4095, {}, "parallel.tp=2 must divide data.seq_len = 4095 (sequence parallelism"),
    (MeshLayout(tp=2), MOE, 4096, {}, "parallel.tp=2: tensor parallelism of the MoE layers is not built; use ep"),
    (MeshLayout(cp=2), DENSE, 4094, {}, "parallel.cp=2: data.seq_len = 4094 is not divisible by 2·cp = 4"),
    (MeshLayout(cp=2, tp=4), DENSE, 20, {}, "parallel.cp=2 × tp=4: each cp rank's 10 tokens"),
    (MeshLayout(cp=2), MOE, 4096, {}, "parallel.cp=2: context parallelism does not support the MoE option"),
    (MeshLayout(dp_shard=2, ep=2), DENSE, 4096, {}, "parallel.ep=2: expert parallelism shards a mixture-of-experts"),
    (MeshLayout(dp_shard=6, ep=3), MOE, 4096, {}, "parallel.ep=3 does not divide the model's num_experts=8"),
    (MeshLayout(dp_shard=2, cp=2, ep=4), None, 4096, {}, "parallel.ep=4 must divide dp_shard=2"),
    (MeshLayout(pp=3, microbatches=3), DENSE, 4096, {}, "parallel.pp: n_layer 16 does not divide into pp 3 x 1"),
    (MeshLayout(pp=2, microbatches=2), ModelDims.of(GPTConfig.preset("llama-1b", tie_embeddings=True)), 4096, {},
     "parallel.pp: pp 2 needs untied embeddings"),
    (MeshLayout(pp=2, microbatches=1), None, None, {}, "parallel.pp_microbatches: 1 micro-batches cannot fill pp 2"),
    (MeshLayout(pp=2, microbatches=4), None, None, {"compiled": True}, "parallel.pp=2 with parallel.compile"),
    (MeshLayout(pp=2, microbatches=4), None, None, {"pp_schedule": "zb"}, "parallel.pp: unknown pipeline schedule"),
    (MeshLayout(tp=2), DENSE, 4096, {"float8": True}, "float8.enabled with parallel.tp=2: float8 tensor parallelism"),
    (MeshLayout(dp_shard=4), DENSE, 4096, {"world_size": 8},
     "parallel: the layout's 4 ranks (dp_replicate × dp_shard × tp × pp × cp) are not the world size 8"),
])
def test_each_rule_refuses_naming_the_axis(layout, model, seq_len, options, message):
    assert first_problem(layout, model, seq_len, **options).startswith(message)


def test_a_layout_the_trainer_runs_has_no_problems():
    for layout in (MeshLayout(), MeshLayout(dp_replicate=2, dp_shard=4, tp=8, pp=4, cp=2, microbatches=8),
                   MeshLayout(dp_shard=8, ep=8, micro_batch=2, microbatches=4, activation_checkpointing=True)):
        assert first_problem(layout, MOE if layout.ep > 1 else ModelDims.of(
            GPTConfig.preset("llama-1b", tie_embeddings=False))) is None, layout


def test_rules_wait_for_what_is_not_known_yet():
    """No model: heads, layers, experts unchecked; no vocabulary: the vocabulary; no sequence length: it."""
    assert first_problem(MeshLayout(tp=3), None, None) is None
    odd_vocabulary = GPTConfig.preset("llama-1b", vocab_size=1001)
    assert first_problem(MeshLayout(tp=2), ModelDims.of(odd_vocabulary, vocabulary=False)) is None
    assert "model.vocab_size = 1001" in first_problem(MeshLayout(tp=2), ModelDims.of(odd_vocabulary))


def test_refuse_raises_the_first_problem_as_one_config_error():
    refuse([])
    with pytest.raises(ConfigError, match="^first$"):
        refuse(["first", "second"])


def test_the_wrapper_follows_the_degrees_unless_named():
    assert MeshLayout().mode == "none" and MeshLayout(dp_replicate=2).mode == "ddp"
    assert MeshLayout(cp=2).mode == "fsdp" and MeshLayout(dp_replicate=2, dp_shard=2).mode == "hsdp"
    assert MeshLayout(dp_replicate=2, mode="hsdp").mode == "hsdp"
    assert wrapper_mode(MeshLayout(dp_shard=4).axes()) == "fsdp"


VARIANTS = [{}, {"tie_embeddings": False}, {"n_kv_head": 1},
            {"moe": {"num_experts": 4, "top_k": 1, "expert_hidden": 96}}]


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_the_planner_reads_the_model_as_the_trainer_does(preset):
    for overrides in VARIANTS:
        config = GPTConfig.preset(preset, **overrides)
        assert model_dims(ModelShape.from_config(config)) == ModelDims.of(config), overrides


# Fragments (each on one source line) of every refusal the rulebook writes: each must be written once in
# the trainer's source, the planner's included.
REFUSALS = [
    "parallelism runs under FSDP over dp_shard × cp",
    "torch's DDP takes no tensor-parallel (DTensor) parameters",
    "runs its chunk in place",
    "(each rank holds {what})",
    "(sequence parallelism splits it)",
    "tensor parallelism of the MoE layers is not built",
    "(load-balanced context parallelism cuts the sequence into 2·cp chunks)",
    "(sequence parallelism splits them)",
    "context parallelism does not support the MoE option",
    "expert parallelism shards a mixture-of-experts model's experts",
    "each ep rank holds num_experts/ep experts",
    "the trainer's ep groups",
    "unknown pipeline schedule",
    "virtual stages per rank must be at least 1",
    "needs at least 2 virtual stages per rank",
    "runs one stage per rank, not",
    "compiling pipeline chunks is not built",
    "does not divide into pp",
    "needs untied embeddings",
    "does not run the MoE option",
    "micro-batches cannot fill pp",
    "is not a multiple of pp",
    "float8 tensor parallelism is not wired",
    "(dp_replicate × dp_shard × tp × pp × cp) are not",
]


def test_each_refusal_is_written_once_in_the_trainer():
    sources = {path: path.read_text() for path in TRAINER_SOURCE.rglob("*.py")}
    for fragment in REFUSALS:
        where = [f"{path.relative_to(TRAINER_SOURCE)} ×{text.count(fragment)}"
                 for path, text in sources.items() if fragment in text]
        assert where == ["layout_rules.py ×1"], (fragment, where)


def _imports(module: Path) -> set[str]:
    """Every module a file imports, TYPE_CHECKING blocks and function bodies included."""
    names = set()
    for node in ast.walk(ast.parse(module.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def test_the_rulebook_and_the_resolver_import_neither_the_trainers_config_nor_torch():
    """The planner asks the rulebook without a GPU (or torch); the trainer's config imports the resolver."""
    for name in ("layout_rules.py", "mesh_layout.py"):
        imports = _imports(TRAINER_SOURCE / name)
        assert "lmforge.trainer.config" not in imports, name  # config imports mesh_layout: no circle
        assert not any(module == "torch" or module.startswith("torch.") for module in imports), name
    code = "import sys, lmforge.trainer.mesh_layout, lmforge.trainer.layout_rules; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
