"""The uploader's gauges are absent until the sidecar knows their value: a placeholder scraped
at a restart (-1 for the last uploaded step, 0 pending, 0 lag) would read as a change or a
reading to the alerts and graphs."""

from __future__ import annotations

from tests.prometheus_tools import registry_samples
from tests.uploader.helpers import fake_checkpoint, in_process_uploader

GAUGES = ["lmforge_uploader_last_uploaded_step", "lmforge_uploader_pending_checkpoints",
          "lmforge_uploader_lag_seconds"]
SMALL = (1000, 500)


def gauges(uploader) -> dict[str, float | None]:
    samples = registry_samples(uploader.metrics.registry)
    return {name: samples.get(name) for name in GAUGES}


def test_gauges_appear_once_the_uploader_knows_them(tmp_path):
    local, store = tmp_path / "ckpt", f"file://{tmp_path / 'store'}"
    uploader = in_process_uploader(local, store, start=False)
    try:
        assert gauges(uploader) == dict.fromkeys(GAUGES)
        uploader.start()  # has read the store: nothing there yet
        assert gauges(uploader) == {"lmforge_uploader_last_uploaded_step": -1,
                                    "lmforge_uploader_pending_checkpoints": None, "lmforge_uploader_lag_seconds": None}
        fake_checkpoint(local, 5, sizes=SMALL)
        assert uploader.run_once() == [5]
        after = gauges(uploader)
        assert after["lmforge_uploader_last_uploaded_step"] == 5
        assert after["lmforge_uploader_pending_checkpoints"] == 1  # counted at the start of the pass
        assert 0 <= after["lmforge_uploader_lag_seconds"] < 60
    finally:
        uploader.close()


def test_a_restarted_uploader_shows_the_store_s_last_step_and_never_minus_one(tmp_path):
    local, store = tmp_path / "ckpt", f"file://{tmp_path / 'store'}"
    fake_checkpoint(local, 9, sizes=SMALL)
    first = in_process_uploader(local, store)
    assert first.run_once() == [9]
    first.close()

    restarted = in_process_uploader(local, store, start=False)
    try:
        assert gauges(restarted)["lmforge_uploader_last_uploaded_step"] is None
        restarted.start()
        assert gauges(restarted) == {"lmforge_uploader_last_uploaded_step": 9,
                                     "lmforge_uploader_pending_checkpoints": None,
                                     "lmforge_uploader_lag_seconds": None}  # its upload was the first sidecar's
        assert restarted.run_once() == []
        assert gauges(restarted)["lmforge_uploader_pending_checkpoints"] == 0
    finally:
        restarted.close()
