"""Steps 3 and 6: Prometheus and the Pushgateway on loopback, started before the data pipeline so
they see every service while it runs; at the end, every dashboard panel's query asked the way
Grafana asks it (a range query over the demo's time span) must return data.

Prometheus gets the chart's own rule file (its rules ConfigMap, rendered with a rate window short
enough for a demo) and one scrape job per service under the job names the chart's ServiceMonitor
and PodMonitors give them (lmforge-inference, lmforge-trainer, lmforge-uploader), plus the
Pushgateway with honor_labels, as the chart's Prometheus values configure it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from lmforge.demo.chart import rule_file
from lmforge.demo.config import ObserveSection
from lmforge.demo.dashboards import dashboard_queries, load_dashboards
from lmforge.demo.processes import Supervisor, wait_http_ok
from lmforge.demo.prometheus import prometheus_command, pushgateway_command, query_range, static_job


@dataclass
class Monitoring:
    prometheus: str
    pushgateway: str
    started: float  # unix time


@dataclass
class DashboardCheck:
    with_data: list[str] = field(default_factory=list)  # "dashboard / panel"
    empty: list[str] = field(default_factory=list)  # "dashboard / panel: expression"
    gpu_only: list[str] = field(default_factory=list)  # not asked: no GPU here


def start_monitoring(supervisor: Supervisor, observe: ObserveSection, out: Path, ports: dict[str, int]) -> Monitoring:
    """`ports`: prometheus, pushgateway, and the /metrics ports of inference, trainer and uploader."""
    out.mkdir(parents=True, exist_ok=True)
    gateway = f"http://127.0.0.1:{ports['pushgateway']}"
    process = supervisor.start("pushgateway", pushgateway_command(ports["pushgateway"]))
    wait_http_ok(f"{gateway}/-/ready", process, "the Pushgateway", timeout=60)

    rules = out / "lmforge.rules.yaml"
    rules.write_text(rule_file({"monitoring": {"rateWindow": observe.rate_window}}))
    jobs = [static_job("lmforge-inference", f"http://127.0.0.1:{ports['inference']}"),
            static_job("lmforge-trainer", f"http://127.0.0.1:{ports['trainer']}"),
            static_job("lmforge-uploader", f"http://127.0.0.1:{ports['uploader']}"),
            static_job("pushgateway", gateway, honor_labels=True)]
    command = prometheus_command(out, ports["prometheus"], jobs, [rules], observe.scrape_interval)
    process = supervisor.start("prometheus", command)
    prometheus = f"http://127.0.0.1:{ports['prometheus']}"
    wait_http_ok(f"{prometheus}/-/ready", process, "Prometheus", timeout=60)
    return Monitoring(prometheus, gateway, time.time())


def check_dashboards(monitoring: Monitoring, observe: ObserveSection, settle_seconds: float = 0) -> DashboardCheck:
    """Every panel query of the chart's dashboards over [start of monitoring, now]."""
    time.sleep(settle_seconds)  # one more scrape and rule evaluation of what just happened
    end = time.time()
    span = max(end - monitoring.started, 60.0)
    check = DashboardCheck()
    for name, dashboard in load_dashboards().items():
        macros = {"__rate_interval": observe.rate_window, "__interval": "5s", "__range": f"{int(span)}s"}
        for title, expr, requires in dashboard_queries(dashboard, **macros):
            panel = f"{name} / {title}"
            if requires == "gpu":
                check.gpu_only.append(panel)
            elif query_range(monitoring.prometheus, expr, end - span, end, step=max(span / 200, 1.0)):
                check.with_data.append(panel)
            else:
                check.empty.append(f"{panel}: {expr}")
    return check
