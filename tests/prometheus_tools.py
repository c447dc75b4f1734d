"""Real Prometheus components on loopback for tests (docs/design.md: the Debian packages, started by
fixtures): the Pushgateway, and helpers to read what it holds."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from lmforge.demo.processes import free_port, stop, wait_http_ok
from lmforge.demo.prometheus import (  # noqa: F401 - re-exported for the tests
    alerts,
    prometheus_command,
    pushgateway_command,
    query,
    static_job,
    targets_up,
)


@contextlib.contextmanager
def _running(command: list[str], port: int, what: str, log_path: Path | None, timeout: float) -> Iterator[str]:
    """Start `command` (a Prometheus-family server listening on `port`), wait until its
    /-/ready answers, yield its URL, stop it."""
    log = open(log_path, "wb") if log_path else subprocess.DEVNULL  # noqa: SIM115 - closed below
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http_ok(f"{url}/-/ready", process, what, timeout, interval=0.05)
        yield url
    finally:
        stop(process, timeout=10)
        if log_path:
            log.close()


@contextlib.contextmanager
def running_pushgateway(log_path: Path | None = None, timeout: float = 30) -> Iterator[str]:
    """`prometheus-pushgateway` on a free loopback port, ready; yields its URL. Metrics are kept in
    memory only (Debian's default persists them to /var/lib/prometheus/pushgateway.data)."""
    port = free_port()
    with _running(pushgateway_command(port), port, "prometheus-pushgateway", log_path, timeout) as url:
        yield url


def scrape(url: str) -> list[tuple[str, dict[str, str], float]]:
    """Every sample on `url`/metrics as (name, labels, value)."""
    response = httpx.get(f"{url}/metrics", timeout=5)
    response.raise_for_status()
    return [(s.name, dict(s.labels), s.value) for family in text_string_to_metric_families(response.text)
            for s in family.samples]


def registry_samples(registry) -> dict[str, float]:
    """What a scrape of `registry` (generate_latest, parsed back) shows: each sample without
    labels by name. A gauge with no value yet is missing from it."""
    from prometheus_client import generate_latest

    text = generate_latest(registry).decode()
    return {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples
            if not s.labels}


def pushed_value(url: str, name: str, **group: str) -> float | None:
    """The value of `name` in the Pushgateway group whose labels (job and grouping key) are
    exactly `group`, or None if that group does not hold it. (The Pushgateway adds an empty
    `instance` label to every series; it is ignored.)"""
    def labels_of(got: dict[str, str]) -> dict[str, str]:
        return {k: v for k, v in got.items() if not (k == "instance" and v == "")}

    found = [value for sample, got, value in scrape(url) if sample == name and labels_of(got) == group]
    if len(found) > 1:
        raise AssertionError(f"{len(found)} series {name}{group}; expected at most one")
    return found[0] if found else None


def pushed_groups(url: str) -> list[dict]:
    """The Pushgateway's groups (GET /api/v1/metrics): each with `labels` (the grouping key,
    job included) and one entry per metric family."""
    response = httpx.get(f"{url}/api/v1/metrics", timeout=5)
    response.raise_for_status()
    return response.json()["data"]


@contextlib.contextmanager
def running_prometheus(workdir: Path, scrape_configs: list[dict], rule_files: list[Path] = (),
                       interval: str = "1s", timeout: float = 60) -> Iterator[str]:
    """`prometheus` on a free loopback port with its TSDB in `workdir` (Debian's default is
    /var/lib/prometheus), scraping and evaluating every `interval`; yields its URL."""
    port = free_port()
    command = prometheus_command(workdir, port, scrape_configs, rule_files, interval)
    with _running(command, port, "prometheus", workdir / "prometheus.log", timeout) as url:
        yield url
