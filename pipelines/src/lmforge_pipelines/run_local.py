"""Run the data and train pipelines on this machine with kfp.local (SubprocessRunner in this
environment, the local torchrun launcher): the same pipeline code the KFP backend runs.

    python -m lmforge_pipelines.run_local --workdir demo-pipelines
    # → WORKDIR/data (shards, report.html), WORKDIR/runs/<run>, WORKDIR/models/<run>-step<N>
    python -m lmforge_pipelines.run_local --workdir W --data-only --crawl CC-MAIN-2024-22   # (network)

kfp.local checks the plumbing, not Kubernetes: resources, retries and images are ignored.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lmforge_pipelines.run_local", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", required=True, help="where data, runs, models and KFP's outputs go")
    parser.add_argument("--crawl", default="sample", help='"sample" (generated WET files) or a crawl id')
    parser.add_argument("--shards", type=int, default=2, help="WET files (generated, or the crawl's first N)")
    parser.add_argument("--docs-per-shard", type=int, default=1500)
    parser.add_argument("--workers", type=int, default=2, help="data-prep workers (ParallelFor)")
    parser.add_argument("--languages", default="en")
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument("--shard-tokens", type=int, default=200_000)
    parser.add_argument("--val-fraction", type=float, default=0.02)
    parser.add_argument("--data-only", action="store_true", help="run the data pipeline only")
    parser.add_argument("--summary", help="also write the JSON summary to this file")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--nproc", type=int, default=2, help="torchrun processes (FSDP when more than one)")
    parser.add_argument("--run-name", default="local")
    args = parser.parse_args(argv)
    try:
        return _run(args)
    except OSError as exc:  # a workdir that cannot be written: one line and exit 4, like every lmforge CLI
        from lmforge.common.errors import report_failure
        from lmforge.common.logging import get_logger

        return report_failure(get_logger("pipelines"), parser.prog, exc)


def _run(args: argparse.Namespace) -> int:
    from kfp import local

    from lmforge_pipelines.data_pipeline import data_pipeline

    workdir = Path(args.workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)  # here, not inside a pipeline task
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(workdir / "kfp"))
    data = data_pipeline(crawl=args.crawl, shards=args.shards, docs_per_shard=args.docs_per_shard, workers=args.workers,
                         languages=args.languages, output=str(workdir / "data"), finalize_processes=args.workers,
                         dataprep_config={"tokenizer": {"vocab_size": args.vocab_size},
                                          "shards": {"shard_tokens": args.shard_tokens,
                                                     "val_fraction": args.val_fraction}})
    summary = {"data": data.outputs["data"], "report_html": data.outputs["report"].path}
    if not args.data_only:
        summary.update(_train(args, workdir, data))
    text = json.dumps(summary, indent=1) + "\n"
    if args.summary:
        Path(args.summary).write_text(text)
    sys.stdout.write(text)
    return 0


def _train(args: argparse.Namespace, workdir: Path, data) -> dict:
    from lmforge_pipelines.train_pipeline import train_pipeline

    trained = train_pipeline(
        data=data.outputs["data"], model_preset="tiny", steps=args.steps, nodes=1, gpus_per_node=args.nproc,
        parallel_mode="fsdp" if args.nproc > 1 else "none", launcher="local", run_name=args.run_name,
        train_config={"data": {"seq_len": 128, "batch_size": 4}}, checkpoint_store=str(workdir / "runs"),
        models_store=str(workdir / "models"), eval_sequences=128)
    return {"model": trained.outputs["model_uri"], "val_loss": trained.outputs["val_loss"]}


if __name__ == "__main__":
    sys.exit(main())
