"""Prometheus helpers shared by the services (names: docs/design.md, `lmforge_<service>_<quantity>`)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from lmforge.common.errors import ConfigError


def new_registry() -> CollectorRegistry:
    """A registry per component, so tests and multiple instances never collide."""
    return CollectorRegistry(auto_describe=True)


def gauge_family(name: str, documentation: str, value: float | None,
                 labels: dict[str, str] | None = None) -> GaugeMetricFamily:
    """A gauge family with its one sample, or with none while `value` is None (not known yet):
    the scrape then shows the name's HELP and TYPE only, and PromQL sees no series."""
    labels = labels or {}
    family = GaugeMetricFamily(name, documentation, labels=list(labels))
    if value is not None:
        family.add_metric(list(labels.values()), value)
    return family


def counter_family(name: str, documentation: str, value: float | None,
                   labels: dict[str, str] | None = None) -> CounterMetricFamily:
    """A counter family (exposed as `name`_total) for a count kept elsewhere and read at scrape
    time, with its one sample, or with none while `value` is None (like gauge_family)."""
    labels = labels or {}
    family = CounterMetricFamily(name, documentation, labels=list(labels))
    if value is not None:
        family.add_metric(list(labels.values()), value)
    return family


class AbsentUntilSetGauge:
    """A gauge without labels whose series is absent until its first `set`.

    prometheus_client's Gauge reads 0 from its creation, and a scrape before the first real
    value takes that 0 for a reading: after every restart averages drop, alerts compare against
    it and graphs dip to 0. This one has no sample until the value is known."""

    def __init__(self, name: str, documentation: str, registry: CollectorRegistry):
        self.name, self.documentation = name, documentation
        self.value: float | None = None
        registry.register(self)

    def set(self, value: float) -> None:
        self.value = float(value)

    def collect(self):
        yield gauge_family(self.name, self.documentation, self.value)


def serve_metrics(registry: CollectorRegistry, port: int, host: str = "0.0.0.0"):  # noqa: S104 - scraped in-cluster
    """Serve `registry` on http://HOST:PORT/metrics from a daemon thread; returns the server
    (its `server_port` is the bound port when `port` is 0)."""
    from prometheus_client import start_http_server

    try:
        server, _thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:  # the port is taken: a configuration problem, said in one line
        raise ConfigError(f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}") from exc
    return server
