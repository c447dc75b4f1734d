"""Document masking (lmforge.model.document_mask): a token attends only to earlier tokens of its own
document. With RoPE a packed sequence gives each document's logits as if it ran alone; the flex
attention path (CUDA's) computes what the SDPA path does (torch 2.13 runs flex on CPU forward only);
context parallelism (cp = 2) and a 2-stage pipeline (1F1B, as PipelineModel runs it) with documents
match one process with documents, under torchrun (gloo, CPU, fp32) in one launch of 2 ranks: this
file run as a module is the worker. The GPU benchmark's smoke mode runs on CPU and writes its JSON.
(pp 2 × cp 2 with documents needs 4 ranks; it is not run here.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from lmforge.model.config import GPTConfig
from lmforge.model.document_mask import document_attention, document_ids, query_documents
from lmforge.model.transformer import GPT
from tests.trainer.test_context_parallel import CONFIGS as CP_CONFIGS
from tests.trainer.test_context_parallel import batches as cp_batches
from tests.trainer.test_context_parallel import build_model as build_cp_model
from tests.trainer.test_pipeline_parallel import counting_batches, optimizer, seeded_model

REPO = Path(__file__).resolve().parents[2]
TOLERANCE = 1e-5
PP_STEPS = 3


def test_document_ids_count_the_end_of_text_tokens_before_each_position():
    eot = 9
    tokens = torch.tensor([[4, 9, 5, 6, 9, 9, 7],
                           [9, 1, 2, 3, 4, 5, 9]])
    assert document_ids(tokens, eot).tolist() == [[0, 0, 1, 1, 1, 2, 3],
                                                  [0, 1, 1, 1, 1, 1, 1]]
    assert document_ids(tokens, eot).dtype == torch.int32


def packed_documents(eot: int, lengths=(11, 20, 17)) -> list[torch.Tensor]:
    """Documents of random tokens, each ending with the end-of-text token."""
    generator = torch.Generator().manual_seed(3)
    documents = [torch.randint(eot, (length,), generator=generator) for length in lengths]
    for document in documents:
        document[-1] = eot
    return documents


def test_a_packed_sequence_gives_each_document_its_own_logits():
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("llama-debug", n_layer=2, n_head=4, n_kv_head=2, n_embd=64, context_length=48,
                                 vocab_size=128)).eval()
    eot = 127
    documents = packed_documents(eot)
    packed = torch.cat(documents)[None]
    ids = document_ids(packed, eot)
    with torch.no_grad():
        alone = torch.cat([model(document[None])[0] for document in documents], dim=1)
        masked = model(packed, documents=ids)[0]
        unmasked = model(packed)[0]
        with_positions = model(packed, positions=torch.arange(packed.shape[1])[None], documents=ids)[0]
    assert (masked - alone).abs().max().item() <= TOLERANCE
    assert (unmasked - alone).abs().max().item() > 1e-2  # later documents see earlier ones without the mask
    torch.testing.assert_close(with_positions, masked, rtol=0, atol=1e-6)


def test_flex_attention_computes_what_sdpa_does():
    """The document-causal BlockMask and compiled flex attention (CUDA's path) against SDPA's dense
    mask, on CPU (forward only: flex has no CPU backward): grouped-query heads, and queries at a
    context-parallel shard's positions (chunks 0 and 3 of 4) attending to the whole sequence."""
    generator = torch.Generator().manual_seed(4)
    batch, heads, kv_heads, time, dim = 2, 4, 2, 64, 16
    q = torch.randn(batch, heads, time, dim, generator=generator)
    k, v = (torch.randn(batch, kv_heads, time, dim, generator=generator) for _ in range(2))
    documents = document_ids(torch.randint(6, (batch, time), generator=generator), eot_id=0)
    positions = torch.cat([torch.arange(16), torch.arange(48, 64)]).expand(batch, -1)
    q_documents = query_documents(documents, positions)
    shard_q = q[:, :, positions[0]]
    sdpa = document_attention(shard_q, k, v, positions, q_documents, documents, backend="sdpa")
    flex = document_attention(shard_q, k, v, positions, q_documents, documents, backend="flex")
    torch.testing.assert_close(flex, sdpa, rtol=0, atol=1e-5)
    whole = document_attention(q, k, v, None, documents, documents, backend="sdpa")
    torch.testing.assert_close(sdpa, whole[:, :, positions[0]], rtol=0, atol=1e-6)
    causal = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert (whole - causal).abs().max().item() > 1e-2
    with pytest.raises(ValueError, match="no dropout"):
        document_attention(q, k, v, None, documents, documents, dropout_p=0.1, backend="flex")


def test_query_documents_follow_an_in_place_change():
    documents = torch.tensor([[0, 0, 1, 1]])
    positions = torch.tensor([[2, 3]])
    assert query_documents(documents, positions).tolist() == [[1, 1]]
    documents[0, 3] = 2
    assert query_documents(documents, positions).tolist() == [[1, 2]]
    assert query_documents(documents, None) is documents


# -- cp = 2 and pp = 2 against one process, all with documents -------------------------------------

CP_EOT = 5  # (of the cp tests' vocabulary of 128)
PP_EOT = 7  # (of the pipeline tests' 256)


def with_boundaries(tokens: torch.Tensor, eot: int, seed: int) -> torch.Tensor:
    """The tokens with about one in six made end-of-text, at random places (the same in every process)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.where(torch.rand(tokens.shape, generator=generator) < 1 / 6, eot, tokens)


def cp_data() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The cp tests' first batch, with end-of-text tokens: (ids, targets, the ids' documents)."""
    idx, targets = cp_batches(128, 1)[0]
    tokens = with_boundaries(torch.cat([idx, targets[:, -1:]], dim=1), CP_EOT, seed=5)
    idx, targets = tokens[:, :-1], tokens[:, 1:]
    return idx, targets, document_ids(idx, CP_EOT)


def pp_data() -> tuple[torch.Tensor, torch.Tensor]:
    return (with_boundaries(counting_batches(PP_STEPS, seed=1), PP_EOT, seed=6),
            with_boundaries(counting_batches(1, seed=2)[0], PP_EOT, seed=7))


def cp_one_process(name: str, masked: bool = True) -> dict:
    model = build_cp_model(name)
    idx, targets, documents = cp_data()
    logits, loss = model(idx, targets, documents=documents if masked else None)
    loss.backward()
    return {"logits": logits.detach(), "loss": loss.item(),
            "grads": {n: p.grad.clone() for n, p in model.named_parameters()}}


def cp_worker(name: str, group) -> dict:
    from lmforge.trainer.context_parallel import (
        all_reduce_gradients,
        apply_context_parallel,
        context_parallel_forward,
        gather_sequence,
    )

    model = apply_context_parallel(build_cp_model(name), group)
    idx, targets, documents = cp_data()
    logits, share, mean = context_parallel_forward(model, idx, targets, group, documents=documents)
    share.backward()
    all_reduce_gradients(model, group)
    return {"logits": gather_sequence(logits.detach(), group), "loss": mean.item(),
            "grads": {n: p.grad.clone() for n, p in model.named_parameters()}}


def pp_one_process(masked: bool = True) -> dict:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the workers (OMP_NUM_THREADS=1): the same reduction order
    try:
        model = seeded_model()
        opt = optimizer(model.parameters())
        steps, val = pp_data()
        losses = []
        for batch in steps:
            opt.zero_grad()
            documents = document_ids(batch[:, :-1], PP_EOT) if masked else None
            _, loss = model(batch[:, :-1], batch[:, 1:], documents=documents)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        model.eval()
        with torch.no_grad():
            documents = document_ids(val[:, :-1], PP_EOT) if masked else None
            val_loss = model(val[:, :-1], val[:, 1:], documents=documents)[1].item()
        return {"losses": losses, "val": val_loss}
    finally:
        torch.set_num_threads(threads)


def pp_worker(group) -> dict:
    """PipelineModel (the trainer's pipeline) over 2 stages, 1F1B with 2 micro-batches."""
    from lmforge.trainer.pipeline_parallel import build_pipeline
    from lmforge.trainer.pipeline_parallel_training import PipelineModel

    model = PipelineModel(build_pipeline(seeded_model(), group, "1f1b", 2))
    opt = optimizer(list(model.parameters()))
    steps, val = pp_data()
    losses = []
    for batch in steps:
        opt.zero_grad()
        losses.append(model.train_step(batch, documents=document_ids(batch[:, :-1], PP_EOT)).item())
        opt.step()
    for chunk in model.pipeline.chunks:
        chunk.eval()
    return {"losses": losses, "val": model.eval_loss(val, documents=document_ids(val[:, :-1], PP_EOT)).item()}


def worker(out: Path) -> None:
    dist.init_process_group("gloo")
    torch.use_deterministic_algorithms(True)
    results = {f"cp-{name}": cp_worker(name, dist.group.WORLD) for name in CP_CONFIGS}
    results["pp"] = pp_worker(dist.group.WORLD)
    torch.save(results, out / f"rank{dist.get_rank()}.pt")
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def parallel_results(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("document-masking")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               "-m", "tests.trainer.test_document_masking", str(out)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    return [torch.load(out / f"rank{rank}.pt") for rank in range(2)]


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


@pytest.mark.parametrize("name", list(CP_CONFIGS))
def test_cp2_with_documents_matches_one_process(parallel_results, name):
    single = cp_one_process(name)
    assert max_diff(cp_one_process(name, masked=False)["logits"], single["logits"]) > 1e-2  # the mask matters
    for rank, ranks in enumerate(parallel_results):
        cp = ranks[f"cp-{name}"]
        assert max_diff(cp["logits"], single["logits"]) <= TOLERANCE, rank
        assert abs(cp["loss"] - single["loss"]) <= TOLERANCE, rank
        worst = max(max_diff(cp["grads"][n], g) for n, g in single["grads"].items())
        assert worst <= TOLERANCE, (rank, worst)


def test_pp2_with_documents_matches_one_process(parallel_results):
    single, unmasked = pp_one_process(), pp_one_process(masked=False)
    assert abs(single["losses"][0] - unmasked["losses"][0]) > 1e-3  # the mask matters, on the last stage's layers too
    for rank, ranks in enumerate(parallel_results):
        pp = ranks["pp"]
        steps = list(zip(single["losses"], pp["losses"], strict=True))
        assert max(abs(a - b) for a, b in steps) <= TOLERANCE, (rank, steps)
        assert abs(pp["val"] - single["val"]) <= TOLERANCE, (rank, pp["val"], single["val"])


def test_benchmark_smoke_mode_writes_its_figures(tmp_path):
    command = [sys.executable, "bench/train_document_masking.py", "--smoke", "--out", str(tmp_path)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=REPO,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "document-masking-smoke.json").read_text())
    assert report["device"] == "cpu" and report["smoke"] is True
    rows = {row["attention"]: row for row in report["rows"]}
    assert set(rows) == {"causal", "document"}
    for row in rows.values():
        assert row["tokens_per_second"] > 0 and row["seq_len"] == report["seq_len"]
    assert rows["document"]["documents_per_sequence"] > 1
    assert report["document_over_causal"] == pytest.approx(
        rows["document"]["tokens_per_second"] / rows["causal"]["tokens_per_second"])


if __name__ == "__main__":
    worker(Path(sys.argv[1]))
