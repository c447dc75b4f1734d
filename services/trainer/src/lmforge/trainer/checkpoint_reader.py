"""Reading a DCP checkpoint without running code from it.

torch.distributed.checkpoint's FileSystemReader unpickles `.metadata`, and its default
planner torch.load()s non-tensor items (the optimizer's param groups) with
weights_only=False: whoever can write a checkpoint directory, or the bucket it is restored
from, could run code in the trainer and the exporter. Here `.metadata` goes through an
unpickler that resolves only the classes DCP's metadata is made of, non-tensor items go
through torch.load(weights_only=True) like the tensors already do, and every file the
metadata names must be a file of the checkpoint directory, whole.

A checkpoint that cannot be read raises CheckpointReadError (one line naming the file);
one that refers to anything but plain data raises UnsafeCheckpointError.
"""

from __future__ import annotations

import io
import pickle
import re
import warnings
from pathlib import Path, PurePosixPath

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import CheckpointException, DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint._traverse import set_element  # what DefaultLoadPlanner.load_bytes uses
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

from lmforge.common.errors import InputError, LmforgeError

METADATA_FILE = ".metadata"

_METADATA_MODULE = "torch.distributed.checkpoint.metadata"
# Every global a DCP `.metadata` pickle refers to (torch 2.x): its dataclasses, torch.Size,
# the layout constructor, and the checkpoint id (a path). Dtypes are checked by type below.
_ALLOWED = frozenset({
    *((_METADATA_MODULE, name) for name in (
        "Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata",
        "TensorProperties", "StorageMeta", "MetadataIndex", "_MEM_FORMAT_ENCODING")),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),  # returns one of torch's layout objects by name
    ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"),
    ("pathlib._local", "PosixPath"), ("pathlib._local", "PurePosixPath"),  # Python ≥ 3.13
})


class CheckpointReadError(InputError):
    """A checkpoint file that is missing, truncated or unreadable. `file` names it."""

    file: str = ""


class UnsafeCheckpointError(CheckpointReadError):
    """A checkpoint file that refers to code (a class or function outside the allow-list)."""


def checkpoint_error(file: Path | str, problem: str, cls: type[CheckpointReadError] = CheckpointReadError
                     ) -> CheckpointReadError:
    """`cls("FILE: problem")`, with `.file` set."""
    exc = cls(f"{file}: {problem}")
    exc.file = str(file)  # an attribute, not an argument: the error must pickle across ranks
    return exc


def _refused(file: Path | str, what: str) -> UnsafeCheckpointError:
    return checkpoint_error(file, f"refused to load: {what}, which no lmforge checkpoint contains "
                                  f"(a tampered checkpoint?)", UnsafeCheckpointError)


def first_line(exc: BaseException, limit: int = 200) -> str:
    lines = str(exc).strip().splitlines()
    text = lines[0] if lines else ""
    return f"{type(exc).__name__}: {text[:limit]}"


def load_error(file: Path, exc: Exception) -> CheckpointReadError:
    """What a failed torch.load(weights_only=True) of `file` means: refused code, or bad bytes."""
    refused = re.search(r"unsupported (?:global: )?GLOBAL (\S+)", str(exc), re.IGNORECASE)
    if refused:
        return _refused(file, f"it refers to {refused.group(1)}")
    return checkpoint_error(file, f"unreadable ({first_line(exc)})")


def _enum_member(cls, name):
    """What `builtins.getattr` may do in a `.metadata`: some Python versions (3.11.2, ≥ 3.12)
    pickle an enum member as getattr(EnumClass, "NAME"); nothing else is looked up."""
    from torch.distributed.checkpoint.metadata import _MEM_FORMAT_ENCODING

    if cls is _MEM_FORMAT_ENCODING and isinstance(name, str) and name in cls.__members__:
        return cls[name]
    raise pickle.UnpicklingError(f"getattr({getattr(cls, '__name__', type(cls).__name__)}, {name!r})")


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, file, path: Path):
        super().__init__(file)
        self._path = path

    def find_class(self, module: str, name: str):
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        if (module, name) == ("builtins", "getattr"):
            return self._checked_getattr
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise _refused(self._path, f"it refers to {module}.{name}")

    def _checked_getattr(self, obj, name):
        try:
            return _enum_member(obj, name)
        except pickle.UnpicklingError as exc:
            raise _refused(self._path, f"it looks up {exc}") from None

    def persistent_load(self, pid):
        raise _refused(self._path, "it holds a persistent id")


