"""The split stages' work as task lists: one task per input (inputs, tokenize), per dedup
partition or per shard partition (shards, trace-index; combine.py and components.py build their
own). A task is a small picklable value that names its completion marker and runs against a store
and a config; it holds nothing else, so any process can run it.

A phase's list is built once, from the run's recorded inputs and config, in the same order
everywhere: a local run hands the pending tasks to an executor (executor.py), and an Indexed-Job
pod or KFP ParallelFor worker with index k of n runs tasks[i] for i in
stage_runs.worker_slice(len(tasks), k, n)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from lmforge.common.store import Store
from lmforge.dataprep import layout
from lmforge.dataprep.config import DataprepConfig
from lmforge.dataprep.dedup_global import PartitionPlan, group_partition
from lmforge.dataprep.shard_writer import partitions, write_partition_shards
from lmforge.dataprep.tokenize import tokenize_input
from lmforge.dataprep.trace_index import build_trace_partition, index_partitions
from lmforge.dataprep.worker import InputResult, process_input


class Task(Protocol):
    @property
    def done_marker(self) -> str:
        """The file (relative to the output) that exists once the task is complete."""
        ...

    def run(self, store: Store, config: DataprepConfig) -> Any: ...


@dataclass(frozen=True)
class InputTask:
    """The per-input stage of one input: read → filters → MinHash signatures (worker.py)."""

    uri: str
    index: int

    @property
    def done_marker(self) -> str:
        return layout.input_done(self.index)

    def run(self, store: Store, config: DataprepConfig) -> InputResult:
        return process_input(store, config, self.uri, self.index)


@dataclass(frozen=True)
class PartitionTask:
    """The duplicate edges of one dedup partition across every input (dedup_global.py)."""

    n_inputs: int
    partition: int

    @property
    def done_marker(self) -> str:
        return layout.edges(self.partition)

    def run(self, store: Store, config: DataprepConfig) -> int:
        return group_partition(store, config.minhash, self.n_inputs, self.partition)


@dataclass(frozen=True)
class TokenizeTask:
    """The tokens of one input's kept documents, less those dedup removed (tokenize.py)."""

    tokenizer_info: dict
    index: int

    @property
    def done_marker(self) -> str:
        return layout.tokenize_done(self.index)

    def run(self, store: Store, config: DataprepConfig) -> dict:
        return tokenize_input(store, config, self.tokenizer_info, self.index)


@dataclass(frozen=True)
class ShardTask:
    """The shards of one shard partition: its inputs' tokens, shuffled together (shard_writer.py)."""

    tokenizer_info: dict
    partition: int
    first_input: int
    stop_input: int

    @property
    def done_marker(self) -> str:
        return layout.shard_entries(self.partition)

    def run(self, store: Store, config: DataprepConfig) -> dict:
        inputs = range(self.first_input, self.stop_input)
        return write_partition_shards(store, config, self.tokenizer_info, self.partition, inputs)


@dataclass(frozen=True)
class TraceIndexTask:
    """The trace index of one group of shard partitions' shards (trace_index.py)."""

    tokenizer_info: dict
    partition: int
    shard_partitions: range

    @property
    def done_marker(self) -> str:
        return layout.trace_entry(self.partition)

    def run(self, store: Store, config: DataprepConfig) -> dict:
        return build_trace_partition(store, config, self.tokenizer_info, self.partition, self.shard_partitions)


def input_tasks(inputs: list[str]) -> list[InputTask]:
    return [InputTask(uri, i) for i, uri in enumerate(inputs)]


def partition_tasks(config: DataprepConfig, n_inputs: int) -> list[PartitionTask]:
    return [PartitionTask(n_inputs, p) for p in range(PartitionPlan.from_config(config.minhash).count)]


def tokenize_tasks(tokenizer_info: dict, n_inputs: int) -> list[TokenizeTask]:
    return [TokenizeTask(tokenizer_info, i) for i in range(n_inputs)]


def shard_tasks(config: DataprepConfig, tokenizer_info: dict, n_inputs: int) -> list[ShardTask]:
    return [ShardTask(tokenizer_info, p, inputs.start, inputs.stop)
            for p, inputs in enumerate(partitions(n_inputs, config.shards.inputs_per_partition))]


def trace_index_tasks(config: DataprepConfig, tokenizer_info: dict, n_inputs: int) -> list[TraceIndexTask]:
    """One task per index partition; none when trace_index is disabled."""
    return [TraceIndexTask(tokenizer_info, i, shard_partitions)
            for i, shard_partitions in enumerate(index_partitions(config, n_inputs))]
