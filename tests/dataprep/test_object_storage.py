"""Data prep with an object store end to end: inputs streamed from s3:// and https:// (a real TLS
server sending the WET file slowly, in chunks), every intermediate and output written to moto's S3
server, and the run's local disk (TMPDIR, sampled while it runs) bounded by a small multiple of one
input's partition, never the whole corpus; the shards are byte-identical to a local-output run's.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import json
import os
import re
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from lmforge.common.storage import open_store
from lmforge.common.store import Store
from lmforge.dataprep.config import DataprepConfig
from lmforge.dataprep.executor import InlineExecutor, PoolExecutor
from lmforge.sample_data.wet import write_sample_wet
from tests.s3_server import make_bucket
from tests.shard_listing import listed_shards

N_INPUTS = 5  # four on S3, one over https
DOCS = 60
SMALL = ["--set", "tokenizer.vocab_size=600", "--set", "shards.val_fraction=0.1",
         "--set", "shards.shard_tokens=4096"]
LOCAL_DISK_FACTOR = 3  # peak TMPDIR bytes ≤ this × the largest input's partition (its WET + its files)
BUCKET = "lmf-objects"
LIMITED = ("import resource, runpy, signal, sys; limit = int(sys.argv.pop(1)); "
           "resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)); signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
           "sys.argv[0] = 'lmforge-dataprep'; runpy.run_module('lmforge.dataprep', run_name='__main__')")


# ------------------------------------------------------------------ a slow https server


def self_signed_cert(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 (the child trusts it through SSL_CERT_FILE) and its key."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


def process_tree(root: int) -> list[int]:
    """`root` and every process descended from it."""
    parents = {}
    for entry in os.listdir("/proc"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            parents[int(entry)] = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
    tree = [root]
    for pid in tree:
        tree.extend(child for child, parent in parents.items() if parent == pid)
    return tree


def files_under(directory: Path, pids: list[int]) -> list[str]:
    """The files under `directory`, and those the processes hold open there (deleted ones too:
    a TemporaryFile has no name in the directory)."""
    found = [str(p) for p in directory.rglob("*")]
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(f"{directory}/"):
                        found.append(f"/proc/{pid}/fd/{fd}")
    return found


class SlowWetServer(ThreadingHTTPServer):
    """Serves one file at /<name> with chunked transfer encoding (no Content-Length: the reader
    cannot size it up front), a pause before each chunk; before each chunk it looks in the
    client's TMPDIR (`watched`: the directory and the client processes' open files) for a staged
    copy of the file: one that starts with the file's first bytes, or with the decompressed WARC."""

    daemon_threads = True

    def __init__(self, name: str, data: bytes, context: ssl.SSLContext):
        super().__init__(("127.0.0.1", 0), ChunkedHandler)
        self.name, self.data = name, data
        self.socket = context.wrap_socket(self.socket, server_side=True)
        self.watched: tuple[Path, int] | None = None  # TMPDIR, the client's pid
        self.staged: list[str] = []
        self.chunks_sent = 0

    def look_for_staged_copies(self) -> None:
        if self.watched is None:
            return
        directory, pid = self.watched
        for path in files_under(directory, process_tree(pid)):
            try:
                with open(path, "rb") as fh:
                    head = os.pread(fh.fileno(), 64, 0)
            except (IsADirectoryError, FileNotFoundError, PermissionError):
                continue
            if head and (head == self.data[: len(head)] or head.startswith(b"WARC/")):
                self.staged.append(path)


class ChunkedHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: SlowWetServer
    CHUNK = 2048

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        if self.path != f"/{self.server.name}":
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        data = self.server.data
        for start in range(0, len(data), self.CHUNK):
            time.sleep(0.002)
            self.server.look_for_staged_copies()
            chunk = data[start : start + self.CHUNK]
            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            self.server.chunks_sent += 1
        self.wfile.write(b"0\r\n\r\n")


@pytest.fixture(scope="module")
def https_input(tmp_path_factory):
    directory = tmp_path_factory.mktemp("https")
    cert, key = self_signed_cert(directory)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    path = directory / "web.warc.wet.gz"
    write_sample_wet(path, DOCS, 100)
    server = SlowWetServer(path.name, path.read_bytes(), context)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield server, f"https://127.0.0.1:{server.server_address[1]}/{path.name}", cert
    server.shutdown()
    server.server_close()


