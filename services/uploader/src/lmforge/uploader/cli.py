"""`lmforge-uploader watch|restore|evals-finalize`: the checkpoint sidecar (checkpoints, weights
packages and their evaluation), the trainer pod's init container, and the evaluation's last word."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path
from urllib.parse import urlparse

from lmforge.common.cli import ServiceCli
from lmforge.common.errors import ConfigError
from lmforge.common.logging import get_logger
from lmforge.common.retry import RetryPolicy
from lmforge.common.storage import open_store
from lmforge.common.store import Store
from lmforge.uploader.config import TransferSection, UploaderConfig, load_uploader_config
from lmforge.uploader.eval_launcher import EvalLauncher, run_name
from lmforge.uploader.eval_runners import KubernetesRunner, Runner, SubprocessRunner
from lmforge.uploader.manifest import WEIGHTS
from lmforge.uploader.metrics import UploaderMetrics
from lmforge.uploader.promotion import Promoter
from lmforge.uploader.restore import restore
from lmforge.uploader.sidecar import Sidecar
from lmforge.uploader.watcher import CheckpointUploader

log = get_logger("uploader")


def open_destination(uri: str, transfer: TransferSection, retry: RetryPolicy | None = None,
                     endpoint_url: str | None = None) -> Store:
    """The checkpoints' store: s3://BUCKET/PREFIX, moved with the transfer settings and `retry`
    (default: the transfer settings' policy, logged as the uploader), or file:///PATH."""
    parsed = urlparse(uri)
    if not ((parsed.scheme == "s3" and parsed.netloc) or (parsed.scheme == "file" and parsed.path)):
        raise ConfigError(f"destination {uri!r}: expected s3://BUCKET/PREFIX or file:///PATH")
    return open_store(uri, endpoint_url=endpoint_url, part_size=transfer.part_size, concurrency=transfer.concurrency,
                      connect_timeout=transfer.connect_timeout_seconds, read_timeout=transfer.read_timeout_seconds,
                      retry=retry or transfer.policy(log=log))


def cmd_watch(args: argparse.Namespace, config: UploaderConfig) -> int:
    if args.node_rank != 0:
        return _stand_by(args.command, args.node_rank)
    retry = config.transfer.policy(log=log)
    destination = open_destination(args.dest, config.transfer, retry, args.endpoint_url)
    metrics = UploaderMetrics()
    if config.metrics_port:
        log.info("metrics_serving", port=metrics.serve(config.metrics_port))
    if config.evaluation.enabled and not args.weights_dir:
        raise ConfigError("evaluation.enabled needs --weights-dir (the packages it evaluates)")
    launcher = weights = None
    if args.weights_dir:
        weights_dir = Path(args.weights_dir)
        if config.evaluation.enabled:
            launcher = eval_launcher(destination, weights_dir, config, metrics, args.endpoint_url)
        weights = CheckpointUploader(weights_dir, destination, config, metrics.for_weights(), kind=WEIGHTS,
                                     pinned=launcher.pinned if launcher is not None else None)
    sidecar = Sidecar(CheckpointUploader(Path(args.dir), destination, config, metrics), weights, launcher)
    retry.should_stop = sidecar.cancel.is_set
    signal.signal(signal.SIGTERM, lambda *_: sidecar.request_stop())
    signal.signal(signal.SIGINT, lambda *_: sidecar.request_stop())
    try:
        sidecar.start()
        sidecar.run(exit_when_done=args.exit_when_done)
    finally:
        sidecar.close()
        metrics.close()
    log.info("exited", reason="stopped" if sidecar.stopping.is_set() else "done")
    return 0


def eval_runner(config: UploaderConfig, run_dir: Path) -> Runner:
    evaluation = config.evaluation
    if evaluation.runner == "kubernetes":
        return KubernetesRunner(evaluation.job_template, evaluation.namespace)
    return SubprocessRunner(list(evaluation.command), log_dir=run_dir / "eval-logs")


def eval_launcher(destination: Store, weights_dir: Path, config: UploaderConfig, metrics: UploaderMetrics,
                  endpoint_url: str | None, *, runner: bool = True) -> EvalLauncher:
    """The launcher of `watch` (runner=True) or of `evals-finalize` (ingest and promote only)."""
    evaluation = config.evaluation
    models = None
    if evaluation.promote == "pointer":
        models = open_destination(evaluation.models_store, config.transfer, endpoint_url=endpoint_url)
    promoter = Promoter(destination, evaluation, run_name(weights_dir, evaluation), models)
    return EvalLauncher(destination, weights_dir, evaluation, eval_runner(config, weights_dir.parent) if runner
                        else None, promoter, metrics)


def cmd_evals_finalize(args: argparse.Namespace, config: UploaderConfig) -> int:
    destination = open_destination(args.dest, config.transfer, endpoint_url=args.endpoint_url)
    try:
        destination.check()
        best = eval_launcher(destination, Path(args.weights_dir), config, UploaderMetrics(), args.endpoint_url,
                             runner=False).finalize()
    finally:
        destination.close()
    log.info("evals_finalized", best_step=(best or {}).get("step"), score=(best or {}).get("score"),
             promoted_to=(best or {}).get("promoted_to"))
    return 0


def cmd_restore(args: argparse.Namespace, config: UploaderConfig) -> int:
    if args.node_rank != 0:
        return _stand_by(args.command, args.node_rank)
    destination = open_destination(args.src, config.transfer, endpoint_url=args.endpoint_url)
    destination.check()
    try:
        step = restore(destination, Path(args.dir), args.step)
    finally:
        destination.close()
    log.info("restore_done", step=step)
    return 0


def _stand_by(command: str, node_rank: int) -> int:
    """Node rank 0 restores and uploads the shared volume. A restore here is done at once; a
    watch, a native sidecar that would be restarted if it exited, waits to be stopped."""
    log.info("standing_by", command=command, node_rank=node_rank, reason="node rank 0 restores and uploads")
    if command == "watch":
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        while not stop.wait(1.0):  # short waits: the handler runs between them
            pass
        log.info("exited", reason="stopped")
    return 0


def build_cli() -> ServiceCli:
    cli = ServiceCli("lmforge-uploader", service="uploader", description=__doc__, load_config=load_uploader_config)
    watch = cli.command("watch", cmd_watch, help="upload each newly committed checkpoint; MANIFEST.json last",
                        config="load")
    watch.add_argument("--dir", required=True, help="the trainer's checkpoint directory (RUN_DIR/checkpoints)")
    watch.add_argument("--dest", required=True, help="s3://BUCKET/PREFIX/RUN or file:///PATH")
    watch.add_argument("--weights-dir", help="the trainer's weights packages (RUN_DIR/weights): uploaded to "
                       "DEST/weights/, and evaluated when evaluation.enabled")
    watch.add_argument("--exit-when-done", action="store_true",
                       help="exit 0 once the store holds the final checkpoint (checked there, never taken from a "
                            "local marker; an unreachable store is retried until it answers or SIGTERM); with "
                            "--weights-dir also the final weights package (meta.json final: true), and with "
                            "evaluation.enabled once no evaluation is running or waiting")
    restore_cmd = cli.command("restore", cmd_restore, help="download the newest complete checkpoint (init container)",
                              config="load")
    restore_cmd.add_argument("--src", required=True, help="s3://BUCKET/PREFIX/RUN or file:///PATH")
    restore_cmd.add_argument("--dir", required=True)
    which = restore_cmd.add_mutually_exclusive_group()
    which.add_argument("--step", type=int, help="this step (it must be complete in the store)")
    which.add_argument("--latest", action="store_true", help="the newest complete checkpoint (default)")
    finalize = cli.command("evals-finalize", cmd_evals_finalize, config="load",
                           help="ingest every evaluation result in the store, promote the best, write "
                                "evals/best.json (idempotent)")
    finalize.add_argument("--dest", required=True, help="the run's store: s3://BUCKET/PREFIX/RUN or file:///PATH")
    finalize.add_argument("--weights-dir", required=True, help="RUN_DIR/weights (records go to RUN_DIR/evals.jsonl)")
    finalize.add_argument("--endpoint-url", help="an S3-compatible endpoint (default: AWS_ENDPOINT_URL)")
    for command in (watch, restore_cmd):
        command.add_argument("--node-rank", type=int, default=0, metavar="N",
                             help="this pod's node rank where every node mounts the same checkpoint volume: only "
                                  "node rank 0 restores and uploads; on the others restore does nothing and watch "
                                  "stands by until stopped (default 0)")
        command.add_argument("--endpoint-url", help="an S3-compatible endpoint (default: AWS_ENDPOINT_URL)")
    return cli


CLI = build_cli()
main = CLI.main


if __name__ == "__main__":
    sys.exit(main())
