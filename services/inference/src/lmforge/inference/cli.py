"""`lmforge-serve`: the inference server (FastAPI on uvicorn)."""

from __future__ import annotations

import argparse
import os
import socket
import sys
import threading

from lmforge.common.cli import ServiceCli
from lmforge.common.errors import CLI_ERRORS, ConfigError, LmforgeError, as_lmforge_error
from lmforge.common.logging import get_logger
from lmforge.common.metrics import serve_metrics
from lmforge.inference.config import ServeConfig, load_serve_config


def _listen(host: str, port: int) -> socket.socket:
    """The API's listening socket, bound before the model loads: a taken port is one line and
    exit 2 (uvicorn would exit from inside its loop, while the model is still loading)."""
    try:
        return socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET)
    except OSError as exc:
        reason = os.strerror(exc.errno) if exc.errno else str(exc)  # create_server's own text repeats the address
        raise ConfigError(f"cannot listen on {host}:{port}: {reason}") from exc


def serve(args: argparse.Namespace, config: ServeConfig) -> int:
    log = get_logger("inference")
    if not config.model:
        raise LmforgeError("no model: pass --model PATH_OR_S3_URI")
    import uvicorn

    from lmforge.inference.api import create_app
    from lmforge.inference.service import InferenceService

    listener = _listen(config.host, config.port)
    service = InferenceService(config)
    app = create_app(service)
    if config.metrics_port is not None:
        log.info("metrics_serving", port=serve_metrics(service.metrics.registry, config.metrics_port).server_port)
    server = uvicorn.Server(uvicorn.Config(app, host=config.host, port=config.port, log_level="warning",
                                           access_log=False, timeout_graceful_shutdown=10))
    loader = service.load_in_background()

    def stop_if_load_fails():
        loader.join()
        if service.load_error is not None:
            server.should_exit = True

    threading.Thread(target=stop_if_load_fails, daemon=True).start()
    log.info("serving", url=f"http://{config.host}:{config.port}", model=config.model)
    try:
        server.run(sockets=[listener])
    finally:
        service.stop()
    if service.load_error is not None:
        error = service.load_error
        if isinstance(error, CLI_ERRORS):
            error = as_lmforge_error(error)
        sys.stderr.write(f"lmforge-serve: error: cannot load {config.model}: {error}\n")
        return error.exit_code if isinstance(error, LmforgeError) else 1
    return 0


def build_cli() -> ServiceCli:
    # --model, --host and --port set the config fields of the same name, over any --set.
    cli = ServiceCli("lmforge-serve", service="inference", description=__doc__, load_config=load_serve_config,
                     flag_fields=("model", "host", "port"))
    parser = cli.command(None, serve, config="load")
    parser.add_argument("--model", help="model package (a directory or s3://BUCKET/PREFIX/models/VERSION), or a "
                        "model pointer naming one (e.g. s3://BUCKET/PREFIX/models/current), followed while serving")
    parser.add_argument("--host", help="bind address (default 0.0.0.0)")
    parser.add_argument("--port", type=int, help="API port (default 8000)")
    return cli


CLI = build_cli()
main = CLI.main


if __name__ == "__main__":
    sys.exit(main())
