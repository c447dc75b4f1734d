"""The engine core behind its client, in both layouts (a process of its own, a thread of the API
process): concurrent streams equal the full-recompute oracle token for token, cancellation frees
the sequence, a full queue is refused at once, a bad prompt is refused before it is sent, load
failures keep their exit codes, and an engine process that dies ends its requests and is reported."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from lmforge.common.errors import InputError
from lmforge.inference.config import EngineConfig
from lmforge.inference.engine import QueueFull
from lmforge.inference.engine_client import EngineClient, EngineGone, EngineStopped
from lmforge.inference.engine_core import HEARTBEAT_SECONDS, EngineSpec
from lmforge.inference.sampling import SamplingParams
from lmforge.model.package import load_package
from tests.inference.test_engine import full_recompute_greedy

PROMPTS = [[4, 5], [6], [7, 8, 9], [10, 11, 12, 13]]


def spec(package, **engine) -> EngineSpec:
    return EngineSpec(str(package), str(package), "cpu", EngineConfig(**engine).model_dump())


@pytest.fixture(scope="module")
def oracle(tiny_package):
    model, _ = load_package(tiny_package)
    return {tuple(p): full_recompute_greedy(model, p, 12) for p in PROMPTS}


@pytest.mark.parametrize("layout", ["process", "thread"])
def test_concurrent_streams_equal_the_oracle_and_a_cancelled_one_frees_its_blocks(tiny_package, oracle, layout):
    client = EngineClient(spec(tiny_package, max_running=2), layout)
    client.start()
    if layout == "process":
        assert client.pid != os.getpid() and client.info.pid == client.pid
    params = SamplingParams(max_tokens=12, temperature=0)

    async def collect(prompt):
        handle = client.submit(prompt, params)
        return [t async for t in handle.tokens()], handle.seq

    async def cancel_after(k):
        handle = client.submit([1, 2, 3], SamplingParams(max_tokens=50, temperature=0))
        got = []
        async for token in handle.tokens():
            got.append(token)
            if len(got) == k:
                client.cancel(handle)
                break
        return got, handle.seq

    async def main():
        return await asyncio.gather(*(collect(p) for p in PROMPTS), cancel_after(3))

    try:
        *streams, (cancelled, _) = asyncio.run(main())
        assert client.alive and len(cancelled) == 3
        for (tokens, seq), prompt in zip(streams, PROMPTS, strict=True):
            assert tokens == seq.output
            expected = oracle[tuple(prompt)]
            if seq.finish_reason == "stop":  # the end-of-text token: the oracle goes on past it
                expected = expected[:len(tokens)]
            assert tokens == expected and seq.finish_reason in ("length", "stop")
            assert seq.arrived <= seq.scheduled_at <= seq.first_token_at <= seq.finished_at <= time.monotonic()
        time.sleep(2 * HEARTBEAT_SECONDS)
        assert client.counts() == (0, 0) and client.stats().kv_blocks_in_use == 0
        scored = asyncio.run(client.score(PROMPTS[3]))
        assert len(scored) == 3 and all(lp <= 0 for lp in scored)
        with pytest.raises(ValueError, match="scoring needs"):
            asyncio.run(client.score([1]))
    finally:
        client.stop()
    assert not client.alive
    with pytest.raises(EngineStopped):
        asyncio.run(client.score(PROMPTS[0]))


def test_a_full_queue_and_a_bad_prompt_are_refused_at_once(tiny_package):
    client = EngineClient(spec(tiny_package, max_running=1, max_waiting=2, step_delay_seconds=0.05), "thread")
    client.start()

    async def main():
        handles = [client.submit([4, 5], SamplingParams(max_tokens=20, temperature=0)) for _ in range(2)]
        with pytest.raises(QueueFull):  # both count as waiting: the engine has not taken them in yet
            client.submit([4], SamplingParams(max_tokens=2, temperature=0))
        with pytest.raises(ValueError, match="empty"):
            client.submit([], SamplingParams())
        with pytest.raises(ValueError, match="context holds"):
            client.submit([1] * client.info.context_length, SamplingParams())
        for handle in handles:
            client.cancel(handle)

    try:
        asyncio.run(main())
    finally:
        client.stop()


def test_a_package_that_does_not_verify_fails_to_start_with_its_error(tiny_package, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{")
    with pytest.raises(InputError):
        EngineClient(spec(broken), "process").start()


def test_an_engine_process_that_dies_ends_its_requests_and_is_reported(tiny_package):
    client = EngineClient(spec(tiny_package, step_delay_seconds=0.02), "process")
    client.start()

    async def main():
        handle = client.submit([4, 5], SamplingParams(max_tokens=200, temperature=0))
        tokens = []
        async for token in handle.tokens():
            tokens.append(token)
            if len(tokens) == 2:
                os.kill(client.pid, signal.SIGKILL)
        return tokens, handle.seq

    try:
        tokens, seq = asyncio.run(asyncio.wait_for(main(), 30))
        assert 2 <= len(tokens) < 200 and seq.finish_reason is None
        assert isinstance(client.error, EngineGone) and "exited with code -9" in str(client.error)
        assert not client.alive
        with pytest.raises(EngineStopped, match="exited"):
            asyncio.run(asyncio.wait_for(client.score([1, 2]), 5))
    finally:
        client.stop()


SECOND_API_PROCESS = """
import asyncio, json, sys
from lmforge.inference.engine_client import EngineClient
from lmforge.inference.sampling import SamplingParams