# ------------------------------------------------------------------ the runs


class DiskSampler:
    """The peak of the bytes under `root`, sampled every few milliseconds in a thread."""

    def __init__(self, root: Path):
        self.root, self.peak = root, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            total = 0
            for directory, _, names in os.walk(self.root):
                for name in names:
                    try:
                        total += os.stat(os.path.join(directory, name)).st_size
                    except FileNotFoundError:
                        continue
            self.peak = max(self.peak, total)
            self._stop.wait(0.005)

    def __enter__(self) -> DiskSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def child_env(s3_endpoint: str, tmpdir: Path, cert: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    return {**env, "TMPDIR": str(tmpdir), "SSL_CERT_FILE": str(cert), "OMP_NUM_THREADS": "1",
            "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": s3_endpoint, "LMFORGE_S3_ANONYMOUS": "0"}


def dataprep(env: dict, *args, limit: int | None = None, started=lambda pid: None) -> subprocess.CompletedProcess:
    """The CLI in a child process; `started` gets its pid."""
    prefix = ["-c", LIMITED, str(limit)] if limit else ["-m", "lmforge.dataprep"]
    with subprocess.Popen([sys.executable, *prefix, *map(str, args)], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, env=env) as child:
        started(child.pid)
        stdout, stderr = child.communicate(timeout=600)
    return subprocess.CompletedProcess(child.args, child.returncode, stdout, stderr)


@pytest.fixture(scope="module")
def corpus(s3_endpoint, https_input, tmp_path_factory) -> dict:
    """The inputs (four WET files in the bucket, one over https) and their sizes."""
    _, url, _ = https_input
    client = make_bucket(s3_endpoint, BUCKET)
    directory = tmp_path_factory.mktemp("wet")
    sizes = {url: len(https_input[0].data)}
    for i in range(N_INPUTS - 1):
        path = directory / f"in-{i}.warc.wet.gz"
        write_sample_wet(path, DOCS, i + 1)
        client.upload_file(str(path), BUCKET, f"crawl/{path.name}")
        sizes[f"s3://{BUCKET}/crawl/{path.name}"] = path.stat().st_size
    return {"client": client, "patterns": [f"s3://{BUCKET}/crawl/*.warc.wet.gz", url], "sizes": sizes}


@pytest.fixture(scope="module")
def s3_run(s3_endpoint, https_input, corpus, tmp_path_factory) -> dict:
    """`lmforge-dataprep run` with an s3:// output and a fresh TMPDIR, its local disk sampled."""
    server, _, cert = https_input
    tmpdir = tmp_path_factory.mktemp("tmpdir")
    server.staged, server.chunks_sent = [], 0

    def watch(pid: int) -> None:
        server.watched = tmpdir, pid

    with DiskSampler(tmpdir) as sampler:
        done = dataprep(child_env(s3_endpoint, tmpdir, cert), "run", "--input", *corpus["patterns"],
                        "--output", f"s3://{BUCKET}/prepared", "--workers", 2, *SMALL, started=watch)
    server.watched = None
    assert done.returncode == 0, done.stderr[-3000:]
    client = corpus["client"]
    keys = [o["Key"] for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix="prepared/")
            for o in page.get("Contents", [])]
    files = {key.removeprefix("prepared/"): client.get_object(Bucket=BUCKET, Key=key)["Body"].read() for key in keys}
    return {"files": files, "peak": sampler.peak, "tmpdir": tmpdir, "staged": list(server.staged),
            "chunks": server.chunks_sent}


def compared(files: dict[str, bytes]) -> dict[str, bytes]:
    """What must not depend on where the output lives: the shards, the lineage, the manifest and its indexes."""
    return {rel: data for rel, data in files.items()
            if rel.startswith(("shards/", "index/", "lineage/")) or rel == "manifest.json"}


def partition_bytes(files: dict[str, bytes], sizes: dict[str, int], inputs: list[str]) -> list[int]:
    """Per input: its WET file and every output file of its own (those named by its index)."""
    return [sizes[uri] + sum(len(data) for rel, data in files.items() if f"{i:06d}" in rel)
            for i, uri in enumerate(inputs)]


# ------------------------------------------------------------------ tests


