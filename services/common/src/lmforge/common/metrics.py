"""Prometheus helpers shared by the services (names: DESIGN.md, `lmforge_<service>_<quantity>`)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry


def new_registry() -> CollectorRegistry:
    """A registry per component, so tests and multiple instances never collide."""
    return CollectorRegistry(auto_describe=True)



def serve_metrics(registry: CollectorRegistry, port: int, host: str = "0.0.0.0"):  # noqa: S104 - scraped in-cluster
    """Serve `registry` on http://HOST:PORT/metrics from a daemon thread; returns the server
    (its `server_port` is the bound port when `port` is 0)."""
    from prometheus_client import start_http_server

    server, _thread = start_http_server(port, addr=host, registry=registry)
    return server
