"""A set of generated WET files in one place (a directory or an s3:// prefix), named in order:
the inputs the data pipeline's crawl "sample" reads from <output>/wet/, which no service image
can generate (the generator is in none of them)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from lmforge.common.storage import open_store
from lmforge.common.store import local_path_of, scheme_of
from lmforge.sample_data.wet import SampleSummary, write_sample_wet


def sample_file_name(index: int) -> str:
    return f"sample-{index:05d}.warc.wet.gz"


def write_sample_inputs(dest: str | Path, files: int, docs: int, seed: int = 0) -> list[tuple[str, SampleSummary]]:
    """`files` WET files of `docs` documents each under `dest`, file i generated with seed
    `seed + i`; returns each file's URI and summary."""
    if files < 1:
        raise ValueError(f"files must be at least 1, got {files}")
    dest = str(dest)
    names = [sample_file_name(i) for i in range(files)]
    if scheme_of(dest) in ("", "file"):
        root = local_path_of(dest)
        root.mkdir(parents=True, exist_ok=True)
        return [(str(root / name), write_sample_wet(root / name, docs, seed + i)) for i, name in enumerate(names)]
    store = open_store(dest)
    written = []
    with tempfile.TemporaryDirectory(prefix="lmforge-sample-") as tmp:
        for i, name in enumerate(names):
            summary = write_sample_wet(Path(tmp) / name, docs, seed + i)
            with store.open_write(name) as out, open(Path(tmp) / name, "rb") as src:
                shutil.copyfileobj(src, out, 1 << 20)
            written.append((store.join(name), summary))
    return written
