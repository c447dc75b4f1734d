"""The `parallel:` mesh axes (dp_replicate, dp_shard, tp, pp, cp, ep; -1 = the rest of the world
size): resolved against the world size, `mode` and `replicate_degree` meaning what they meant
before, bad layouts refused naming the axis and the world size, and combinations the trainer does
not run (tp or cp under DDP) refused when it starts (exit 2, one line) rather than ignored."""

from __future__ import annotations

import pytest

from lmforge.common.errors import ConfigError
from lmforge.trainer.__main__ import main
from lmforge.trainer.config import ParallelSection, load_train_config
from lmforge.trainer.mesh_layout import MeshLayout, resolve_layout, trainer_layout, wrapper_mode

SOURCES = "data.sources=[{path: x}]"


def layout(world_size: int, **parallel) -> MeshLayout:
    return trainer_layout(ParallelSection(**parallel), world_size)


def refused_at_load(*overrides: str) -> str:
    with pytest.raises(ConfigError) as refused:
        load_train_config(None, [SOURCES, *overrides])
    return str(refused.value)


@pytest.mark.parametrize(
    ("parallel", "world_size", "expected"),
    [
        ({}, 1, MeshLayout()),  # the default: one process, no wrapper
        ({"mode": "none"}, 1, MeshLayout()),
        ({"mode": "ddp"}, 4, MeshLayout(dp_replicate=4, mode="ddp")),
        ({"mode": "fsdp"}, 4, MeshLayout(dp_shard=4, mode="fsdp")),
        ({"mode": "fsdp"}, 1, MeshLayout(mode="fsdp")),  # one-rank FSDP, as before
        ({"mode": "hsdp"}, 4, MeshLayout(dp_shard=4, mode="hsdp")),  # a 1 × 4 mesh
        ({"mode": "hsdp", "replicate_degree": 2}, 4, MeshLayout(dp_replicate=2, dp_shard=2, mode="hsdp")),
        ({"mode": "hsdp", "replicate_degree": 2}, 2, MeshLayout(dp_replicate=2, mode="hsdp")),
    ],
)
def test_mode_and_replicate_degree_mean_what_they_meant(parallel, world_size, expected):
    assert layout(world_size, **parallel) == expected


@pytest.mark.parametrize(
    ("parallel", "world_size", "expected"),
    [
        ({"dp_shard": -1}, 8, MeshLayout(dp_shard=8, mode="fsdp")),  # today's FSDP
        ({"dp_shard": -1}, 1, MeshLayout()),
        ({"dp_replicate": -1}, 8, MeshLayout(dp_replicate=8, mode="ddp")),
        ({"dp_replicate": 2, "dp_shard": -1}, 8, MeshLayout(dp_replicate=2, dp_shard=4, mode="hsdp")),
        ({"dp_replicate": 2, "dp_shard": 4}, 8, MeshLayout(dp_replicate=2, dp_shard=4, mode="hsdp")),
        ({"mode": "hsdp", "dp_replicate": 2}, 8, MeshLayout(dp_replicate=2, dp_shard=4, mode="hsdp")),
        ({"mode": "fsdp", "dp_shard": 8}, 8, MeshLayout(dp_shard=8, mode="fsdp")),  # as the planner renders
    ],
)
def test_the_axes_alone_choose_the_wrapper(parallel, world_size, expected):
    assert layout(world_size, **parallel) == expected
    assert wrapper_mode(expected.axes()) == expected.mode


def test_the_issue_18_axes_resolve_with_the_fill_and_ep_borrowing_from_dp_shard():
    section = ParallelSection(dp_shard=-1, tp=4, pp=4, cp=2, ep=8, pp_microbatches=64)
    resolved = resolve_layout(section, 1024)
    assert resolved.axes() == {"dp_replicate": 1, "dp_shard": 32, "tp": 4, "pp": 4, "cp": 2, "ep": 8}
    assert resolved.world_size == 1024 and resolved.mode == "fsdp"


