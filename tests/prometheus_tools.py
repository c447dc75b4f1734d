"""Real Prometheus components on loopback for tests (DESIGN.md: the Debian packages, started by
fixtures): the Pushgateway, and helpers to read what it holds."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.ports import free_port
from tests.processes import stop, wait_http_ok

PUSHGATEWAY = "/usr/bin/prometheus-pushgateway"


def _binary(default: str, name: str) -> str:
    found = default if Path(default).exists() else shutil.which(name)
    if not found:
        raise FileNotFoundError(f"{name} not found (install the Debian package {name}: `make setup`)")
    return found


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
    command = [_binary(PUSHGATEWAY, "prometheus-pushgateway"), f"--web.listen-address=127.0.0.1:{port}",
               "--persistence.file=", "--log.level=warn"]
    with _running(command, port, "prometheus-pushgateway", log_path, timeout) as url:
        yield url


def scrape(url: str) -> list[tuple[str, dict[str, str], float]]:
    """Every sample on `url`/metrics as (name, labels, value)."""
    response = httpx.get(f"{url}/metrics", timeout=5)
    response.raise_for_status()
    return [(s.name, dict(s.labels), s.value) for family in text_string_to_metric_families(response.text)
            for s in family.samples]


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


PROMETHEUS = "/usr/bin/prometheus"


@contextlib.contextmanager
def running_prometheus(workdir: Path, scrape_configs: list[dict], rule_files: list[Path] = (),
                       interval: str = "1s", timeout: float = 60) -> Iterator[str]:
    """`prometheus` on a free loopback port with its TSDB in `workdir` (Debian's default is
    /var/lib/prometheus), scraping and evaluating every `interval`; yields its URL."""
    import yaml

    port = free_port()
    config = {"global": {"scrape_interval": interval, "evaluation_interval": interval},
              "rule_files": [str(p) for p in rule_files], "scrape_configs": scrape_configs}
    config_path = workdir / "prometheus.yml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    command = [_binary(PROMETHEUS, "prometheus"), f"--config.file={config_path}",
               f"--storage.tsdb.path={workdir / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}",
               "--log.level=warn"]
    with _running(command, port, "prometheus", workdir / "prometheus.log", timeout) as url:
        yield url


def static_job(name: str, url: str, honor_labels: bool = False, path: str = "/metrics") -> dict:
    """A scrape job for one loopback target given by its base URL."""
    job = {"job_name": name, "metrics_path": path, "static_configs": [{"targets": [url.split("://", 1)[1]]}]}
    if honor_labels:
        job["honor_labels"] = True
    return job


def query(url: str, promql: str) -> list[dict]:
    """The result vector of an instant query (raises on a PromQL error)."""
    response = httpx.get(f"{url}/api/v1/query", params={"query": promql}, timeout=10)
    body = response.json()
    if body.get("status") != "success":
        raise AssertionError(f"query failed: {promql}: {body.get('error')}")
    return body["data"]["result"]


def alerts(url: str) -> list[dict]:
    """Active alerts (pending and firing) as /api/v1/alerts lists them."""
    return httpx.get(f"{url}/api/v1/alerts", timeout=10).json()["data"]["alerts"]


def targets_up(url: str) -> dict[str, bool]:
    """job → whether its (single) target's last scrape succeeded."""
    active = httpx.get(f"{url}/api/v1/targets", timeout=10).json()["data"]["activeTargets"]
    return {t["labels"]["job"]: t["health"] == "up" for t in active}
