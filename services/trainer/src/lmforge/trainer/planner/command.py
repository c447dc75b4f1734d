"""`lmforge-train plan`: arguments and handler (cli.py adds the subparser and calls `run`)."""

from __future__ import annotations

import argparse
import json
import sys

from lmforge.common.errors import ConfigError
from lmforge.trainer.planner.request import DEFAULT_GLOBAL_BATCH_TOKENS, build_request

DTYPES = ("bf16", "fp32")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    model = parser.add_argument_group("model and workload")
    model.add_argument("--model", required=True, metavar="PRESET", help="a model preset (lmforge.model.transformer)")
    model.add_argument(
        "--shape",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="override any model field, as the trainer's model.overrides (e.g. n_layer=40)",
    )
    model.add_argument("--tokens", type=float, help="tokens to train on (default: 20 per parameter, Chinchilla)")
    model.add_argument("--seq-len", type=int, help="default: the model's context length")
    batch = model.add_mutually_exclusive_group()
    batch.add_argument("--global-batch-tokens", type=float, help=f"default {DEFAULT_GLOBAL_BATCH_TOKENS:,}")
    batch.add_argument("--global-batch-sequences", type=int)
    model.add_argument(
        "--schedule",
        metavar="FILE",
        help="plan each stage of a schedule: a YAML list of stages, or a trainer config holding `schedule:` (the "
        "trainer's format); the run's length is --tokens, else the file's steps (docs/planning.md)",
    )

    hardware = parser.add_argument_group("cluster")
    hardware.add_argument("--gpu", default="H100", help="H100, H200, B200 or A100 (SXM; datasheet figures)")
    hardware.add_argument("--nodes", type=int, default=1)
    hardware.add_argument("--gpus-per-node", type=int, default=8)
    hardware.add_argument("--nvlink-gb-per-s", type=float, help="GB/s per GPU each way (default: the GPU's)")
    hardware.add_argument(
        "--network-gbit-per-s",
        type=float,
        help="Gb/s per GPU between nodes (default: the vendor's reference system: 400, A100 200)",
    )
    hardware.add_argument("--comm-efficiency", type=float, default=0.8, help="achieved / link bandwidth")
    hardware.add_argument("--usd-per-gpu-hour", type=float)
    hardware.add_argument("--precision", choices=("bf16", "fp8"), default="bf16")
    hardware.add_argument("--peak-tflops", type=float, help="override the GPU's peak (TFLOP/s per GPU)")

    training = parser.add_argument_group("training state and assumptions")
    dtypes = DTYPES
    training.add_argument(
        "--param-dtype",
        choices=dtypes,
        default="fp32",
        help="stored parameters (lmforge's FSDP2 keeps fp32 and computes in bf16)",
    )
    training.add_argument("--grad-dtype", choices=dtypes, help="default: the parameters'")
    training.add_argument("--moment-dtype", choices=dtypes, default="fp32", help="AdamW's two moments")
    training.add_argument(
        "--master-weights",
        action=argparse.BooleanOptionalAction,
        help="an fp32 master copy (default: when --param-dtype bf16)",
    )
    training.add_argument("--reduce-dtype", choices=dtypes, default="fp32")
    training.add_argument("--activation-checkpointing", choices=("auto", "on", "off"), default="auto")
    training.add_argument(
        "--no-flash-attention",
        dest="flash_attention",
        action="store_false",
        help="attention stores its s² scores (Korthikanti's 5as/h term)",
    )
    training.add_argument("--memory-headroom", type=float, default=0.10, help="share of GPU memory kept free")
    training.add_argument("--mfu", type=float, help="a measured MFU: step time from it instead of the model")
    training.add_argument(
        "--flops-convention",
        choices=("6N+attention", "6N"),
        default="6N+attention",
        help="FLOPs behind MFU and --mfu: with attention (PaLM) or 6·N·D alone (Kaplan)",
    )

    layout = parser.add_argument_group("pin layout axes (default: search them)")
    for axis in ("dp_replicate", "dp_shard", "tp", "pp", "cp", "ep", "micro_batch"):
        layout.add_argument(f"--{axis.replace('_', '-')}", type=int, dest=f"pin_{axis}")

    output = parser.add_argument_group("output")
    output.add_argument("--format", choices=("table", "json", "values"), default="table")
    output.add_argument("--top", type=int, default=15, help="candidates listed")
    output.add_argument("--all", action="store_true", help="list every candidate")


def run(args: argparse.Namespace) -> int:
    """Prints the plan; 0 with a recommendation, 1 when no layout fits, 2 on bad arguments."""
    from lmforge.trainer.planner.render import plan_document, table, values_yaml
    from lmforge.trainer.planner.search import search

    if args.schedule:
        return run_schedule(args)
    request, model = build_request(args)  # a bad argument raises: the CLI prints one line, exits 2
    candidates, evaluated = search(request)
    document = plan_document(request, candidates, evaluated, model, args.top, include_all=args.all)
    _print(document, args.format, values=values_yaml, table=table)
    if document["recommended"] is None:
        sys.stderr.write("lmforge-train plan: no layout fits in GPU memory (see the smallest above)\n")
        return 1
    return 0


def run_schedule(args: argparse.Namespace) -> int:
    """`plan --schedule`: a plan per stage and the run's totals; exit codes as `run`'s."""
    from lmforge.trainer.planner.schedule_plan import plan_schedule
    from lmforge.trainer.planner.schedule_render import schedule_document, schedule_table, schedule_values_yaml

    if args.global_batch_tokens is not None or args.global_batch_sequences is not None:
        raise ConfigError("--schedule: each stage sets its global_batch_tokens; drop --global-batch-*")
    document = schedule_document(plan_schedule(args))
    _print(document, args.format, values=schedule_values_yaml, table=schedule_table)
    unfit = [stage["name"] for stage in document["stages"] if stage["recommended"] is None]
    if unfit:
        sys.stderr.write(f"lmforge-train plan: no layout fits in GPU memory for stage {', '.join(unfit)}\n")
        return 1
    return 0


def _print(document: dict, output: str, *, values, table) -> None:
    """The document in the --format asked for: json, values (the chart's) or the table."""
    sys.stdout.write(json.dumps(document, indent=1) + "\n" if output == "json" else
                     values(document) if output == "values" else table(document))
