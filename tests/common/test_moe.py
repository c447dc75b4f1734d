"""The mixture-of-experts MLP: routing, capacity and drops, the auxiliary losses, bias
balancing (one process and summed over two gloo ranks), gradients, determinism."""

from __future__ import annotations

import math
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from lmforge.model.moe import MoE, MoEConfig, plan_dispatch, update_router_biases

DIM, HIDDEN = 8, 16


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def expert_output(moe: MoE, index: int, x: torch.Tensor, shared: bool = False) -> torch.Tensor:
    """One expert's MLP on tokens x (N, dim), computed directly from its weights."""
    experts = moe.shared_expert if shared else moe.experts
    if experts.activation == "swiglu":
        return (F.silu(x @ experts.gate[index]) * (x @ experts.up[index])) @ experts.down[index]
    hidden = F.gelu(x @ experts.fc[index] + experts.fc_bias[index], approximate="tanh")
    return hidden @ experts.proj[index] + experts.proj_bias[index]


@pytest.mark.parametrize(("activation", "bias", "shared"), [("swiglu", False, False), ("gelu", True, True)])
def test_output_shape_and_stats(activation, bias, shared):
    moe = MoE(DIM, HIDDEN, MoEConfig(num_experts=4, shared_expert=shared), activation, bias)
    assert moe.stats == {}
    out = moe(torch.randn(3, 5, DIM))
    assert out.shape == (3, 5, DIM)
    assert set(moe.stats) == {"load_max_over_mean", "dropped_fraction", "balance_loss", "z_loss"}
    assert all(isinstance(v, float) for v in moe.stats.values())
    assert moe.aux_loss.shape == () and moe.aux_loss.item() > 0


@pytest.mark.parametrize(("activation", "shared"), [("swiglu", False), ("gelu", True)])
def test_all_experts_unbounded_equals_the_probability_weighted_sum_of_every_expert(activation, shared):
    config = MoEConfig(num_experts=4, top_k=4, shared_expert=shared)
    moe = MoE(DIM, HIDDEN, config, activation, bias=activation == "gelu").eval()  # eval: no capacity limit
    x = torch.randn(2, 6, DIM)
    tokens = x.reshape(-1, DIM)
    probs = (tokens @ moe.router.weight.T).softmax(dim=-1)
    expected = sum(probs[:, [e]] * expert_output(moe, e, tokens) for e in range(4))
    if shared:
        expected = expected + expert_output(moe, 0, tokens, shared=True)
    with torch.no_grad():
        assert torch.allclose(moe(x).reshape(-1, DIM), expected, atol=1e-6)
    assert moe.stats["dropped_fraction"] == 0.0


def test_top_k_weights_are_renormalised_and_bias_only_chooses():
    config = MoEConfig(num_experts=4, top_k=2, balancing="bias")
    moe = MoE(DIM, HIDDEN, config, "swiglu", bias=False)
    tokens = torch.randn(10, DIM)
    moe.router.selection_bias[3] = 10.0  # every token now picks expert 3 first
    routing = moe.router(tokens)
    assert (routing.experts[:, 0] == 3).all()
    probs = (tokens @ moe.router.weight.T).softmax(dim=-1)
    chosen = probs.gather(-1, routing.experts)
    assert torch.allclose(routing.weights, chosen / chosen.sum(-1, keepdim=True))
    unnormalised = MoE(DIM, HIDDEN, config.model_copy(update={"renormalize": False}), "swiglu", bias=False)
    unnormalised.load_state_dict(moe.state_dict())
    assert torch.allclose(unnormalised.router(tokens).weights, chosen)


