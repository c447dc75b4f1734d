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

from lmforge.common.atomic_files import atomic_write_bytes
from lmforge.demo.chart import rule_file
from lmforge.demo.config import ObserveSection
from lmforge.demo.dashboards_page import fetch, render_page
from lmforge.demo.processes import Supervisor, wait_http_ok
from lmforge.demo.prometheus import prometheus_command, pushgateway_command, static_job


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
    page: str | None = None  # the panels drawn as one HTML page


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


def check_dashboards(monitoring: Monitoring, observe: ObserveSection, settle_seconds: float = 0,
                     page: Path | None = None) -> DashboardCheck:
    """Every panel query of the chart's dashboards over [start of monitoring, now]; with `page`,
    the panels drawn from those answers as one HTML page (lmforge.demo.dashboards_page)."""
    time.sleep(settle_seconds)  # one more scrape and rule evaluation of what just happened
    end = time.time()
    span = max(end - monitoring.started, 60.0)
    macros = {"__rate_interval": observe.rate_window, "__interval": "5s", "__range": f"{int(span)}s"}
    step = max(span / 200, 1.0)
    dashboards = fetch(monitoring.prometheus, end - span, end, step, **macros)
    check, errors = DashboardCheck(), []
    for dashboard in dashboards:
        for panel in dashboard.panels:
            name = f"{dashboard.name} / {panel.title}"
            for target in panel.targets:
                if panel.requires == "gpu":
                    check.gpu_only.append(name)
                elif target.error:
                    errors.append(f"{name}: {target.error}")
                elif target.series:
                    check.with_data.append(name)
                else:
                    check.empty.append(f"{name}: {target.expr}")
    if page is not None:  # written first: it shows a failed query on its panel
        atomic_write_bytes(page, render_page(dashboards, prometheus=monitoring.prometheus, start=end - span,
                                             end=end, step=step).encode("utf-8"))
        check.page = str(page)
    if errors:
        raise RuntimeError("dashboard queries failed: " + "; ".join(errors))
    return check
