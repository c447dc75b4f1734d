import io
import json

from lmforge.common.logging import configure_logging, get_logger


def test_one_json_object_per_line_with_context():
    stream = io.StringIO()
    configure_logging("INFO", stream=stream)
    log = get_logger("dataprep").bind(rank=2)
    log.info("stage_done", stage="langid", docs=12)
    log.debug("hidden")
    try:
        raise ValueError("boom")
    except ValueError:
        log.error("failed", exc_info=True, file="x.wet")
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [line["event"] for line in lines] == ["stage_done", "failed"]
    first = lines[0]
    assert first["service"] == "dataprep" and first["level"] == "info"
    assert first["rank"] == 2 and first["stage"] == "langid" and first["docs"] == 12
    assert first["time"].endswith("+00:00")
    assert "ValueError: boom" in lines[1]["exception"] and lines[1]["file"] == "x.wet"


def test_non_finite_numbers_stay_strict_json():
    stream = io.StringIO()
    configure_logging("INFO", stream=stream)
    get_logger("trainer").warning("nonfinite_step_skipped", loss=float("nan"), grad_norm=float("inf"), lr=1e-3)
    line = stream.getvalue().strip()
    record = json.loads(line, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))  # no bare NaN
    assert record["loss"] == "nan" and record["grad_norm"] == "inf" and record["lr"] == 1e-3