def test_assignments_past_capacity_are_dropped_in_token_order():
    experts = torch.tensor([[0, 1], [0, 2], [0, 1], [1, 0]])
    plan = plan_dispatch(experts, num_experts=3, capacity=2)
    # expert 0 gets tokens 0,1,2,3 (keeps 0,1); expert 1 gets 0,2,3 (keeps 0,2); expert 2 gets 1.
    assert plan.kept.tolist() == [[True, True], [True, True], [False, True], [False, False]]
    assert plan.load.tolist() == [4, 3, 1]
    assert plan.slot_token.tolist() == [0, 1, 0, 2, 1, 4]  # 4 = the empty slot's zero row


def test_dropped_tokens_are_counted_and_contribute_nothing():
    config = MoEConfig(num_experts=4, top_k=1, capacity_factor=1.0, renormalize=False)
    moe = MoE(4, HIDDEN, config, "swiglu", bias=False).train()
    with torch.no_grad():
        moe.router.weight.copy_(10 * torch.eye(4))  # a token one-hot in dim e picks expert e
    choices = [0, 0, 0, 1, 2, 0, 1, 3]  # capacity ceil(1·1·8/4) = 2: expert 0 drops tokens 2 and 5
    x = F.one_hot(torch.tensor(choices), 4).float().view(1, 8, 4)
    out = moe(x)[0]
    assert moe.stats["dropped_fraction"] == 0.25
    assert moe.stats["load_max_over_mean"] == 2.0
    assert (out[[2, 5]] == 0).all()
    kept = [0, 1, 3, 4, 6, 7]
    weight = torch.tensor(math.exp(10) / (math.exp(10) + 3))
    expected = torch.stack([weight * expert_output(moe, choices[t], x[0, [t]])[0] for t in kept])
    assert torch.allclose(out[kept], expected, atol=1e-6)
    moe.eval()  # eval_capacity_factor None: nothing dropped
    moe(x)
    assert moe.stats["dropped_fraction"] == 0.0


def test_aux_losses_follow_the_formulas():
    a, experts = 3.0, 4
    config = MoEConfig(num_experts=experts, top_k=1, aux_loss_coef=0.01, z_loss_coef=0.001)
    moe = MoE(4, HIDDEN, config, "swiglu", bias=False)
    with torch.no_grad():
        moe.router.weight.zero_()
        moe.router.weight[0, 0] = a  # logits (a, 0, 0, 0) for a token e_0: every one goes to expert 0
    moe(torch.eye(4)[0].expand(1, 6, 4))
    p0 = math.exp(a) / (math.exp(a) + experts - 1)
    balance, z = experts * 1.0 * p0, math.log(math.exp(a) + experts - 1) ** 2  # f = (1, 0, 0, 0)
    assert moe.stats["balance_loss"] == pytest.approx(balance, rel=1e-6)
    assert moe.stats["z_loss"] == pytest.approx(z, rel=1e-6)
    assert moe.aux_loss.item() == pytest.approx(0.01 * balance + 0.001 * z, rel=1e-6)

    with torch.no_grad():
        moe.router.weight.zero_()  # a uniform router: balance exactly 1, z = (log E)²
    moe(torch.randn(1, 6, 4))
    assert moe.stats["balance_loss"] == pytest.approx(1.0, rel=1e-6)
    assert moe.stats["z_loss"] == pytest.approx(math.log(experts) ** 2, rel=1e-6)

    bias_balanced = MoE(4, HIDDEN, config.model_copy(update={"balancing": "bias"}), "swiglu", bias=False)
    bias_balanced.load_state_dict(moe.state_dict(), strict=False)
    bias_balanced(torch.randn(1, 6, 4))
    assert bias_balanced.aux_loss.item() == pytest.approx(0.001 * math.log(experts) ** 2, rel=1e-6)  # z only


