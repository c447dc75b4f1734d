"""The scaling benchmark's own parts (bench/dataprep_scaling.py, task_launcher.py, scale_model.py):
the corpus it splits, the memory and disk it attributes to a task, and docs/scaling.md's tables
being what the scale model computes from the inputs recorded with them."""

import gzip
import importlib.util
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]


def _bench(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", REPO / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_corpus_is_split_into_readable_wet_files_of_consecutive_records(tmp_path):
    scaling = _bench("dataprep_scaling")
    paths = scaling.split_corpus(0.2, 3, seed=7, out=tmp_path)
    whole = gzip.decompress(next(tmp_path.glob("scaling-*.warc.wet.gz")).read_bytes())
    parts = [gzip.decompress(p.read_bytes()) for p in paths]
    assert len(paths) == 3 and all(p.startswith(b"WARC/1.0") for p in parts)
    info_end = whole.index(b"WARC/1.0", 1)  # each part repeats the warcinfo record, then its own records
    assert all(p.startswith(whole[:info_end]) for p in parts)
    assert b"".join(p[info_end:] for p in parts) == whole[info_end:]
    assert scaling.split_corpus(0.2, 3, seed=7, out=tmp_path) == paths  # cached


def test_the_launcher_reports_the_commands_own_peak_memory_and_temp_disk(tmp_path):
    """Not the peak of the process that asked for it (this one holds 400 MB while it waits)."""
    scaling = _bench("dataprep_scaling")
    held = bytearray(400 << 20)
    held[:: 4096] = b"x" * len(held[:: 4096])
    child = ("import os, time\nblock = bytearray(96 << 20); block[::4096] = b'y' * len(block[::4096])\n"
             "open(os.path.join(os.environ['TMPDIR'], 'spool'), 'wb').write(os.urandom(3 << 20))\ntime.sleep(0.5)")
    launcher = scaling.Launcher()
    try:
        result = launcher.run([sys.executable, "-c", child], {"PATH": "/usr/bin:/bin"}, tmp_path / "log",
                              tmp_path, 0.02)
    finally:
        launcher.close()
    assert 96 << 20 <= result["peak_rss_bytes"] < 250 << 20, result
    assert result["peak_tmpdir_bytes"] >= 3 << 20, result
    assert not list(tmp_path.glob("task-*")), "the task's TMPDIR is removed afterwards"
    del held


def test_the_scaling_doc_tables_are_what_the_scale_model_computes():
    model = _bench("scale_model")
    assert model.check((REPO / "docs" / "scaling.md").read_text()), \
        "docs/scaling.md's tables were edited by hand: rerun bench/scale_model.py --write docs/scaling.md"


def test_the_scale_model_counts_the_tasks_the_pipeline_plans():
    """The partitions, combine ranges and input groups the model uses are what the code chooses for
    the same inputs (dedup_plan.choose_counts) and the task lists the stages build from them."""
    from lmforge.dataprep.combine import combine_tasks
    from lmforge.dataprep.config import DataprepConfig, MinHashConfig
    from lmforge.dataprep.dedup_global import PartitionPlan
    from lmforge.dataprep.dedup_plan import choose_counts

    model = _bench("scale_model")
    for n_inputs, size in ((90_000, 111e6), (3_000, 40e6), (300, 2e9)):
        counts = model.code_counts(n_inputs, size)
        chosen = choose_counts(MinHashConfig(), counts["bands"], [int(size)] * n_inputs)
        assert (counts["ppb"], counts["combine_partitions"]) == (chosen["partitions_per_band"],
                                                                  chosen["combine_partitions"])
        config = DataprepConfig.model_validate({"minhash": {"partitions_per_band": counts["ppb"],
                                                            "combine_partitions": counts["combine_partitions"]}})
        assert counts["partitions"] == PartitionPlan.from_config(config.minhash).count
        assert counts["groups"] * counts["ranges"] == len(combine_tasks(config, n_inputs))


def test_the_scale_model_sizes_key_files_as_the_pipeline_writes_them():
    """Per document: a 24-byte (doc id, key, row) triple in every key column's section and its
    num_perm uint32 signature in every band's; a header of P + 2 words."""
    from lmforge.dataprep import dedup_keys

    model = _bench("scale_model")
    bands, num_perm, docs, slices = 3, 16, 10, 2
    rng = np.random.default_rng(0)
    keys = rng.integers(0, 2**63, size=(docs, bands + 2), dtype=np.uint64)
    signatures = rng.integers(0, 2**32, size=(docs, num_perm), dtype=np.uint32)
    sections = [(column, key_slice) for column in range(bands + 2) for key_slice in range(slices)]
    blob = dedup_keys.encode_keys(np.arange(docs, dtype=np.uint64), keys, sections, slices, signatures,
                                  signed=bands * slices)
    assert len(blob) == 8 * (len(sections) + 2) + docs * model.key_row_bytes(bands, num_perm)
