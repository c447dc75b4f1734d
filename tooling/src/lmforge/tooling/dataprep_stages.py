"""Writes or checks helm/lmforge/dataprep-stages.json, the chart's copy of the data-prep stage graph
(lmforge.dataprep.stages.chart_json): `python -m lmforge.tooling.dataprep_stages --write|--check FILE`."""

from __future__ import annotations

from lmforge.dataprep.stages import chart_json
from lmforge.tooling.generated_file import generated_file_main


def main(argv: list[str] | None = None) -> int:
    return generated_file_main(argv, prog="python -m lmforge.tooling.dataprep_stages", description=__doc__,
                               what="data-prep stage list", render=chart_json)


if __name__ == "__main__":
    raise SystemExit(main())
