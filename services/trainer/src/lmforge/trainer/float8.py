"""Float8 training with torchao (torchao.float8), applied as torchtitan's float8 converter does.

`apply_float8` swaps the model's Linear layers for torchao's Float8Linear before TP and FSDP
(lmforge.trainer.parallelize.parallelize): their matmuls run in float8 with dynamic scales (one
per tensor, or per row), the weights stay in their dtype. The output head stays in bf16 (its
logits feed the loss; torchtitan keeps `output` out too), as does any Linear whose dimensions
are not multiples of 16 (torch._scaled_mm's rule). With tensorwise scaling under FSDP/HSDP the
sharded weights are all-gathered in float8 and their scales are computed once after each
optimizer step (`precompute_float8_scales`) instead of once per all-gather.

Hardware: float8 matmuls need CUDA compute capability 8.9 or later (H100, H200, L4, L40S, …);
`float8_problems` refuses older GPUs before the run starts (float8 with tensor parallelism, not
wired, is the layout rulebook's refusal: lmforge.trainer.layout_rules). torch 2.13 also has CPU kernels
for torch._scaled_mm, so the same conversion runs (slowly, emulated) on CPU: the tests train with
it there.
"""

from __future__ import annotations

import dataclasses
import logging
import os

import torch
from torch import nn

from lmforge.common.errors import ConfigError
from lmforge.trainer.config import Float8Section, TrainConfig

MIN_CAPABILITY = (8, 9)
HEAD = "lm_head"  # lmforge.model.transformer.GPT's output layer


def float8_problems(section: Float8Section, device_type: str, capability: tuple[int, int] | None = None,
                    device_name: str = "") -> list[str]:
    """Why this float8 section cannot run on this device (empty when it can, or when it is off)."""
    if not section.enabled:
        return []
    problems = []
    if device_type == "cuda" and capability is not None and tuple(capability) < MIN_CAPABILITY:
        problems.append(f"float8.enabled needs CUDA compute capability >= {MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} "
                        f"(H100, H200, L4, L40S, …); this GPU ({device_name or 'cuda'}) is "
                        f"{capability[0]}.{capability[1]}: set float8.enabled=false")
    return problems


def refuse_unsupported_float8(config: TrainConfig) -> None:
    """A float8 run this machine cannot do fails before any process group work (exit 2, one line)."""
    if not config.float8.enabled:
        return
    capability, name = cuda_capability(config.device, int(os.environ.get("LOCAL_RANK", "0")))
    problems = float8_problems(config.float8, "cuda" if capability else "cpu", capability, name)
    if problems:
        raise ConfigError(problems[0])


def cuda_capability(device_choice: str, local_rank: int) -> tuple[tuple[int, int] | None, str]:
    """The compute capability and name of the GPU this rank will use (None, "" on CPU); no process group."""
    if device_choice == "cpu" or not torch.cuda.is_available():
        return None, ""
    index = local_rank % torch.cuda.device_count()
    return torch.cuda.get_device_capability(index), torch.cuda.get_device_name(index)


def converts_to_float8(module: nn.Module, fqn: str) -> bool:
    """torchao's module filter: every Linear but the output head and those _scaled_mm cannot take."""
    if not isinstance(module, nn.Linear) or fqn.rsplit(".", 1)[-1] == HEAD:
        return False
    return module.in_features % 16 == 0 and module.out_features % 16 == 0


def fsdp_float8_all_gather(section: Float8Section, mode: str) -> bool:
    """Whether FSDP all-gathers float8 weights: tensorwise scaling under FSDP/HSDP only (torchtitan's rule)."""
    return section.enabled and section.fsdp_float8_all_gather and section.recipe == "tensorwise" and \
        mode in ("fsdp", "hsdp")


def apply_float8(model: nn.Module, section: Float8Section, mode: str) -> list[str]:
    """Converts `model`'s eligible Linear layers in place; returns their names. Call before TP and FSDP."""
    if not torch.cuda.is_available():
        # torchao logs a warning for each of its CUDA kernel libraries it cannot load without CUDA.
        logging.getLogger("torchao").setLevel(logging.ERROR)
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    config = Float8LinearConfig.from_recipe_name(section.recipe)
    if fsdp_float8_all_gather(section, mode):
        config = dataclasses.replace(config, enable_fsdp_float8_all_gather=True)
    converted = [fqn for fqn, module in model.named_modules() if converts_to_float8(module, fqn)]
    convert_to_float8_training(model, config=config, module_filter_fn=converts_to_float8)
    return converted


def precompute_float8_scales(model: nn.Module, section: Float8Section, mode: str) -> None:
    """After the optimizer step: the float8 all-gather's weight scales, one all-reduce for all layers."""
    if fsdp_float8_all_gather(section, mode):
        from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

        precompute_float8_dynamic_scale_for_fsdp(model)
