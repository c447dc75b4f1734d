"""Prometheus helpers shared by the services (names: DESIGN.md, `lmforge_<service>_<quantity>`)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, start_http_server


def new_registry() -> CollectorRegistry:
    """A registry per component, so tests and multiple instances never collide."""
    return CollectorRegistry(auto_describe=True)


def serve_metrics(registry: CollectorRegistry, port: int, addr: str = "0.0.0.0"):  # noqa: S104 - a pod serves all
    """Expose `registry` on http://addr:port/metrics in a daemon thread; returns (server, thread)."""
    return start_http_server(port, addr=addr, registry=registry)