def test_s3_run_keeps_local_disk_to_one_partition_and_matches_a_local_run(s3_endpoint, https_input, corpus,
                                                                          s3_run, tmp_path):
    files = s3_run["files"]
    manifest = json.loads(files["manifest.json"])
    inputs = json.loads(files["work/inputs.json"])
    assert "inputs" not in manifest and inputs == sorted(corpus["sizes"])  # the inputs stay in work/inputs.json
    shards = listed_shards(manifest, files.get)
    assert shards and all(s["path"] in files and s["sidecar_path"] in files for s in shards)
    assert any(rel.startswith("lineage/") for rel in files)
    assert {"tokenizer.json", "report.json", "report.html"} <= set(files)
    # every input yielded documents, the https one included
    for i in range(N_INPUTS):
        read = json.loads(files[f"work/stats/input-{i:06d}.json"])["steps"][0]
        assert read["name"] == "read" and read["docs_out"] == DOCS, (inputs[i], read)

    # local disk: a small multiple of the largest input's partition, and less than the corpus
    partitions = partition_bytes(files, corpus["sizes"], inputs)
    bound = LOCAL_DISK_FACTOR * max(partitions)
    assert bound < sum(partitions)
    assert 0 < s3_run["peak"] <= bound, (s3_run["peak"], partitions)
    assert not list(s3_run["tmpdir"].iterdir())  # every spool and local copy is gone

    # the same run with a local output: byte-identical shards, lineage and manifest
    local = tmp_path / "out"
    _, _, cert = https_input
    done = dataprep(child_env(s3_endpoint, tmp_path, cert), "run", "--input", *corpus["patterns"],
                    "--output", local, "--workers", 1, *SMALL)
    assert done.returncode == 0, done.stderr[-3000:]
    local_files = {p.relative_to(local).as_posix(): p.read_bytes() for p in local.rglob("*") if p.is_file()}
    assert sorted(compared(files)) == sorted(compared(local_files))
    for rel, data in compared(local_files).items():
        assert files[rel] == data, rel


def test_https_input_is_streamed_not_staged(s3_run):
    assert s3_run["chunks"] > 10  # the checks ran while the file was being sent
    assert s3_run["staged"] == []


def test_full_temp_dir_is_one_line_storage_error(s3_endpoint, https_input, corpus, tmp_path):
    """A temp dir that cannot take a spooled write: exit 4, one line naming the local file and the
    object it was for, the object not written, nothing left in TMPDIR."""
    _, _, cert = https_input
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    output = f"s3://{BUCKET}/full"
    failed = dataprep(child_env(s3_endpoint, tmpdir, cert), "run", "--input", corpus["patterns"][0],
                      "--output", output, "--workers", 1, *SMALL, limit=32768)
    assert failed.returncode == 4, failed.stderr[-3000:]
    match = re.fullmatch(rf"lmforge-dataprep run: error: storage error: File too large \(EFBIG\): "
                         rf"{re.escape(str(tmpdir))}/\S+ -> ({re.escape(output)}/\S+)\n", failed.stderr)
    assert match, failed.stderr[-3000:]
    key = match.group(1).removeprefix(f"s3://{BUCKET}/")
    assert "Contents" not in corpus["client"].list_objects_v2(Bucket=BUCKET, Prefix=key)
    assert not list(tmpdir.iterdir())


@dataclass(frozen=True)
class CopyTask:
    """Takes a local copy of one file of the store; returns the files in its process's copies."""

    rel: str

    @property
    def done_marker(self) -> str:
        return self.rel + ".done"

    def run(self, store: Store, config: DataprepConfig) -> list[str]:
        assert store.local_path(self.rel).read_bytes() == self.rel.encode()
        return sorted(p.name for p in store.cache_dir.rglob("*") if p.is_file())


def test_a_task_keeps_only_its_own_local_copies(s3, tmp_path, monkeypatch):
    """Inline and in a pool process that runs several tasks: when a task ends, the local copies of
    the remote files it read are gone; the next task starts with none."""
    _, make = s3
    make("lmf-copies")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() reads TMPDIR again
    store = open_store("s3://lmf-copies/out")
    tasks = [CopyTask(f"work/file-{i}") for i in range(6)]
    for task in tasks:
        store.write_text(task.rel, task.rel)
    for executor in (InlineExecutor(store, DataprepConfig()), PoolExecutor(store, DataprepConfig(), 2)):
        results = executor.run(tasks, lambda result: None)
        assert sorted(results) == [[f"file-{i}"] for i in range(6)]
        assert not list(tmp_path.iterdir())
