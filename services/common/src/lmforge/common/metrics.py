"""Prometheus helpers shared by the services (names: DESIGN.md, `lmforge_<service>_<quantity>`)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry


def new_registry() -> CollectorRegistry:
    """A registry per component, so tests and multiple instances never collide."""
    return CollectorRegistry(auto_describe=True)

