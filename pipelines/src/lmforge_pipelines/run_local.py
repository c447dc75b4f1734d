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
from pathlib import Path

from lmforge.common.cli import ServiceCli


def build_cli() -> ServiceCli:
    # A workdir that cannot be written: one line and exit 4, like every lmforge CLI.
    cli = ServiceCli("python -m lmforge_pipelines.run_local", service="pipelines", description=__doc__)
    parser = cli.command(None, _run)
    parser.add_argument("--workdir", required=True, help="where data, runs, models and KFP's outputs go")
    parser.add_argument("--crawl", default="sample", help='"sample" (WET files generated here first, with '
                        'lmforge-sample-data) or a crawl id')
    parser.add_argument("--shards", type=int, default=2, help="WET files (generated, or the crawl's first N)")
    parser.add_argument("--docs-per-shard", type=int, default=1500, help="documents per generated WET file")
    parser.add_argument("--workers", type=int, default=2,
                        help="data-prep workers, and tasks of each split global stage (ParallelFor)")
    parser.add_argument("--languages", default="en")
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument("--shard-tokens", type=int, default=200_000)
    parser.add_argument("--val-fraction", type=float, default=0.02)
    parser.add_argument("--trace-index", action="store_true",
                        help="also build the exact-match trace index over the training tokens (trace_index.enabled)")
    parser.add_argument("--data-only", action="store_true", help="run the data pipeline only")
    parser.add_argument("--summary", help="also write the JSON summary to this file")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--nproc", type=int, default=2, help="torchrun processes (FSDP when more than one)")
    parser.add_argument("--run-name", default="local")
    parser.add_argument("--rounds", type=int, default=4,
                        help="rounds of the duplicate components the pipeline schedules (components.max_rounds)")
    return cli


def _run(args: argparse.Namespace, _config: None) -> int:
    from kfp import local

    from lmforge_pipelines.component_bodies import SAMPLE_CRAWL, WET_DIR, WET_SUFFIX
    from lmforge_pipelines.data_pipeline import build_data_pipeline, split_stage_tasks

    workdir = Path(args.workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)  # here, not inside a pipeline task
    wet = workdir / "data" / WET_DIR
    # crawl "sample": the fetch step takes the WET files placed in wet/ (the demo places its own).
    if args.crawl == SAMPLE_CRAWL and len(list(wet.glob(f"*{WET_SUFFIX}"))) < args.shards:
        from lmforge.sample_data.inputs import write_sample_inputs

        write_sample_inputs(wet, args.shards, args.docs_per_shard)
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(workdir / "kfp"))
    data = build_data_pipeline(args.rounds)(
        crawl=args.crawl, shards=args.shards, workers=args.workers, languages=args.languages,
        output=str(workdir / "data"), stage_tasks=split_stage_tasks(args.workers),
        dataprep_config={"tokenizer": {"vocab_size": args.vocab_size}, "components": {"max_rounds": args.rounds},
                         "shards": {"shard_tokens": args.shard_tokens, "val_fraction": args.val_fraction},
                         "trace_index": {"enabled": args.trace_index}})
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


CLI = build_cli()
main = CLI.main


if __name__ == "__main__":
    sys.exit(main())
