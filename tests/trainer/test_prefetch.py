"""The prefetcher yields exactly the batches the sampler defines, in order, and raises what
the loader raised."""

from __future__ import annotations

import numpy as np
import pytest

from lmforge.trainer.prefetch import Prefetcher


def batch_fn(index: int):
    return np.full((2, 3), index, dtype=np.int64), [index]


@pytest.mark.parametrize("depth", [0, 1, 3])
def test_batches_in_order(depth):
    prefetcher = Prefetcher(batch_fn, range(5, 12), depth=depth, pin_memory=False)
    got = [(index, int(batch[0, 0]), refs) for index, batch, refs, _ in prefetcher]
    prefetcher.close()
    assert got == [(i, i, [i]) for i in range(5, 12)]


def test_loader_errors_reach_the_training_loop():
    def failing(index: int):
        if index == 3:
            raise ValueError("shard went away")
        return batch_fn(index)

    prefetcher = Prefetcher(failing, range(10), depth=2, pin_memory=False)
    with pytest.raises(ValueError, match="shard went away"):
        for _ in prefetcher:
            pass
    prefetcher.close()


def test_close_stops_a_producer_that_is_ahead():
    prefetcher = Prefetcher(batch_fn, range(1000), depth=2, pin_memory=False)
    iterator = iter(prefetcher)
    next(iterator)
    prefetcher.close()
    assert not prefetcher._thread.is_alive()


def test_depth_batches_load_at_once_and_arrive_in_order():
    import threading

    depth = 4
    # Each of the first `depth` loads waits until all of them are loading: a prefetcher that
    # loads fewer at once breaks the barrier (after its timeout), and the loop gets the error.
    all_loading = threading.Barrier(depth, timeout=30)
    finished = [threading.Event() for _ in range(8)]

    def together(index: int):
        if index < depth:
            all_loading.wait()
            if index + 1 < depth:
                assert finished[index + 1].wait(timeout=30)  # later batches finish first
        finished[index].set()
        return batch_fn(index)

    prefetcher = Prefetcher(together, range(8), depth=depth, pin_memory=False)
    got = [index for index, batch, _, _ in prefetcher if int(batch[0, 0]) == index]
    prefetcher.close()
    assert got == list(range(8))
