"""Streaming row writes into a Store (Parquet, or Arrow IPC for files that are later
memory-mapped): rows are buffered in small groups so memory stays bounded, and the file
appears atomically when the writer closes cleanly."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from lmforge.common.local_store import LocalStore
from lmforge.common.store import Store

DOC_SCHEMA = pa.schema(
    [
        ("doc_id", pa.uint64()),
        ("url", pa.string()),
        ("text", pa.string()),
        ("content_sha256", pa.string()),
        ("language", pa.string()),
        ("language_score", pa.float32()),
        ("warc_date", pa.string()),
        ("scores", pa.map_(pa.string(), pa.float64())),  # the scoring steps' scores, for later mixing
        ("record_id", pa.string()),  # WARC-Record-ID (last: files written before it lack the column)
    ]
)
REJECT_SCHEMA = pa.schema([("url", pa.string()), ("stage", pa.string()), ("reason", pa.string()),
                           ("doc_id", pa.uint64()), ("text_preview", pa.string())])
LINEAGE_SCHEMA = pa.schema(
    [
        ("doc_id", pa.string()),
        ("url", pa.string()),
        ("content_sha256", pa.string()),
        ("shard", pa.string()),
        ("token_offset", pa.uint64()),
        ("token_count", pa.uint64()),
        # WARC-Record-ID; last and nullable, so lineage written before it still reads (read_lineage: "")
        ("record_id", pa.string()),
    ]
)


class ParquetRowWriter:
    def __init__(self, store: Store, rel: str, schema: pa.Schema, row_group_rows: int = 2000):
        self._init(store, rel, schema, row_group_rows)

    def _open_writer(self, fh):
        return pq.ParquetWriter(fh, self.schema, compression="zstd")

    def _init(self, store: Store, rel: str, schema: pa.Schema, row_group_rows: int) -> None:
        self.schema = schema
        self.row_group_rows = row_group_rows
        self._columns: dict[str, list[Any]] = {name: [] for name in schema.names}
        self._pending = 0
        self.rows = 0
        self._ctx = store.open_write(rel)
        self._fh = self._ctx.__enter__()
        self._writer = self._open_writer(self._fh)

    def add(self, row: dict[str, Any]) -> None:
        for name, values in self._columns.items():
            values.append(row[name])
        self._pending += 1
        self.rows += 1
        if self._pending >= self.row_group_rows:
            self._flush()

    def _flush(self) -> None:
        if self._pending:
            self._writer.write_table(pa.table(self._columns, schema=self.schema))
            self._columns = {name: [] for name in self.schema.names}
            self._pending = 0

    def close(self) -> None:
        self._flush()
        self._writer.close()
        self._ctx.__exit__(None, None, None)

    def abort(self, exc: BaseException) -> None:
        try:
            self._writer.close()
        finally:
            self._ctx.__exit__(type(exc), exc, exc.__traceback__)

    def __enter__(self) -> ParquetRowWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc is None:
            self.close()
        else:
            self.abort(exc)


class ArrowRowWriter(ParquetRowWriter):
    """Uncompressed Arrow IPC: readers memory-map it and take rows without loading it."""

    def _open_writer(self, fh):
        return pa.ipc.new_file(pa.PythonFile(fh, mode="w"), self.schema)


def open_arrow(store: Store, rel: str) -> pa.Table:
    """An Arrow IPC file's table: a memory-mapped, zero-copy view of a local file; a remote one is
    read by ranges into memory (one input's index), leaving no local copy behind."""
    if isinstance(store, LocalStore):
        return pa.ipc.open_file(pa.memory_map(str(store.local_path(rel)))).read_all()
    with store.open_read(rel) as fh:
        return pa.ipc.open_file(fh).read_all()


def iter_batches(store: Store, rel: str, columns: list[str] | None = None, batch_rows: int = 2000,
                 optional: tuple[str, ...] = ()) -> Iterator[pa.RecordBatch]:
    """The file's rows in batches. A column in `optional` that the file lacks (written before the
    column was added) is left out of the batches rather than refused."""
    with store.open_read(rel) as fh:  # a remote file is read by ranges, not downloaded
        parquet = pq.ParquetFile(fh)
        if columns is not None and optional:
            names = set(parquet.schema_arrow.names)
            columns = [c for c in columns if c in names or c not in optional]
        yield from parquet.iter_batches(batch_size=batch_rows, columns=columns)


def column_or_default(batch: pa.RecordBatch | pa.Table, name: str, default) -> list:
    """A column as a list, nulls as `default`; every row `default` when the batch lacks the column."""
    if name not in batch.schema.names:
        return [default] * batch.num_rows
    return [default if value is None else value for value in batch.column(name).to_pylist()]


def read_lineage(store: Store, rel: str) -> pa.Table:
    """A lineage file with every LINEAGE_SCHEMA column: record_id "" where the file predates it."""
    with store.open_read(rel) as fh:
        table = pq.read_table(fh)
    record_ids = pa.array(column_or_default(table, "record_id", ""), pa.string())
    if "record_id" in table.schema.names:
        table = table.drop_columns(["record_id"])
    return table.append_column("record_id", record_ids).select(LINEAGE_SCHEMA.names)
