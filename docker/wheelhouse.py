"""Locks and build contexts for the service images.

    python docker/wheelhouse.py lock [SERVICE ...]        rewrite docker/locks/SERVICE.lock
    python docker/wheelhouse.py context SERVICE OUTDIR    make OUTDIR the image's build context

`lock` resolves a service's own distributions (with the extras its image needs) with the
host's pip configuration and writes every third-party distribution of the result, exactly
pinned, to docker/locks/SERVICE.lock. The locks are committed: an image build installs
exactly them and nothing else, and a dependency moves only when someone reruns `lock`.

`context` makes the directory that is the whole build context of `docker build`:

    OUTDIR/venv.sh                     the install steps the Dockerfile runs (docker/venv.sh)
    OUTDIR/deps/requirements.lock      a copy of docker/locks/SERVICE.lock
    OUTDIR/deps/*.whl                  one wheel per line of the lock (rebuilt only when the lock changes)
    OUTDIR/own/requirements.txt        the image's lmforge distributions, with extras
    OUTDIR/own/*.whl                   those distributions, built from services/ and pipelines/
                                       (byte-reproducible)
    OUTDIR/chart/                      trainer only: a copy of helm/lmforge (the launcher renders
                                       its training template; the Dockerfile puts it in /opt/lmforge/chart)

Nothing else of the repository (no .venv, no credentials, no model files) is in the
context, so nothing else can end up in an image. Wheels come from the host's pip
configuration: torch resolves to whatever that offers for `torch==2.13.0` (the CPU wheel
on a machine with the CPU index; the CUDA wheel from plain PyPI, with its nvidia-* wheels).
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LOCKS = REPO / "docker" / "locks"
# The lmforge distributions of each image: (source folder in the repository, extras). The
# dataprep and trainer images also run the Kubeflow pipelines' steps (lmforge_pipelines and kfp's
# executor): the data steps in dataprep, training/export/evaluation/rollout in trainer, whose
# export step restores checkpoints with `lmforge-uploader restore`.
IMAGES: dict[str, list[tuple[str, str]]] = {
    "dataprep": [("services/common", ""), ("services/pages", ""), ("services/model", ""), ("services/trace", ""),
                 ("services/dataprep", ""), ("pipelines", "data")],
    "trainer": [("services/common", ""), ("services/pages", ""), ("services/model", "torch"),
                ("services/trainer", "tracking,eval"), ("services/uploader", ""), ("pipelines", "train")],
    "uploader": [("services/common", ""), ("services/model", ""), ("services/uploader", "")],
    "inference": [("services/common", ""), ("services/model", "torch"), ("services/trace", ""),
                  ("services/inference", "")],
    "canary": [("services/common", ""), ("services/canary", "")],
}
# Folders of the repository an image carries besides its wheels: {image: [(folder, name in the
# build context)]}. The trainer image's training step renders the chart's training template (the
# one definition of the trainer pod), so the chart ships with the code that renders it.
FILES: dict[str, list[tuple[str, str]]] = {"trainer": [("helm/lmforge", "chart")]}
# Wheels get this timestamp, so rebuilding unchanged sources gives identical bytes and the
# image build's layer cache still hits.
SOURCE_DATE_EPOCH = "315532800"  # 1980-01-01, the oldest time a zip file can hold


def pip(*args: str, env: dict | None = None) -> None:
    """Run pip; its stderr is passed on without the host index's "Location … is ignored" noise."""
    proc = subprocess.run([sys.executable, "-m", "pip", *args], env=env, stderr=subprocess.PIPE, text=True)
    for line in proc.stderr.splitlines():
        if not (line.startswith("WARNING: Location ") and line.endswith("is neither a file nor a directory.")):
            print(line, file=sys.stderr)
    if proc.returncode:
        sys.exit(f"pip {args[0]} failed (exit {proc.returncode})")


def project_version(folder: str) -> tuple[str, str]:
    import tomllib

    project = tomllib.loads((REPO / folder / "pyproject.toml").read_text())["project"]
    return project["name"], project["version"]


def requirement(folder: str, extras: str) -> str:
    """lmforge-NAME[extras], as the image asks for the distribution of `folder`."""
    return project_version(folder)[0] + (f"[{extras}]" if extras else "")


TORCH_MARK = "# with torch"  # torch, and what only torch needs: a base image with torch has them


def canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def torch_only(items: list[dict], roots: list[tuple[str, str]]) -> set[str]:
    """The distributions of the resolution that are there only for torch: torch itself and
    what only torch (transitively) needs. A base image that provides torch provides them."""
    from packaging.requirements import Requirement

    meta = {canonical(item["metadata"]["name"]): item["metadata"] for item in items}

    def reach(start: list[tuple[str, frozenset]], avoid: str | None) -> set[str]:
        seen: set[tuple[str, frozenset]] = set()
        stack = list(start)
        while stack:
            name, extras = stack.pop()
            if (name, extras) in seen or name == avoid or name not in meta:
                continue
            seen.add((name, extras))
            for line in meta[name].get("requires_dist") or []:
                req = Requirement(line)
                if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in {"", *extras}):
                    stack.append((canonical(req.name), frozenset(req.extras)))
        return {name for name, _ in seen}

    start = [(canonical(project_version(folder)[0]), frozenset(filter(None, extras.split(","))))
             for folder, extras in roots]
    if "torch" not in reach(start, None):
        return set()
    return reach([("torch", frozenset())], None) - reach(start, "torch")