@pytest.mark.parametrize(
    ("parallel", "world_size", "message"),
    [
        ({}, 4, "= 1, but the world size is 4"),
        ({"mode": "none"}, 4, "parallel.mode is 'none' but 4 processes were started"),
        ({"dp_replicate": 2, "dp_shard": 2}, 8, "dp_replicate=2 × dp_shard=2 = 4, but the world size is 8"),
        ({"dp_replicate": 4, "dp_shard": -1}, 6, "parallel.dp_shard=-1 cannot fill the world size 6: dp_replicate=4"),
        (
            {"mode": "hsdp", "replicate_degree": 3},
            4,
            "cannot fill the world size 4: dp_replicate=3 (dp_replicate is hsdp's replicate_degree)",
        ),
        ({"dp_shard": 3, "pp": -1, "pp_microbatches": 4}, 3, "pp fills to 1 at world size 3"),
    ],
)
def test_a_layout_that_does_not_fit_the_world_size_names_the_axis_and_the_world_size(parallel, world_size, message):
    with pytest.raises(ConfigError) as refused:
        resolve_layout(ParallelSection(**parallel), world_size)
    assert message in str(refused.value)


def test_what_the_rulebook_refuses_without_the_model_is_refused_with_the_layout():
    """ep borrows dp_shard's ranks, tp and pp refuse DDP, a pipeline's schedule needs its micro-batches."""
    cases = [
        ({"dp_shard": 4, "ep": 8}, 4, "parallel.ep=8 must divide dp_shard=4: the trainer's ep groups are dp_shard"),
        ({"dp_replicate": 2, "pp": 2}, 4, "parallel.pp=2 with DDP (dp_replicate=2)"),
        ({"dp_shard": 2, "pp": 2, "pp_microbatches": 1}, 4, "parallel.pp_microbatches: 1 micro-batches cannot fill"),
        ({"dp_shard": 2, "pp": 2, "compile": True}, 4, "parallel.pp=2 with parallel.compile"),
    ]
    for parallel, world_size, message in cases:
        resolve_layout(ParallelSection(**parallel), world_size)  # the degrees fit the world size
        with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
            trainer_layout(ParallelSection(**parallel), world_size)


def test_the_layout_carries_the_runs_micro_batching_and_checkpointing():
    pipeline = ParallelSection(dp_shard=-1, pp=2, pp_microbatches=8, activation_checkpointing=True)
    assert trainer_layout(pipeline, 8, micro_batch=2, grad_accum=3) == MeshLayout(
        dp_shard=4, pp=2, micro_batch=2, microbatches=8, activation_checkpointing=True, mode="fsdp")
    assert trainer_layout(ParallelSection(dp_shard=-1), 8, micro_batch=2, grad_accum=3).microbatches == 3


def test_bad_axes_are_refused_when_the_config_loads():
    assert "parallel.dp_shard: Value error, a degree is a number of ranks" in refused_at_load("parallel.dp_shard=0")
    assert "parallel.tp: Input should be greater than or equal to -1" in refused_at_load("parallel.tp=-2")
    assert "only one axis may be -1 (the rest of the world size), got dp_shard, cp" in refused_at_load(
        "parallel.dp_shard=-1", "parallel.cp=-1"
    )
    assert "got dp_shard, tp (mode fsdp fills dp_shard)" in refused_at_load("parallel.mode=fsdp", "parallel.tp=-1")
    assert "parallel.mode fsdp has no dp_replicate axis (got 2)" in refused_at_load(
        "parallel.mode=fsdp", "parallel.dp_replicate=2"
    )
    assert "parallel.mode ddp has no dp_shard axis" in refused_at_load("parallel.mode=ddp", "parallel.dp_shard=-1")
    assert "replicate_degree 2 and parallel.dp_replicate 4 disagree" in refused_at_load(
        "parallel.mode=hsdp", "parallel.replicate_degree=2", "parallel.dp_replicate=4"
    )
    assert "pp_microbatches is for a pipeline (pp > 1)" in refused_at_load("parallel.pp_microbatches=8")
    assert "parallel.ep" in refused_at_load("parallel.ep=-1")


def test_the_trainer_refuses_context_parallelism_under_ddp_at_start_with_exit_2(tmp_path, monkeypatch, capsys):
    """Before any process group or run directory: WORLD_SIZE=2 is read, nothing connects."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    overrides = [f"data.sources=[{{path: {tmp_path}}}]", f"run_dir={tmp_path / 'run'}", "parallel.cp=2",
                 "parallel.mode=ddp"]
    assert main(overrides) == 2
    err = capsys.readouterr().err
    assert "parallel.cp=2 with parallel.mode ddp (world size 2): context parallelism runs under FSDP" in err
    assert err.strip().count("\n") == 0
    assert not (tmp_path / "run").exists()
