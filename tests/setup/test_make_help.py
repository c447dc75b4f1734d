"""`make help` lists every target with one line each, and a bare `make` prints that list
instead of setting anything up."""

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def make(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "--no-print-directory", "-C", str(REPO), *args], capture_output=True,
                          text=True, timeout=60)


def makefile_targets() -> set[str]:
    """The Makefile's named targets (`name:` at the start of a line, not `name :=`), and image-SERVICE."""
    text = (REPO / "Makefile").read_text()
    names = set(re.findall(r"^([a-z][a-z0-9-]*):(?!=)", text, re.M))
    return names | {"image-SERVICE"} if "$(addprefix image-,$(IMAGE_SERVICES)): image-%" in text else names


def test_make_help_lists_every_target_once_with_a_line():
    result = make("help")
    assert result.returncode == 0, result.stderr
    listed = {}
    for line in result.stdout.splitlines()[1:]:
        name, _, what = line.strip().partition(" ")
        assert name not in listed, f"{name} listed twice"
        listed[name] = what.strip()
    assert set(listed) == makefile_targets()
    assert all(listed.values()), [name for name, what in listed.items() if not what]
    # no duration for the tests, which would go stale (nor in README: tests/test_readme_figures.py)
    assert not re.search(r"\d+ ?min", listed["test"]), listed["test"]
    assert "slow" in listed["test-fast"]


def test_a_bare_make_prints_the_help_and_sets_nothing_up():
    dry = make("-n")  # what a bare `make` would run
    assert dry.returncode == 0, dry.stderr
    assert "pip" not in dry.stdout and "venv" not in dry.stdout and "apt-get" not in dry.stdout, dry.stdout
    assert make().stdout == make("help").stdout
