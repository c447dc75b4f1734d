from collections import Counter

from prometheus_client import generate_latest

from lmforge.dataprep.metrics import DataprepMetrics
from lmforge.dataprep.stats import StepStats


def test_counters_follow_design_names():
    metrics = DataprepMetrics()
    samples = [line for line in generate_latest(metrics.registry).decode().splitlines() if not line.startswith("#")]
    assert samples == []  # nothing recorded yet: no series at all, not zeros
    metrics.record([StepStats("langid", docs_in=10, docs_out=7, bytes_in=1000,
                              dropped=Counter({"language_not_kept": 3}))])
    text = generate_latest(metrics.registry).decode()
    assert 'lmforge_dataprep_documents_total{outcome="dropped",stage="langid"} 3.0' in text
    assert 'lmforge_dataprep_documents_total{outcome="kept",stage="langid"} 7.0' in text
    assert 'lmforge_dataprep_bytes_total{stage="langid"} 1000.0' in text
    assert 'lmforge_dataprep_dropped_documents_total{reason="language_not_kept",stage="langid"} 3.0' in text


def test_worker_pushes_its_counters_to_a_pushgateway(tmp_path):
    """A real HTTP push (prometheus_client's client) to a loopback receiver."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from lmforge.sample_data.wet import write_sample_wet
    from tests.dataprep.helpers import run_cli

    pushes = []

    class Receiver(BaseHTTPRequestHandler):
        def do_PUT(self):  # noqa: N802 - http.server's naming
            pushes.append((self.path, self.rfile.read(int(self.headers["Content-Length"])).decode()))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        inputs = []
        for seed in (1, 2):
            inputs.append(tmp_path / f"in{seed}.warc.wet.gz")
            write_sample_wet(inputs[-1], 60, seed)
        gateway = f"127.0.0.1:{server.server_port}"
        unreadable = "http://127.0.0.1:9/missing.warc.wet.gz"  # (a missing local path is refused up front)
        assert run_cli("run", "--input", *inputs, unreadable, "--output", tmp_path / "out", "--worker-index", 0,
                       "--num-workers", 2, "--pushgateway", gateway, "--set", "reader.open_attempts=1") == 0
    finally:
        server.shutdown()
    assert len(pushes) == 1
    path, body = pushes[0]
    assert path == "/metrics/job/lmforge-dataprep/worker/0"
    assert 'lmforge_dataprep_documents_total{outcome="in",stage="read"} 60.0' in body
    assert 'lmforge_dataprep_worker_failures_total{phase="inputs"} 1.0' in body  # the missing input
