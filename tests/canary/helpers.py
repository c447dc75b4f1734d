"""Run `python -m lmforge.canary` in a subprocess and read what it said."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from tests.serving import SENTENCES

PROMPT_WORDS = 3
FAST_RETRIES = {"LMFORGE_CANARY__HTTP__BACKOFF_SECONDS": "0.05", "LMFORGE_CANARY__HTTP__ATTEMPTS": "2"}


@dataclass
class Run:
    code: int
    stdout: str
    stderr: str

    @property
    def logs(self) -> list[dict]:
        return [json.loads(line) for line in self.stdout.splitlines() if line.strip()]

    def event(self, name: str) -> dict:
        found = [entry for entry in self.logs if entry["event"] == name]
        assert found, f"no {name!r} log line in:\n{self.stdout}\n{self.stderr}"
        return found[-1]

    def __str__(self) -> str:
        return f"exit {self.code}\n--- stdout\n{self.stdout}\n--- stderr\n{self.stderr}"


def run_canary(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> Run:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("LMFORGE_CANARY")}
    environ.update({**FAST_RETRIES, **(env or {})})
    done = subprocess.run([sys.executable, "-m", "lmforge.canary", *args], capture_output=True, text=True,
                          env=environ, timeout=timeout)
    return Run(done.returncode, done.stdout, done.stderr)


def eval_set_data(name: str = "canary-test") -> dict:
    """The tiny model's canary: every sentence as held-out text, and each sentence's first words
    → the rest as a check."""
    checks = []
    for index, sentence in enumerate(SENTENCES):
        words = sentence.split(" ")
        checks.append({"id": f"s{index}", "prompt": " ".join(words[:PROMPT_WORDS]),
                       "expected": " " + " ".join(words[PROMPT_WORDS:]), "max_tokens": 40})
    return {"name": name, "held_out": [{"id": f"s{i}", "text": s} for i, s in enumerate(SENTENCES)],
            "checks": checks}


def write_eval_set(path: Path, data: dict | None = None) -> Path:
    path.write_text(yaml.safe_dump(data or eval_set_data(), allow_unicode=True, sort_keys=False), encoding="utf-8")
    return path
