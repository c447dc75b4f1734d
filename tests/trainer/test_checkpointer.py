"""The Checkpointer in one process: async saves snapshot the state at the step they were
started, commit only once written, and retention keeps the last K plus the best."""

from __future__ import annotations

import json

import pytest
import torch

from lmforge.trainer.checkpoint import (
    BEST_FILE,
    COMMIT_MARKER,
    Checkpointer,
    best_checkpoint,
    committed_steps,
    load_latest,
    step_dir,
)

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # DCP warns when no process group exists


def model_and_optimizer(seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    model(torch.randn(4, 64)).sum().backward()
    optimizer.step()  # creates the optimizer state
    return model, optimizer


def test_async_save_holds_the_state_of_its_step_and_commits_when_written(tmp_path):
    model, optimizer = model_and_optimizer()
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    checkpointer = Checkpointer(tmp_path, keep=3, async_save=True)
    checkpointer.save(7, model, optimizer, {"note": "x"})
    with torch.no_grad():  # training goes on while the files are written
        for p in model.parameters():
            p.add_(1.0)
    assert checkpointer.wait() == 7
    assert (step_dir(tmp_path, 7) / COMMIT_MARKER).exists()
    assert json.loads((step_dir(tmp_path, 7) / "meta.json").read_text())["note"] == "x"

    fresh, fresh_optimizer = model_and_optimizer(seed=1)
    meta = load_latest(tmp_path, fresh, fresh_optimizer)
    assert meta["step"] == 7
    for name, value in fresh.state_dict().items():
        assert torch.equal(value, saved[name]), name
    assert fresh_optimizer.state_dict()["state"][0]["exp_avg"].shape == (64, 64)


def test_poll_commits_a_finished_save_without_blocking(tmp_path):
    model, optimizer = model_and_optimizer()
    checkpointer = Checkpointer(tmp_path, keep=3, async_save=True)
    checkpointer.save(1, model, optimizer, {})
    committed = None
    for _ in range(500):
        committed = checkpointer.poll()
        if committed is not None:
            break
        torch.randn(64, 64) @ torch.randn(64, 64)  # a "training step"
    if committed is None:
        committed = checkpointer.wait()
    assert committed == 1 and committed_steps(tmp_path) == [1]
    assert checkpointer.poll() is None  # nothing in flight any more


@pytest.mark.parametrize("async_save", [True, False])
def test_retention_keeps_the_last_k_plus_the_best(tmp_path, async_save):
    model, optimizer = model_and_optimizer()
    checkpointer = Checkpointer(tmp_path, keep=2, async_save=async_save)
    val = {1: 2.0, 2: 1.5, 3: 1.7, 4: 1.9, 5: 1.8}
    best = float("inf")
    for step, loss in val.items():
        checkpointer.save(step, model, optimizer, {}, val_loss=loss, is_best=loss < best)
        best = min(best, loss)
    checkpointer.close()
    assert committed_steps(tmp_path) == [2, 4, 5]
    assert best_checkpoint(tmp_path) == {"step": 2, "val_loss": 1.5}
    assert json.loads((step_dir(tmp_path, 2) / "meta.json").read_text())["best"] is True


def test_stale_uncommitted_saves_are_cleared_by_a_newer_commit(tmp_path):
    model, optimizer = model_and_optimizer()
    stale = step_dir(tmp_path, 3)
    stale.mkdir(parents=True)
    (stale / "__0_0.distcp").write_bytes(b"half written")
    checkpointer = Checkpointer(tmp_path, keep=2, async_save=True)
    checkpointer.save(5, model, optimizer, {})
    checkpointer.close()
    assert not stale.exists() and committed_steps(tmp_path) == [5]
    assert not (tmp_path / BEST_FILE).exists()


def test_nothing_committed_loads_nothing(tmp_path):
    model, optimizer = model_and_optimizer()
    step_dir(tmp_path, 9).mkdir(parents=True)  # a save that never committed
    assert load_latest(tmp_path, model, optimizer) is None


def test_with_a_sidecar_retention_deletes_only_checkpoints_the_store_holds(tmp_path):
    """The sidecar's UPLOADED marker names the store and its manifest, and retention checks the
    store (here a file:// one); an empty marker, as older uploaders wrote, says nothing."""
    from lmforge.common.checkpoint_layout import UPLOADED_MARKER, mark_uploaded, step_name

    local, store = tmp_path / "checkpoints", tmp_path / "store"
    model, optimizer = model_and_optimizer()
    checkpointer = Checkpointer(local, keep=1, async_save=False, purge_requires_upload=True)
    checkpointer.save(1, model, optimizer, {})
    checkpointer.save(2, model, optimizer, {})
    assert committed_steps(local) == [1, 2]  # step 1 is not uploaded yet: kept
    (step_dir(local, 1) / UPLOADED_MARKER).write_bytes(b"")
    checkpointer.save(3, model, optimizer, {})
    assert committed_steps(local) == [1, 2, 3]
    for step in (1, 2, 3):
        manifest = f"checkpoints/{step_name(step)}/MANIFEST.json"
        (store / manifest).parent.mkdir(parents=True)
        (store / manifest).write_text(json.dumps({"step": step}))
        mark_uploaded(step_dir(local, step), f"file://{store}", manifest)
    checkpointer.save(4, model, optimizer, {})
    checkpointer.close()
    assert committed_steps(local) == [4]
