"""lmforge-serve following a model pointer in S3 (moto): it serves what the pointer names, swaps
to a new package while clients keep sending requests (every request succeeds, none mixes two
models, /readyz stays 200), and refuses a package that does not verify while the old model
serves on; an unreadable pointer changes nothing."""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime

import httpx
import pytest

from lmforge.model.pointer import ModelPointer, point_to, write_pointer
from tests.inference.metrics_text import sample_value
from tests.serving import corrupted_copy, perturbed_package, running_server, upload_package

BUCKET = "serving"
POINTER = f"s3://{BUCKET}/models/current"
FAST = ("pointer_poll_seconds=0.2", "model_name=lm")


def wait_for(predicate, timeout: float = 60.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what or predicate}"
        time.sleep(0.1)


def served_package(url: str) -> str:
    """The package /readyz names (the API's /v1/models shows no package path to a client)."""
    return httpx.get(f"{url}/readyz", timeout=10).json()["package"]


def answer(url: str, prompt: str = "Bees make", max_tokens: int = 24) -> str:
    response = httpx.post(f"{url}/v1/completions", json={"prompt": prompt, "max_tokens": max_tokens,
                                                         "temperature": 0}, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["text"]


def metrics(url: str) -> str:
    return httpx.get(f"{url}/metrics", timeout=10).text


def log_events(path, event: str) -> list[dict]:
    found = []
    for line in path.read_text().splitlines():
        if line.startswith("{"):
            entry = json.loads(line)
            if entry.get("event") == event:
                found.append(entry)
    return found


@pytest.fixture(scope="module")
def other_package(tiny_package, tmp_path_factory):
    """Another model (noisy weights): its greedy answers differ from tiny_package's."""
    return perturbed_package(tiny_package, tmp_path_factory.mktemp("models") / "tiny-other", 0.5)


def test_swaps_to_the_new_package_while_requests_keep_succeeding(s3, tiny_package, other_package, tmp_path):
    _, make_bucket = s3
    client = make_bucket(BUCKET)
    a = upload_package(client, BUCKET, "models/a", tiny_package)
    b = upload_package(client, BUCKET, "models/b", other_package)
    point_to(POINTER, a, set_by="test")
    log = tmp_path / "serve.log"
    # Each engine step takes ≥ 10 ms, so requests are in flight when the swap happens.
    with running_server(POINTER, *FAST, "engine.step_delay_seconds=0.01", log_path=log) as url:
        assert served_package(url) == a
        answer_a = answer(url)
        assert answer_a == " honey from the nectar of flowers."
        results: list[tuple[float, float, int, str]] = []  # (sent, answered, status, text); wall-clock times
        probes: list[int] = []
        stop = threading.Event()

        def client_loop():
            with httpx.Client(timeout=60) as http:
                while not stop.is_set():
                    sent = time.time()
                    response = http.post(f"{url}/v1/completions", json={"prompt": "Bees make", "max_tokens": 24,
                                                                       "temperature": 0})
                    text = response.json()["choices"][0]["text"] if response.status_code == 200 else response.text
                    results.append((sent, time.time(), response.status_code, text))

        def probe_loop():
            with httpx.Client(timeout=10) as http:
                while not stop.is_set():
                    probes.append(http.get(f"{url}/readyz").status_code)
                    time.sleep(0.02)

        threads = [threading.Thread(target=client_loop) for _ in range(3)] + [threading.Thread(target=probe_loop)]
        for thread in threads:
            thread.start()
        try:
            wait_for(lambda: len(results) >= 6, what="requests before the swap")
            point_to(POINTER, b, set_by="test")
            wait_for(lambda: served_package(url) == b, what="the swap")
            seen_at = time.time()
            wait_for(lambda: sum(1 for sent, *_ in results if sent > seen_at) >= 6, what="requests after it")
        finally:
            stop.set()
            for thread in threads:
                thread.join()
        answer_b = answer(url)
        text = metrics(url)
        wait_for(lambda: log_events(log, "model_retired"), what="the old model retired")

    (swap,) = log_events(log, "model_swapped")
    swapped_at = datetime.fromisoformat(swap["time"]).timestamp()
    assert answer_b != answer_a
    assert [status for _, _, status, _ in results] == [200] * len(results)
    assert {text for *_, text in results} == {answer_a, answer_b}  # each answer from one model, whole
    assert all(text == answer_b for sent, _, _, text in results if sent > swapped_at + 0.01)
    # Requests in flight at the swap finished on the old model.
    assert any(text == answer_a and answered > swapped_at for _, answered, _, text in results)
    assert probes and set(probes) == {200}
    assert sample_value(text, "lmforge_inference_model_swaps_total", {"outcome": "swapped"}) == 1
    info = [line for line in text.splitlines() if line.startswith("lmforge_inference_model_info{")]
    assert len(info) == 1 and 'version="b"' in info[0] and 'model_name="lm"' in info[0]
    assert (swap["package"], swap["previous"]) == (b, a)
    (retired,) = log_events(log, "model_retired")
    assert retired["package"] == a and retired["drained"] is True


def test_a_package_that_does_not_verify_is_refused_and_the_old_one_serves_on(s3, tiny_package, other_package,
                                                                             tmp_path):
    _, make_bucket = s3
    client = make_bucket(BUCKET)
    a = upload_package(client, BUCKET, "models/a", tiny_package)
    bad = upload_package(client, BUCKET, "models/bad", corrupted_copy(other_package, tmp_path / "bad"))
    b = upload_package(client, BUCKET, "models/b", other_package)
    point_to(POINTER, a, set_by="test")
    log = tmp_path / "serve.log"
    with running_server(POINTER, *FAST, log_path=log) as url:
        before = answer(url)
        point_to(POINTER, bad, set_by="test")
        wait_for(lambda: sample_value(metrics(url), "lmforge_inference_model_swaps_total", {"outcome": "refused"}) == 1,
                 what="the refusal")
        assert httpx.get(f"{url}/readyz").json().items() >= {"status": "ready", "model": "lm", "package": a}.items()
        assert served_package(url) == a and answer(url) == before
        time.sleep(1)  # several more polls: the refused package is not downloaded again
        assert sample_value(metrics(url), "lmforge_inference_model_swaps_total", {"outcome": "refused"}) == 1

        client.put_object(Bucket=BUCKET, Key="models/current", Body=b"{not json")
        wait_for(lambda: sample_value(metrics(url), "lmforge_inference_model_pointer_read_errors_total") >= 1,
                 what="the unreadable pointer counted")
        assert served_package(url) == a and answer(url) == before

        write_pointer(POINTER, ModelPointer(b))  # a good package after all that: followed
        wait_for(lambda: served_package(url) == b, what="the swap to a good package")
    (refused,) = log_events(log, "model_refused")
    assert refused["package"] == bad and "sha256 does not match" in refused["error"]
    assert log_events(log, "model_pointer_unreadable")
