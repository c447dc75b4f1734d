"""A stand-in for `lmforge-train eval-checkpoint` (the launcher's tests run it as the subprocess
runner's command): it reads the uploaded package's meta.json from the store, and writes a
result to --out as the real job does, with the figures a plan file gives per step.

    python eval_job.py --plan PLAN.json --package URI --step N --out URI

PLAN.json: {"<step>": {"loss": x, "acc": y, "sleep": seconds, "fail": n}}: the first n runs of
that step exit 1. Each run appends {"step", "start", "end", "code"} to runs.jsonl beside the plan.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path


def local(uri: str) -> Path:
    assert uri.startswith("file://"), uri
    return Path(uri[len("file://"):])


def main() -> int:
    parser = argparse.ArgumentParser()
    for name in ("--plan", "--package", "--out"):
        parser.add_argument(name, required=True)
    parser.add_argument("--step", type=int, required=True)
    args = parser.parse_args()
    plan_path = Path(args.plan)
    plan = json.loads(plan_path.read_text()).get(str(args.step), {})
    runs = plan_path.with_name("runs.jsonl")
    earlier = [json.loads(line) for line in runs.read_text().splitlines()] if runs.exists() else []
    start = time.time()
    time.sleep(plan.get("sleep", 0.0))
    code = 1 if sum(r["step"] == args.step for r in earlier) < plan.get("fail", 0) else 0
    if code == 0:
        meta = json.loads((local(args.package) / "meta.json").read_text())
        loss = plan.get("loss", 3.0)
        result = {"step": args.step, "tokens": meta["tokens"], "package": args.package,
                  "heldout": {"val": {"loss": loss, "perplexity": math.exp(loss)}},
                  "tasks": {"tiny_mc": {"acc": plan.get("acc", 0.5)}}, "seconds": time.time() - start}
        out = local(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".tmp").write_text(json.dumps(result))
        os.replace(out.with_suffix(".tmp"), out)
    with open(runs, "a") as fh:
        fh.write(json.dumps({"step": args.step, "start": start, "end": time.time(), "code": code}) + "\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