def test_bias_balancing_moves_the_load_towards_uniform():
    config = MoEConfig(num_experts=4, top_k=2, balancing="bias", bias_update_rate=0.01, capacity_factor=4.0)
    moe = MoE(DIM, HIDDEN, config, "swiglu", bias=False).train()
    generator = torch.Generator().manual_seed(1)
    lean = torch.randn(DIM, generator=generator)  # the tokens lean one way: the fixed router overloads some experts
    imbalance = []
    with torch.no_grad():
        moe.router.weight.normal_(0, 0.3)
        for _ in range(60):
            moe(torch.randn(1, 256, DIM, generator=generator) + lean)
            imbalance.append(moe.stats["load_max_over_mean"])
            update_router_biases(moe)
    assert min(imbalance[:5]) > 1.5
    assert max(imbalance[-10:]) < 1.3, imbalance
    assert "router.selection_bias" in moe.state_dict()  # checkpointed with the model


def test_pending_loads_sum_training_forwards_only():
    config = MoEConfig(num_experts=4, balancing="bias", bias_update_rate=0.5)
    moe = MoE(DIM, HIDDEN, config, "swiglu", bias=False).train()
    micro_batches = [torch.randn(1, 8, DIM), torch.randn(1, 8, DIM)]  # one step's two micro-batches
    for batch in micro_batches:
        moe(batch)
    moe.eval()
    moe(torch.randn(1, 8, DIM))  # evaluation does not count
    expected = sum(torch.bincount(moe.router(b.view(-1, DIM)).experts.flatten(), minlength=4) for b in micro_batches)
    pending = moe.take_pending_load()
    assert torch.equal(pending, expected.float())
    moe.update_bias(pending)
    assert torch.equal(moe.router.selection_bias, 0.5 * torch.sign(pending.mean() - pending))
    assert torch.equal(moe.take_pending_load(), torch.zeros(4))


def test_gradients_reach_the_router_and_every_expert():
    moe = MoE(DIM, HIDDEN, MoEConfig(num_experts=4, shared_expert=True), "swiglu", bias=False).train()
    out = moe(torch.randn(2, 32, DIM))
    out.square().sum().backward()  # the output alone, without aux_loss, trains the router
    for name, parameter in moe.named_parameters():
        assert parameter.grad is not None and parameter.grad.abs().sum() > 0, name
    for e in range(4):
        assert moe.experts.gate.grad[e].abs().sum() > 0


def test_same_seed_same_output_and_gradients():
    def run() -> tuple[torch.Tensor, torch.Tensor]:
        torch.manual_seed(3)
        moe = MoE(DIM, HIDDEN, MoEConfig(num_experts=4, capacity_factor=1.0), "swiglu", bias=False).train()
        out = moe(torch.randn(4, 16, DIM))
        (out.sum() + moe.aux_loss).backward()
        return out.detach(), moe.router.weight.grad

    (out_a, grad_a), (out_b, grad_b) = run(), run()
    assert torch.equal(out_a, out_b) and torch.equal(grad_a, grad_b)


def test_top_k_must_not_exceed_the_experts():
    with pytest.raises(ValueError, match="top_k"):
        MoEConfig(num_experts=2, top_k=3)


def _rank_update(rank: int, port: int, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        torch.manual_seed(0)  # same weights on both ranks
        moe = MoE(DIM, HIDDEN, MoEConfig(num_experts=4, balancing="bias"), "swiglu", bias=False).train()
        torch.manual_seed(10 + rank)  # different tokens
        moe(torch.randn(1, 16 * (rank + 1), DIM) + rank * torch.ones(DIM))
        local = moe._pending_load.clone()
        update_router_biases(moe)
        results[rank] = (local, moe.router.selection_bias.clone())
    finally:
        dist.destroy_process_group()


def test_two_ranks_sum_their_loads_and_keep_identical_biases():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    results = mp.Manager().dict()
    mp.spawn(_rank_update, args=(port, results), nprocs=2)
    (load_0, bias_0), (load_1, bias_1) = results[0], results[1]
    total = load_0 + load_1
    assert torch.equal(bias_0, bias_1)
    assert torch.equal(bias_0, 0.001 * torch.sign(total.mean() - total))
