"""Prometheus and the Pushgateway (the Debian packages) on loopback: their command lines and
config, and the HTTP API calls the demo and the tests make to them."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import yaml

PROMETHEUS = "/usr/bin/prometheus"
PUSHGATEWAY = "/usr/bin/prometheus-pushgateway"


def binary(default: str, name: str) -> str:
    found = default if Path(default).exists() else shutil.which(name)
    if not found:
        raise FileNotFoundError(f"{name} not found (install the Debian package {name}: `make setup`)")
    return found


def pushgateway_command(port: int) -> list[str]:
    """Metrics kept in memory only (Debian's default persists them under /var/lib/prometheus)."""
    return [binary(PUSHGATEWAY, "prometheus-pushgateway"), f"--web.listen-address=127.0.0.1:{port}",
            "--persistence.file=", "--log.level=warn"]


def prometheus_command(workdir: Path, port: int, scrape_configs: list[dict], rule_files: list[Path] = (),
                       interval: str = "1s") -> list[str]:
    """Writes WORKDIR/prometheus.yml (scraping and evaluating every `interval`); the TSDB goes to
    WORKDIR/tsdb (Debian's default is /var/lib/prometheus)."""
    config = {"global": {"scrape_interval": interval, "evaluation_interval": interval},
              "rule_files": [str(p) for p in rule_files], "scrape_configs": scrape_configs}
    config_path = workdir / "prometheus.yml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    return [binary(PROMETHEUS, "prometheus"), f"--config.file={config_path}",
            f"--storage.tsdb.path={workdir / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"]


def static_job(name: str, url: str, honor_labels: bool = False, path: str = "/metrics") -> dict:
    """A scrape job for one loopback target given by its base URL."""
    job = {"job_name": name, "metrics_path": path, "static_configs": [{"targets": [url.split("://", 1)[1]]}]}
    if honor_labels:
        job["honor_labels"] = True
    return job


def _api(url: str, path: str, params: dict) -> list[dict]:
    body = httpx.get(f"{url}{path}", params=params, timeout=10).json()
    if body.get("status") != "success":
        raise RuntimeError(f"query failed: {params.get('query')}: {body.get('error')}")
    return body["data"]["result"]


def query(url: str, promql: str) -> list[dict]:
    """The result vector of an instant query (raises on a PromQL error)."""
    return _api(url, "/api/v1/query", {"query": promql})


def query_range(url: str, promql: str, start: float, end: float, step: float) -> list[dict]:
    """The result matrix of a range query, as a Grafana panel asks for it."""
    return _api(url, "/api/v1/query_range", {"query": promql, "start": start, "end": end, "step": step})


def alerts(url: str) -> list[dict]:
    """Active alerts (pending and firing) as /api/v1/alerts lists them."""
    return httpx.get(f"{url}/api/v1/alerts", timeout=10).json()["data"]["alerts"]


def targets_up(url: str) -> dict[str, bool]:
    """job → whether its (single) target's last scrape succeeded."""
    active = httpx.get(f"{url}/api/v1/targets", timeout=10).json()["data"]["activeTargets"]
    return {t["labels"]["job"]: t["health"] == "up" for t in active}
