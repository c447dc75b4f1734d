"""`lmforge-uploader watch|restore`: the checkpoint sidecar and the trainer pod's init container."""

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
from lmforge.uploader.metrics import UploaderMetrics
from lmforge.uploader.restore import restore
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
    uploader = CheckpointUploader(Path(args.dir), destination, config, metrics)
    retry.should_stop = uploader.cancel.is_set
    signal.signal(signal.SIGTERM, lambda *_: uploader.request_stop())
    signal.signal(signal.SIGINT, lambda *_: uploader.request_stop())
    try:
        uploader.start()
        uploader.run(exit_when_done=args.exit_when_done)
    finally:
        uploader.close()
        metrics.close()
    log.info("exited", reason="stopped" if uploader.stopping.is_set() else "done")
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
    watch.add_argument("--exit-when-done", action="store_true",
                       help="exit 0 once the store holds the final checkpoint (checked there, never taken from a "
                            "local marker; an unreachable store is retried until it answers or SIGTERM)")
    restore_cmd = cli.command("restore", cmd_restore, help="download the newest complete checkpoint (init container)",
                              config="load")
    restore_cmd.add_argument("--src", required=True, help="s3://BUCKET/PREFIX/RUN or file:///PATH")
    restore_cmd.add_argument("--dir", required=True)
    which = restore_cmd.add_mutually_exclusive_group()
    which.add_argument("--step", type=int, help="this step (it must be complete in the store)")
    which.add_argument("--latest", action="store_true", help="the newest complete checkpoint (default)")
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