def lock(service: str) -> Path:
    requirements = [f"{REPO / folder}" + (f"[{extras}]" if extras else "") for folder, extras in IMAGES[service]]
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        pip("install", "--quiet", "--dry-run", "--ignore-installed", "--report", str(report), *requirements)
        items = json.loads(report.read_text())["install"]
    with_torch = torch_only(items, IMAGES[service])
    pins = sorted((canonical(item["metadata"]["name"]), item["metadata"]["version"]) for item in items)
    pins = [(name, version) for name, version in pins if not name.startswith("lmforge-")]
    width = max(len(f"{name}=={version}") for name, version in pins)
    requested = " ".join(requirement(folder, extras) for folder, extras in IMAGES[service])
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    lines = [
        f"# Third-party distributions of the lmforge/{service} image: {requested}",
        f"# resolved for CPython {py} on Linux x86_64. Generated by `make image-locks` "
        "(docker/wheelhouse.py); do not edit.",
        *(f"{name}=={version}".ljust(width + 2) + TORCH_MARK if name in with_torch else f"{name}=={version}"
          for name, version in pins),
    ]
    LOCKS.mkdir(parents=True, exist_ok=True)
    path = LOCKS / f"{service}.lock"
    path.write_text("\n".join(lines) + "\n")
    print(f"{path.relative_to(REPO)}: {len(pins)} distributions"
          + (f", {len(with_torch)} of them with torch" if with_torch else ""))
    return path


def sync_dir(src: Path, dest: Path) -> None:
    """Make `dest` hold exactly the files and folders of `src`, leaving identical files untouched
    (so the engine's layer cache still hits)."""
    dest.mkdir(parents=True, exist_ok=True)
    wanted = {p.name: p for p in src.iterdir() if p.name != "__pycache__"}
    for old in dest.iterdir():
        new = wanted.get(old.name)
        if new is None or new.is_dir() != old.is_dir():
            shutil.rmtree(old) if old.is_dir() else old.unlink()
    for name, new in wanted.items():
        target = dest / name
        if new.is_dir():
            sync_dir(new, target)
        elif not (target.exists() and filecmp.cmp(new, target, shallow=False)):
            shutil.copy2(new, target)


def build_own_wheels(service: str, own: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        src_root, wheels = Path(tmp) / "src", Path(tmp) / "wheels"
        folders = []
        for folder, _ in IMAGES[service]:
            # Build from a copy, so no build/ or egg-info lands in the source folder.
            copy = src_root / Path(folder).name
            shutil.copytree(REPO / folder, copy,
                            ignore=shutil.ignore_patterns("*.egg-info", "__pycache__", "build", "*.pyc"))
            folders.append(str(copy))
        env = dict(os.environ, SOURCE_DATE_EPOCH=SOURCE_DATE_EPOCH, PYTHONDONTWRITEBYTECODE="1")
        pip("wheel", "--quiet", "--no-deps", "--no-build-isolation", "--wheel-dir", str(wheels), *folders, env=env)
        lines = [f"{requirement(folder, extras)}=={project_version(folder)[1]}" for folder, extras in IMAGES[service]]
        (wheels / "requirements.txt").write_text("\n".join(lines) + "\n")
        sync_dir(wheels, own)


def build_deps_wheels(service: str, deps: Path) -> None:
    lock_file = LOCKS / f"{service}.lock"
    if not lock_file.exists():
        sys.exit(f"{lock_file.relative_to(REPO)} is missing: run `make image-locks`")
    stamp = deps / "requirements.lock"
    if stamp.exists() and filecmp.cmp(stamp, lock_file, shallow=False):
        return  # the wheelhouse already holds exactly this lock
    print(f"wheelhouse for {service}: fetching the wheels of {lock_file.relative_to(REPO)}", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix=".deps-", dir=deps.parent))
    try:
        pip("wheel", "--quiet", "--no-deps", "--wheel-dir", str(tmp), "-r", str(lock_file))
        shutil.copy2(lock_file, tmp / "requirements.lock")  # last: it marks the wheelhouse complete
        tmp.chmod(0o755)  # noqa: S103 - mkdtemp's 0700 would not do for the wheelhouse
        if deps.exists():
            shutil.rmtree(deps)
        tmp.rename(deps)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def context(service: str, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    build_deps_wheels(service, out / "deps")
    build_own_wheels(service, out / "own")
    script = REPO / "docker" / "venv.sh"
    if not ((out / "venv.sh").exists() and filecmp.cmp(script, out / "venv.sh", shallow=False)):
        shutil.copy2(script, out / "venv.sh")
    for folder, name in FILES.get(service, []):
        sync_dir(REPO / folder, out / name)
    keep = {"deps", "own", "venv.sh", *(name for _, name in FILES.get(service, []))}
    for extra in set(p.name for p in out.iterdir()) - keep:
        path = out / extra
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"build context {out}: {size / 2**20:.0f} MiB", flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_lock = sub.add_parser("lock", help="rewrite docker/locks/SERVICE.lock")
    p_lock.add_argument("services", nargs="*", metavar="SERVICE", help=f"one of {', '.join(IMAGES)} (default: all)")
    p_ctx = sub.add_parser("context", help="make OUTDIR the build context of SERVICE's image")
    p_ctx.add_argument("service", choices=list(IMAGES))
    p_ctx.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    if args.command == "lock":
        unknown = set(args.services) - set(IMAGES)
        if unknown:
            parser.error(f"unknown service(s) {', '.join(sorted(unknown))}; choose from {', '.join(IMAGES)}")
        for service in args.services or IMAGES:
            lock(service)
    else:
        context(args.service, args.out)


if __name__ == "__main__":
    main()