client = EngineClient(None, "connect", address=sys.argv[1])
client.start()

async def collect(prompt):
    handle = client.submit(prompt, SamplingParams(max_tokens=12, temperature=0))
    return [t async for t in handle.tokens()], handle.seq.finish_reason

async def main():
    return await asyncio.gather(*(collect(p) for p in json.loads(sys.argv[2])))

print(json.dumps({"pid": client.pid, "results": asyncio.run(main())}))
client.stop()
"""


def test_a_second_api_process_joins_the_engine_and_leaving_does_not_stop_it(tiny_package, oracle):
    import json
    import subprocess
    import sys

    owner = EngineClient(spec(tiny_package, max_running=8), "process")
    owner.start()

    async def collect(prompt):
        handle = owner.submit(prompt, SamplingParams(max_tokens=12, temperature=0))
        return [t async for t in handle.tokens()], handle.seq.finish_reason

    try:
        second = subprocess.Popen([sys.executable, "-c", SECOND_API_PROCESS, owner.address, json.dumps(PROMPTS)],
                                  stdout=subprocess.PIPE, text=True)

        async def main():  # the owner's requests run while the second process's do
            return await asyncio.gather(*(collect(p) for p in PROMPTS * 3))

        mine = asyncio.run(main())
        out, _ = second.communicate(timeout=60)
        assert second.returncode == 0
        theirs = json.loads(out)
        assert theirs["pid"] == owner.pid
        for (tokens, reason), prompt in zip(mine + theirs["results"], PROMPTS * 4, strict=True):
            expected = oracle[tuple(prompt)]
            assert tokens == (expected[:len(tokens)] if reason == "stop" else expected)
        assert owner.alive  # the second process left; the engine serves on
        assert asyncio.run(collect(PROMPTS[0]))[0] == mine[0][0]
    finally:
        owner.stop()


def test_a_malformed_message_is_refused_and_the_engine_serves_on(tiny_package, oracle):
    import stat

    import msgspec
    import zmq

    from lmforge.inference import engine_protocol as protocol

    client = EngineClient(spec(tiny_package), "thread")
    client.start()
    path = client.address.removeprefix("ipc://")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    context = zmq.Context()
    intruder = context.socket(zmq.DEALER)
    intruder.connect(client.address)
    bad_params = msgspec.msgpack.encode({"type": "Add", "key": 1, "prompt": [1], "params": {"max_tokens": 0},
                                         "request_id": None, "arrived": 0.0})
    for payload in (b"\xc1garbage", msgspec.msgpack.encode({"type": "Nope"}), bad_params):
        intruder.send(payload)
    intruder.send_multipart([b"two", b"frames"])
    intruder.send(protocol.encoder().encode(protocol.Hello()))
    assert intruder.poll(10_000) and isinstance(protocol.api_decoder().decode(intruder.recv()), protocol.Ready)
    intruder.close(linger=0)
    context.term()

    async def collect():
        handle = client.submit(PROMPTS[0], SamplingParams(max_tokens=12, temperature=0))
        return [t async for t in handle.tokens()], handle.seq.finish_reason

    try:
        tokens, reason = asyncio.run(collect())
        expected = oracle[tuple(PROMPTS[0])]
        assert tokens == (expected[:len(tokens)] if reason == "stop" else expected) and client.alive
    finally:
        client.stop()
