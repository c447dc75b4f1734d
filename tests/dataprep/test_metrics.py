from collections import Counter

from prometheus_client import generate_latest

from lmforge.dataprep.metrics import DataprepMetrics
from lmforge.dataprep.stats import StepStats


def test_counters_follow_design_names():
    metrics = DataprepMetrics()
    metrics.record([StepStats("langid", docs_in=10, docs_out=7, bytes_in=1000,
                              dropped=Counter({"language_not_kept": 3}))])
    text = generate_latest(metrics.registry).decode()
    assert 'lmforge_dataprep_documents_total{outcome="dropped",stage="langid"} 3.0' in text
    assert 'lmforge_dataprep_documents_total{outcome="kept",stage="langid"} 7.0' in text
    assert 'lmforge_dataprep_bytes_total{stage="langid"} 1000.0' in text
    assert 'lmforge_dataprep_dropped_documents_total{reason="language_not_kept",stage="langid"} 3.0' in text
