"""The Makefile's Debian install step on a machine missing every package, as root and as a
user with sudo, never with the packages' recommends; and the image targets' check of
CONTAINER_ENGINE. `dpkg`, `apt-get`, `sudo`, `id` and `debootstrap` are stand-ins on PATH, so
the test needs no network and changes no packages; the recipe itself is the real one."""

import os
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

FAKE_TOOLS = {
    # Every package is missing.
    "dpkg": "#!/bin/sh\nexit 1\n",
    # Records the call with the frontend it saw; fails like apt-get would without a frontend set,
    # and fails an install that would bring the packages' recommends (chromium's: an X stack).
    "apt-get": '#!/bin/sh\necho "apt-get DEBIAN_FRONTEND=${DEBIAN_FRONTEND:-unset} $*" >>"$CALLS"\n'
               '[ "$DEBIAN_FRONTEND" = noninteractive ] || exit 100\n'
               'case " $* " in *" install "*) case " $* " in *" --no-install-recommends "*) ;; '
               '*) echo "E: install without --no-install-recommends: $*" >&2; exit 100;; esac;; esac\n',
    "sudo": '#!/bin/sh\necho "sudo $*" >>"$CALLS"\nexec "$@"\n',
    "id": '#!/bin/sh\n[ "$1" = -u ] && { echo "$FAKE_UID"; exit 0; }\nexec /usr/bin/id "$@"\n',
    "debootstrap": '#!/bin/sh\necho "debootstrap $*" >>"$CALLS"\nexit 1\n',
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


def run_make(target: str, bin_dir: Path, uid: int, calls: Path, **environ: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_UID": str(uid), "CALLS": str(calls),
           **environ}
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
                     f"apt-get DEBIAN_FRONTEND=noninteractive install -y -qq --no-install-recommends {packages}"]


def test_as_a_user_apt_get_runs_through_sudo(fake_tools, tmp_path):
    calls = tmp_path / "calls.log"
    result = run_make("system-packages", fake_tools, uid=1000, calls=calls)
    assert result.returncode == 0, result.stderr
    lines = calls.read_text().splitlines()
    packages = " ".join(makefile_variable("APT_PACKAGES"))
    assert f"sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends {packages}" in lines
    assert f"apt-get DEBIAN_FRONTEND=noninteractive install -y -qq --no-install-recommends {packages}" in lines


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


def test_an_install_with_the_recommends_fails_the_stand_in(fake_tools, tmp_path):
    """The stand-in apt-get the tests above run refuses what the recipe must never do."""
    result = subprocess.run([str(fake_tools / "apt-get"), "install", "-y", "chromium"], capture_output=True, text=True,
                            env={"DEBIAN_FRONTEND": "noninteractive", "CALLS": str(tmp_path / "calls.log")})
    assert result.returncode == 100 and "--no-install-recommends" in result.stderr


def test_a_container_engine_that_is_not_installed_stops_the_image_targets(fake_tools, tmp_path):
    """CONTAINER_ENGINE from the environment is kept by the Makefile's `?=`: one naming no
    installed command fails with a clear error before anything uses it (the image tests would
    skip). `make test` and the image targets run the same check (base-image: the one that needs
    no .venv)."""
    calls = tmp_path / "calls.log"
    result = run_make("base-image", fake_tools, uid=0, calls=calls, CONTAINER_ENGINE="no-such-engine")
    assert result.returncode != 0
    assert 'CONTAINER_ENGINE="no-such-engine" is not an installed command' in result.stderr, result.stderr
    assert not [line for line in calls.read_text().splitlines() if line.startswith("debootstrap ")]
