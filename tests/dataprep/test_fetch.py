"""fetch_crawl against a local HTTP server with Range support, and against moto's S3 server."""

from __future__ import annotations

import contextlib
import gzip
import json
import logging
import random
import re
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from lmforge.common.errors import InputError
from lmforge.common.logging import JsonLineFormatter
from lmforge.dataprep import fetch
from lmforge.dataprep.fetch import fetch_crawl
from lmforge.sample_data.wet import write_sample_wet
from tests.dataprep.helpers import run_cli
from tests.dataprep.wet_records import gz_member, wet_record

CRAWL = "CC-MAIN-2024-22"
SEGMENT = f"crawl-data/{CRAWL}/segments/1715971057216.39/wet"
WET_PATHS = [f"{SEGMENT}/CC-MAIN-20240517233122-20240518023122-0000{i}.warc.wet.gz" for i in range(3)]
LISTING = f"crawl-data/{CRAWL}/wet.paths.gz"
MISSING = WET_PATHS[2]  # listed, but not on the server


@pytest.fixture(scope="module")
def crawl_files(tmp_path_factory) -> dict[str, bytes]:
    """Relative path -> bytes: the listing and two small gzip WET files."""
    workdir = tmp_path_factory.mktemp("crawl")
    files = {LISTING: gzip.compress("".join(p + "\n" for p in WET_PATHS).encode(), mtime=0)}
    for i, rel in enumerate(WET_PATHS[:2]):
        path = workdir / Path(rel).name
        write_sample_wet(path, 25, seed=100 + i)
        files[rel] = path.read_bytes()
    return files


class CrawlServer(ThreadingHTTPServer):
    """Serves `files` at /<rel>, honours `Range: bytes=N-`, and can misbehave on demand."""

    daemon_threads = True

    def __init__(self, files: dict[str, bytes]):
        super().__init__(("127.0.0.1", 0), RangeHandler)
        self.files = {"/" + rel: data for rel, data in files.items()}
        self.requests: list[tuple[str, str | None]] = []  # (path, Range header)
        self.ignore_range = False
        self.send_length = True  # False: no Content-Length, the body ends when the connection closes
        self.failures: list[int] = []  # statuses to answer, in order, before serving normally
        self.cut_once: set[str] = set()  # paths whose next body is cut off halfway
        self.lock = threading.Lock()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def range_requests(self, rel: str) -> list[str]:
        return [r for path, r in self.requests if path == "/" + rel and r]


class RangeHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: CrawlServer

    def log_message(self, format, *args):  # keep pytest output clean
        pass

    def do_GET(self):
        server = self.server
        range_header = self.headers.get("Range")
        with server.lock:
            server.requests.append((self.path, range_header))
            failure = server.failures.pop(0) if server.failures else None
            cut = self.path in server.cut_once
            server.cut_once.discard(self.path)
        if failure:
            self.send_error(failure)
            return
        body = server.files.get(self.path)
        if body is None:
            self.send_error(404)
            return
        start = 0
        if range_header and not server.ignore_range:
            start = int(re.fullmatch(r"bytes=(\d+)-", range_header).group(1))
            if start >= len(body):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(body)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        else:
            self.send_response(200)
        payload = body[start:]
        self.send_header("Content-Type", "application/octet-stream")
        if server.send_length:
            self.send_header("Content-Length", str(len(payload)))
        else:
            self.close_connection = True
        self.end_headers()
        if cut:
            self.wfile.write(payload[: len(payload) // 2])
            self.close_connection = True
            return
        self.wfile.write(payload)


class RecordingLog:
    def __init__(self):
        self.events: list[tuple[str, dict]] = []

    def info(self, event: str, **fields):
        self.events.append((event, fields))

    warning = info

    def names(self) -> list[str]:
        return [name for name, _ in self.events]


@pytest.fixture(autouse=True)
def no_proxies_no_waiting(monkeypatch):
    for name in ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setattr(fetch, "FETCH_RETRY", fetch.FETCH_RETRY.model_copy(update={"backoff_seconds": 0.0}))


@contextlib.contextmanager
def serving(files: dict[str, bytes]) -> Iterator[CrawlServer]:
    """A CrawlServer of `files` on a thread, for the duration of the block."""
    srv = CrawlServer(files)
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join()


@pytest.fixture
def server(crawl_files):
    with serving(crawl_files) as srv:
        yield srv


def expected(crawl_files, out: Path, count: int = 2) -> dict[Path, bytes]:
    return {out / Path(rel).name: crawl_files[rel] for rel in WET_PATHS[:count]}


# ---------------------------------------------------------------- http


def test_downloads_listing_and_first_n_files(server, crawl_files, tmp_path):
    log = RecordingLog()
    paths = fetch_crawl(CRAWL, 2, tmp_path, base_url=server.base_url, log=log)

    assert paths == list(expected(crawl_files, tmp_path))
    for path, data in expected(crawl_files, tmp_path).items():
        assert path.read_bytes() == data
    assert (tmp_path / "wet.paths.gz").read_bytes() == crawl_files[LISTING]
    assert not list(tmp_path.glob("*.part"))
    assert log.names() == ["fetch_started", "fetch_finished"] * 3
    finished = [fields for name, fields in log.events if name == "fetch_finished"]
    assert [f["bytes"] for f in finished[1:]] == [len(crawl_files[rel]) for rel in WET_PATHS[:2]]
    assert finished[1]["url"] == f"{server.base_url}/{WET_PATHS[0]}"


def test_rerun_downloads_nothing(server, crawl_files, tmp_path):
    first = fetch_crawl(CRAWL, 2, tmp_path, base_url=server.base_url, log=RecordingLog())
    requests_after_first = len(server.requests)
    log = RecordingLog()
    second = fetch_crawl(CRAWL, 2, tmp_path, base_url=server.base_url, log=log)
    assert second == first
    assert len(server.requests) == requests_after_first
    assert log.names() == ["fetch_skipped"] * 3


def test_asking_for_more_shards_fetches_only_the_new_ones(server, crawl_files, tmp_path):
    fetch_crawl(CRAWL, 1, tmp_path, base_url=server.base_url, log=RecordingLog())
    server.requests.clear()
    paths = fetch_crawl(CRAWL, 2, tmp_path, base_url=server.base_url, log=RecordingLog())
    assert [path for path, _ in server.requests] == ["/" + WET_PATHS[1]]
    assert paths[1].read_bytes() == crawl_files[WET_PATHS[1]]


def test_resumes_a_partial_download_with_a_range_request(server, crawl_files, tmp_path):
    data = crawl_files[WET_PATHS[0]]
    keep = len(data) // 3
    (tmp_path / (Path(WET_PATHS[0]).name + ".part")).write_bytes(data[:keep])

    log = RecordingLog()
    paths = fetch_crawl(CRAWL, 2, tmp_path, base_url=server.base_url, log=log)

    assert server.range_requests(WET_PATHS[0]) == [f"bytes={keep}-"]
    assert [path for path, _ in server.requests].count("/" + WET_PATHS[0]) == 1
    assert paths[0].read_bytes() == data
    assert ("fetch_started", {"url": f"{server.base_url}/{WET_PATHS[0]}", "file": str(paths[0]),
                              "resume_from": keep}) in log.events
    assert not list(tmp_path.glob("*.part"))


def test_server_that_ignores_range_still_gives_a_correct_file(server, crawl_files, tmp_path):
    server.ignore_range = True
    data = crawl_files[WET_PATHS[0]]
    (tmp_path / (Path(WET_PATHS[0]).name + ".part")).write_bytes(data[:1000])

    log = RecordingLog()
    paths = fetch_crawl(CRAWL, 2, tmp_path, base_url=server.base_url, log=log)

    assert server.range_requests(WET_PATHS[0]) == ["bytes=1000-"]  # asked, got a 200 with everything
    assert paths[0].read_bytes() == data
    assert "fetch_restart" in log.names()


def test_connection_cut_mid_transfer_is_resumed(server, crawl_files, tmp_path):
    listing_size = len(crawl_files[LISTING])
    server.cut_once = {"/" + LISTING, "/" + WET_PATHS[0]}
    log = RecordingLog()
    paths = fetch_crawl(CRAWL, 2, tmp_path, base_url=server.base_url, log=log)

    data = crawl_files[WET_PATHS[0]]
    assert server.range_requests(LISTING) == [f"bytes={listing_size // 2}-"]
    assert server.range_requests(WET_PATHS[0]) == [f"bytes={len(data) // 2}-"]
    assert paths[0].read_bytes() == data
    assert log.names().count("fetch_retry") == 2


def test_cut_without_content_length_is_caught_by_the_gzip_check_and_resumed(server, crawl_files, tmp_path):
    server.send_length = False
    server.cut_once = {"/" + WET_PATHS[0]}
    log = RecordingLog()
    paths = fetch_crawl(CRAWL, 1, tmp_path, base_url=server.base_url, log=log)
    data = crawl_files[WET_PATHS[0]]
    assert server.range_requests(WET_PATHS[0]) == [f"bytes={len(data) // 2}-"]
    assert paths[0].read_bytes() == data
    assert any("ends early" in fields["error"] for name, fields in log.events if name == "fetch_retry")


def test_corrupt_partial_file_is_detected_and_downloaded_again(server, crawl_files, tmp_path):
    (tmp_path / (Path(WET_PATHS[1]).name + ".part")).write_bytes(b"\x00garbage" * 50)
    paths = fetch_crawl(CRAWL, 2, tmp_path, base_url=server.base_url, log=RecordingLog())
    assert server.range_requests(WET_PATHS[1]) == ["bytes=400-"]  # resumed, failed the gzip check, restarted
    assert paths[1].read_bytes() == crawl_files[WET_PATHS[1]]


def test_complete_partial_file_answered_with_416_is_kept(server, crawl_files, tmp_path):
    data = crawl_files[WET_PATHS[0]]
    (tmp_path / (Path(WET_PATHS[0]).name + ".part")).write_bytes(data)
    paths = fetch_crawl(CRAWL, 1, tmp_path, base_url=server.base_url, log=RecordingLog())
    assert server.range_requests(WET_PATHS[0]) == [f"bytes={len(data)}-"]
    assert [path for path, _ in server.requests].count("/" + WET_PATHS[0]) == 1
    assert paths[0].read_bytes() == data


def test_server_errors_are_retried_with_backoff(server, crawl_files, tmp_path, monkeypatch):
    monkeypatch.setattr(fetch, "FETCH_RETRY", fetch.FETCH_RETRY.model_copy(update={"backoff_seconds": 0.05}))
    monkeypatch.setattr(random, "uniform", lambda low, high: high)  # each jittered wait: the top of its window
    server.failures = [503, 500, 502]
    log = RecordingLog()
    started = time.monotonic()
    paths = fetch_crawl(CRAWL, 1, tmp_path, base_url=server.base_url, log=log)
    assert paths[0].read_bytes() == crawl_files[WET_PATHS[0]]
    waits = [fields["retry_in_seconds"] for name, fields in log.events if name == "fetch_retry"]
    assert waits == [0.05, 0.1, 0.2]
    assert time.monotonic() - started >= sum(waits)


def test_persistent_server_errors_give_up_after_bounded_attempts(server, tmp_path):
    server.failures = [503] * 20
    with pytest.raises(InputError, match=r"after 5 attempts.*HTTP 503"):
        fetch_crawl(CRAWL, 1, tmp_path, base_url=server.base_url, log=RecordingLog())
    assert len(server.requests) == fetch.FETCH_RETRY.attempts


def test_missing_listing_is_an_input_error_naming_the_url(server, tmp_path):
    with pytest.raises(InputError, match=re.escape(f"{server.base_url}/crawl-data/CC-MAIN-2023-50/wet.paths.gz")):
        fetch_crawl("CC-MAIN-2023-50", 1, tmp_path, base_url=server.base_url, log=RecordingLog())
    assert len(server.requests) == 1  # a 404 is not retried


def test_missing_wet_file_is_an_input_error_naming_the_url(server, tmp_path):
    with pytest.raises(InputError, match=re.escape(f"{server.base_url}/{MISSING}")):
        fetch_crawl(CRAWL, 3, tmp_path, base_url=server.base_url, log=RecordingLog())
    assert (tmp_path / Path(WET_PATHS[1]).name).exists()  # the files before it are kept


def test_more_shards_than_listed_is_an_input_error(server, tmp_path):
    with pytest.raises(InputError, match="lists 3 WET files"):
        fetch_crawl(CRAWL, 4, tmp_path, base_url=server.base_url, log=RecordingLog())


def test_listing_of_another_crawl_is_replaced(server, crawl_files, tmp_path):
    (tmp_path / "wet.paths.gz").write_bytes(gzip.compress(b"crawl-data/CC-MAIN-2023-50/segments/x.warc.wet.gz\n"))
    fetch_crawl(CRAWL, 1, tmp_path, base_url=server.base_url, log=RecordingLog())
    assert (tmp_path / "wet.paths.gz").read_bytes() == crawl_files[LISTING]


@pytest.mark.parametrize("crawl", ["CC-MAIN-2024", "cc-main-2024-22", "CC-MAIN-24-22", "CC-MAIN-2024-22/..", ""])
def test_bad_crawl_id_is_an_input_error(crawl, tmp_path):
    with pytest.raises(InputError, match="CC-MAIN-YYYY-WW"):
        fetch_crawl(crawl, 1, tmp_path / "out", base_url="http://127.0.0.1:9", log=RecordingLog())
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("base_url", ["ftp://data.commoncrawl.org", "data.commoncrawl.org"])
def test_bad_base_url_is_an_input_error(base_url, tmp_path):
    with pytest.raises(InputError, match="base_url"):
        fetch_crawl(CRAWL, 1, tmp_path, base_url=base_url, log=RecordingLog())


def test_default_logger_writes_json_lines(server, tmp_path):
    lines: list[str] = []
    handler = logging.Handler()
    handler.setFormatter(JsonLineFormatter())
    handler.emit = lambda record: lines.append(handler.format(record))
    logger = logging.getLogger("lmforge.dataprep")
    logger.addHandler(handler)
    try:
        fetch_crawl(CRAWL, 1, tmp_path, base_url=server.base_url)
    finally:
        logger.removeHandler(handler)
    events = [json.loads(line) for line in lines]
    assert [e["event"] for e in events] == ["fetch_started", "fetch_finished"] * 2
    assert events[-1]["service"] == "dataprep"
    assert events[-1]["bytes"] == (tmp_path / Path(WET_PATHS[0]).name).stat().st_size


# ---------------------------------------------------------------- s3


@pytest.fixture(scope="module")
def moto_endpoint():
    from moto.server import ThreadedMotoServer

    srv = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    srv.start()
    host, port = srv.get_host_and_port()
    yield f"http://{host}:{port}"
    srv.stop()


@pytest.fixture
def commoncrawl_bucket(moto_endpoint, crawl_files, monkeypatch):
    import boto3

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    monkeypatch.setenv("LMFORGE_S3_ANONYMOUS", "0")
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    client = boto3.client("s3")
    if not _bucket_exists(client):  # the moto server lives for the module, the bucket with it
        client.create_bucket(Bucket="commoncrawl")
        for rel, data in crawl_files.items():
            client.put_object(Bucket="commoncrawl", Key=rel, Body=data)
    return client


def _bucket_exists(client) -> bool:
    return any(b["Name"] == "commoncrawl" for b in client.list_buckets().get("Buckets", []))


def test_fetch_from_s3(commoncrawl_bucket, crawl_files, tmp_path):
    log = RecordingLog()
    paths = fetch_crawl(CRAWL, 2, tmp_path, base_url="s3://commoncrawl", log=log)
    for path, data in expected(crawl_files, tmp_path).items():
        assert path.read_bytes() == data
    assert paths == list(expected(crawl_files, tmp_path))
    assert log.names() == ["fetch_started", "fetch_finished"] * 3
    assert log.events[-1][1]["url"] == f"s3://commoncrawl/{WET_PATHS[1]}"
    assert not list(tmp_path.glob("*.part"))

    rerun = RecordingLog()
    assert fetch_crawl(CRAWL, 2, tmp_path, base_url="s3://commoncrawl/", log=rerun) == paths
    assert rerun.names() == ["fetch_skipped"] * 3


def test_missing_s3_object_is_an_input_error_naming_it(commoncrawl_bucket, tmp_path):
    with pytest.raises(InputError, match=re.escape(f"s3://commoncrawl/{MISSING}")):
        fetch_crawl(CRAWL, 3, tmp_path, base_url="s3://commoncrawl", log=RecordingLog())


def test_a_missing_bucket_is_not_found_at_once_not_retried(commoncrawl_bucket, tmp_path):
    """The store's error mapping: NoSuchBucket means not found (an InputError), not a transfer to try again."""
    log = RecordingLog()
    with pytest.raises(InputError, match=re.escape(f"not found: s3://lmf-no-such-bucket/crawl-data/{CRAWL}/")):
        fetch_crawl(CRAWL, 1, tmp_path, base_url="s3://lmf-no-such-bucket", log=log)
    assert "fetch_retry" not in log.names() and not list(tmp_path.iterdir())


def test_kind_warc_fetches_the_warc_listing_and_files_through_the_cli(tmp_path):
    """`lmforge-dataprep fetch --kind warc`: warc.paths.gz, then the first WARC files."""
    warc_paths = [f"crawl-data/{CRAWL}/segments/1715971057216.39/warc/"
                  f"CC-MAIN-20240517233122-20240518023122-0000{i}.warc.gz" for i in range(2)]
    files = {f"crawl-data/{CRAWL}/warc.paths.gz": gzip.compress("".join(p + "\n" for p in warc_paths).encode())}
    for i, rel in enumerate(warc_paths):
        files[rel] = gz_member(wet_record(f"https://w.example/{i}", b"HTTP/1.1 200 OK\r\n\r\n<p>hi</p>",
                                          rec_type="response"))
    with serving(files) as srv:
        assert run_cli("fetch", "--crawl", CRAWL, "--shards", 1, "--output", tmp_path, "--base-url", srv.base_url,
                       "--kind", "warc") == 0
    assert (tmp_path / "warc.paths.gz").read_bytes() == files[f"crawl-data/{CRAWL}/warc.paths.gz"]
    assert (tmp_path / Path(warc_paths[0]).name).read_bytes() == files[warc_paths[0]]
    assert not (tmp_path / Path(warc_paths[1]).name).exists() and not (tmp_path / "wet.paths.gz").exists()
    assert [path for path, _ in srv.requests] == [f"/crawl-data/{CRAWL}/warc.paths.gz", "/" + warc_paths[0]]
    with pytest.raises(InputError, match="kind must be one of wet, warc"):
        fetch_crawl(CRAWL, 1, tmp_path, base_url=srv.base_url, kind="arc")
