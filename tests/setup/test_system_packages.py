"""The Makefile's Debian install step on a machine missing every package, as root and as a
user with sudo. `dpkg`, `apt-get`, `sudo` and `id` are stand-ins on PATH, so the test needs
no network and changes no packages; the recipe itself is the real one."""

import os
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

FAKE_TOOLS = {
    # Every package is missing.
    "dpkg": "#!/bin/sh\nexit 1\n",
    # Records the call with the frontend it saw; fails like apt-get would without a frontend set.
    "apt-get": '#!/bin/sh\necho "apt-get DEBIAN_FRONTEND=${DEBIAN_FRONTEND:-unset} $*" >>"$CALLS"\n'
               '[ "$DEBIAN_FRONTEND" = noninteractive ] || exit 100\n',
    "sudo": '#!/bin/sh\necho "sudo $*" >>"$CALLS"\nexec "$@"\n',
    "id": '#!/bin/sh\n[ "$1" = -u ] && { echo "$FAKE_UID"; exit 0; }\nexec /usr/bin/id "$@"\n',
}


def makefile_variable(name: str) -> list[str]:
    text = (REPO / "Makefile").read_text()
    return re.search(rf"^{name} := (.*)$", text, re.M).group(1).split()


@pytest.fixture
def fake_tools(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in FAKE_TOOLS.items():
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    return bin_dir


def run_make(target: str, bin_dir: Path, uid: int, calls: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_UID": str(uid), "CALLS": str(calls)}
    env.pop("DEBIAN_FRONTEND", None)
    return subprocess.run(["make", "--no-print-directory", "-C", str(REPO), target],
                          env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("target,packages_var", [("system-packages", "APT_PACKAGES"),
                                                  ("image-tools", "IMAGE_APT_PACKAGES")])
def test_as_root_the_missing_packages_are_installed_with_apt_get(fake_tools, tmp_path, target, packages_var):
    calls = tmp_path / "calls.log"
    result = run_make(target, fake_tools, uid=0, calls=calls)
    assert result.returncode == 0, result.stderr
    lines = calls.read_text().splitlines()
    packages = " ".join(makefile_variable(packages_var))
    assert lines == ["apt-get DEBIAN_FRONTEND=noninteractive update -qq",
                     f"apt-get DEBIAN_FRONTEND=noninteractive install -y -qq {packages}"]


def test_as_a_user_apt_get_runs_through_sudo(fake_tools, tmp_path):
    calls = tmp_path / "calls.log"
    result = run_make("system-packages", fake_tools, uid=1000, calls=calls)
    assert result.returncode == 0, result.stderr
    lines = calls.read_text().splitlines()
    packages = " ".join(makefile_variable("APT_PACKAGES"))
    assert f"sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq {packages}" in lines
    assert f"apt-get DEBIAN_FRONTEND=noninteractive install -y -qq {packages}" in lines


def test_a_failing_apt_get_fails_the_step(fake_tools, tmp_path):
    (fake_tools / "apt-get").write_text('#!/bin/sh\necho "E: Unable to locate package" >&2\nexit 100\n')
    result = run_make("system-packages", fake_tools, uid=0, calls=tmp_path / "calls.log")
    assert result.returncode != 0
    assert "Unable to locate package" in result.stderr


def test_nothing_is_installed_when_every_package_is_present(fake_tools, tmp_path):
    (fake_tools / "dpkg").write_text("#!/bin/sh\nexit 0\n")
    calls = tmp_path / "calls.log"
    result = run_make("system-packages", fake_tools, uid=0, calls=calls)
    assert result.returncode == 0, result.stderr
    assert not calls.exists()
