#!/usr/bin/env python3
"""Another revision's lmforge, for the benches that put it beside the working tree's
(engine_bench.py in process, engine_split_bench.py as a server).

`git archive REV services/` is extracted into a temp dir and its services/*/src go first on the
path of the process that runs it. lmforge is a namespace package: the venv's editable installs
add the working tree's services/*/src too, which would not shadow the revision's modules but could
fill in modules it lacks; `isolate_sources` drops them. Run as a script, this module is the
launcher of such a process:

    LMFORGE_BENCH_SRC=dir1:dir2 PYTHONPATH=dir1:dir2 python baseline_tree.py lmforge.inference ARGS...

runs `python -m lmforge.inference ARGS...` from those sources alone. Its child processes inherit
PYTHONPATH (the revision's sources first) and, when started by multiprocessing, the isolated path.
"""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SRC_ENV = "LMFORGE_BENCH_SRC"  # the process's lmforge source dirs (os.pathsep-separated)


def source_dirs(root: Path) -> list[str]:
    return sorted(str(p) for p in (root / "services").glob("*/src") if (p / "lmforge").is_dir())


def resolve_rev(rev: str, option: str = "--baseline-rev") -> str:
    """The full commit id of `rev`, or one clear error."""
    done = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", f"{rev}^{{commit}}"],
                          capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{option} {rev}: not a commit of this repository")
    return done.stdout.strip()


def extract_baseline(rev: str, into: Path) -> list[str]:
    """Extract `rev`'s services/ into `into`; its lmforge source dirs."""
    try:
        archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, "services/"], check=True,
                                 capture_output=True).stdout
    except subprocess.CalledProcessError as err:
        raise SystemExit(f"--baseline-rev {rev}: git archive failed: {err.stderr.decode().strip()}") from None
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return source_dirs(into)


def sources_env(sources: list[str]) -> dict[str, str]:
    """The environment entries that make a process (and its children) import from `sources`."""
    return {SRC_ENV: os.pathsep.join(sources), "PYTHONPATH": os.pathsep.join(sources)}


def isolate_sources() -> None:
    """Keep only this process's lmforge sources (SRC_ENV) on sys.path."""
    keep = [p for p in os.environ[SRC_ENV].split(os.pathsep) if p]
    sys.path[:] = keep + [p for p in sys.path if p not in keep and not (Path(p) / "lmforge").is_dir()]


def launcher_command(module: str, *args: str) -> list[str]:
    """`python -m module args` from the sources in SRC_ENV (see sources_env)."""
    return [sys.executable, str(Path(__file__).resolve()), module, *args]


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit(f"usage: {SRC_ENV}=DIRS python {sys.argv[0]} MODULE [ARGS...]")
    isolate_sources()
    module = sys.argv[1]
    import importlib.util

    print(f"baseline_tree: {module} from {importlib.util.find_spec(module).origin}", file=sys.stderr, flush=True)
    sys.argv = [module, *sys.argv[2:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
