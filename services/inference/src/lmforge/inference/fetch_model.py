"""Fetch the model another server will serve: resolve --model (a model pointer or a package,
s3:// or local), check that the package is in Hugging Face format (`lmforge-train export
--format hf`) and verifies (a pointer's packages must carry their checksums, as lmforge-serve
requires), and copy every file of it into --output. The chart's vLLM backend runs this in an
init container, so vLLM starts on a verified local directory (docs/vllm.md).

    python -m lmforge.inference.fetch_model --model s3://BUCKET/models/current --output /models/served

The files go to a staging directory beside --output, renamed into place once verified: an
existing --output is replaced only by a good package. Exit codes: 0 fetched, 2 not a Hugging
Face format package, 3 bad input (no such package, checksum mismatch), 4 storage errors.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from lmforge.common.atomic_files import atomic_dir
from lmforge.common.cli import ServiceCli
from lmforge.common.errors import ConfigError, InputError
from lmforge.common.s3 import S3Bucket, S3Location
from lmforge.common.store import local_path_of, scheme_of
from lmforge.model.hf_package import is_hf_config
from lmforge.model.package import read_package_config, verify_package
from lmforge.model.pointer import resolve_model

SOURCE = "lmforge-source.json"  # written beside the files: which pointer and package they came from


def copy_package(package: str, target: Path) -> None:
    """Every file directly under `package` (an s3:// prefix or a local directory) into `target`."""
    if scheme_of(package) != "s3":
        source = local_path_of(package)
        if not source.is_dir():
            raise InputError(f"{package}: no such model package directory")
        for path in sorted(source.iterdir()):
            if path.is_file():
                shutil.copyfile(path, target / path.name)
        return
    location = S3Location.parse(package.rstrip("/"))
    prefix = f"{location.key}/" if location.key else ""
    bucket = S3Bucket(location.bucket)
    objects = {key: stored for key, stored in bucket.listing(prefix).items() if "/" not in key[len(prefix):]}
    if not objects:
        raise InputError(f"{package}: no model package there (no objects)")
    for key, stored in sorted(objects.items()):
        bucket.download(key, target / key[len(prefix):], size=stored.size)


def fetch_model(model: str, output: Path) -> dict:
    """Fetch the package `model` names into `output`; what was fetched ({model, package, step})."""
    pointer, package = resolve_model(model)
    with atomic_dir(output) as staging:
        copy_package(package, staging)
        meta = read_package_config(staging, shown_as=package)
        if not is_hf_config(meta):
            raise ConfigError(f"{package}: not in Hugging Face format (export it with `lmforge-train export "
                              f"--format hf`): vLLM cannot load lmforge's own format")
        verify_package(staging, require_checksums=pointer is not None)
        source = {"model": model, "package": package, "step": (meta.get("lmforge") or {}).get("step")}
        (staging / SOURCE).write_text(json.dumps(source) + "\n")
    return source


def run_fetch(args, _config) -> int:
    source = fetch_model(args.model, Path(args.output))
    print(json.dumps({"event": "model_fetched", **source, "output": args.output}), flush=True)
    return 0


CLI = ServiceCli("python -m lmforge.inference.fetch_model", service="inference", description=__doc__,
                 name="fetch_model")
_parser = CLI.command(None, run_fetch)
_parser.add_argument("--model", required=True, help="a model pointer or a Hugging Face format package")
_parser.add_argument("--output", required=True, help="local directory the package's files go to")
main = CLI.main

if __name__ == "__main__":
    raise SystemExit(main())