def read_metadata(path: Path) -> Metadata:
    """A checkpoint's `.metadata` (the file itself), through the allow-list."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise checkpoint_error(path, f"cannot be read ({exc.strerror or exc})") from None
    try:
        metadata = _MetadataUnpickler(io.BytesIO(data), path).load()
    except LmforgeError:
        raise
    except Exception as exc:  # truncated or garbage bytes: the unpickler's errors are many
        raise checkpoint_error(path, f"not readable DCP metadata ({first_line(exc)})") from None
    if not isinstance(metadata, Metadata) or not isinstance(metadata.storage_data, dict):
        raise checkpoint_error(path, f"not DCP metadata (a {type(metadata).__name__})")
    for info in metadata.storage_data.values():
        name = getattr(info, "relative_path", None)
        if not isinstance(info, _StorageInfo) or not isinstance(name, str) \
                or PurePosixPath(name).name != name or name in ("", ".", ".."):
            raise _refused(path, f"a storage entry outside the checkpoint directory ({info!r})")
        if info.transform_descriptors:  # lmforge never writes compressed or transformed items
            raise _refused(path, f"storage transforms {info.transform_descriptors}")
        if not all(isinstance(n, int) and n >= 0 for n in (info.offset, info.length)):
            raise checkpoint_error(path, f"not DCP metadata (a storage entry {info!r})")
    return metadata


class SafeFileSystemReader(FileSystemReader):
    """FileSystemReader with `.metadata` read through the allow-list (once: `verify` reads and
    checks it before DCP is called, and DCP gets that same object), and every data file
    checked to exist and be long enough before anything is read from it."""

    def __init__(self, path: str | Path):
        super().__init__(path)
        self.directory = Path(path)
        self._metadata: Metadata | None = None
        self._reading: str | None = None

    def verify(self) -> Metadata:
        if self._metadata is None:
            metadata = read_metadata(self.directory / METADATA_FILE)
            ends: dict[str, int] = {}
            for info in metadata.storage_data.values():
                ends[info.relative_path] = max(ends.get(info.relative_path, 0), info.offset + info.length)
            for name, end in sorted(ends.items()):
                file = self.directory / name
                if not file.is_file():
                    raise checkpoint_error(file, "missing (the checkpoint metadata lists it)")
                if (size := file.stat().st_size) < end:
                    raise checkpoint_error(file, f"truncated: {size} bytes, the metadata needs {end}")
            self._metadata = metadata
        return self._metadata

    def read_metadata(self, *args, **kwargs) -> Metadata:
        if kwargs.get("rank") is not None:  # DCP's per-rank fallback: lmforge writes one global file
            raise checkpoint_error(self.directory / METADATA_FILE, "missing")
        metadata = self.verify()
        if metadata.storage_meta is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def _slice_file(self, file, sinfo: _StorageInfo):
        self._reading = sinfo.relative_path
        return super()._slice_file(file, sinfo)

    def read_data(self, plan, planner):
        try:
            return super().read_data(plan, planner)
        except LmforgeError:
            raise
        except Exception as exc:
            raise load_error(self.directory / (self._reading or ""), exc) from None


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default planner, but non-tensor items are plain data only (weights_only)."""

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        obj = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


def load_state(state: dict, reader: SafeFileSystemReader, *, no_dist: bool = False) -> None:
    """dcp.load into `state` (collective when a process group exists: DCP makes every rank
    raise if any rank fails), with DCP's multi-rank exception reduced to our one-line error.
    no_dist: this process alone reads every shard, even inside a process group (the trainer's
    rank 0 consolidating a weights package beside training)."""
    reader.verify()  # before DCP, which would log the failure with a traceback and try other files
    try:
        with warnings.catch_warnings():  # the exporter loads in one process, as it means to
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load(state, storage_reader=reader, planner=SafeLoadPlanner(), no_dist=no_dist)
    except CheckpointException as exc:
        failures = [failure[0] if isinstance(failure, tuple) else failure for failure in exc.failures.values()]
        for failure in failures:
            if isinstance(failure, LmforgeError):
                raise failure from None
        first = failures[0] if failures else exc
        raise checkpoint_error(reader.directory, f"cannot be loaded ({first_line(first)})") from None
