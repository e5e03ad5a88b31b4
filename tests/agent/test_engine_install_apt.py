"""A new machine's apt, which cloud-init may hold for minutes; the retry schedule of a
failed install; and which build fits which node."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from agent_worker.engines.install import AptSettings, InstallError, NodeTarget, choose_build
from agent_worker.engines.install.apt import dpkg_has
from protocol.engines import EngineBuild, WantedEngine
from tests.agent.engine_archives import Clock, make_installer, release, tar_gz, wanted
from tests.agent.weights_server import WeightsServer
from tests.support.polling import wait_until

HOLD_LOCK = """
import fcntl, sys
lock = open(sys.argv[1], "w")
fcntl.lockf(lock, fcntl.LOCK_EX)
print("locked", flush=True)
sys.stdin.read()
"""


@pytest.fixture
def archive_server():
    server = WeightsServer(tar_gz(release()), name="llama-b6000.tar.gz")
    yield server
    server.stop()


def executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


def fake_apt(tmp_path: Path, exit_code: int = 0, says: str = "") -> Path:
    """An apt-get that records its arguments, says ``says`` and exits ``exit_code``."""
    return executable(tmp_path / "apt-get", f"#!/bin/sh\necho \"$@\" >> {tmp_path / 'apt-calls'}\n"
                      f"echo '{says}' >&2\nexit {exit_code}\n")  # fmt: skip


# A fresh image's apt: no package lists until `update`, so `install` cannot find anything
# before it; `update` fails on the lists' lock while the file `lists-locked` exists.
FRESH_APT = """#!/bin/sh
echo "$@" >> {home}/apt-calls
case "$1" in
update)
    if [ -e {home}/lists-locked ]; then
        rm {home}/lists-locked
        echo "E: Could not get lock /var/lib/apt/lists/lock. It is held by process 42" >&2
        exit 100
    fi
    touch {home}/lists ;;
install)
    shift 4  # install -y --no-install-recommends --
    for package in "$@"; do
        if [ ! -e {home}/lists ]; then echo "E: Unable to locate package $package" >&2; exit 100; fi
        echo "$package" >> {home}/installed
    done ;;
esac
"""
# dpkg-query -W --showformat=${{Status}} PACKAGE, answered from the file `installed`.
FAKE_DPKG_QUERY = """#!/bin/sh
for package; do :; done
if grep -qx "$package" {home}/installed 2>/dev/null; then printf 'install ok installed'; exit 0; fi
echo "dpkg-query: no packages found matching $package" >&2
exit 1
"""


def fake_dpkg_query(tmp_path: Path, installed: tuple[str, ...] = ()) -> Path:
    (tmp_path / "installed").write_text("".join(f"{name}\n" for name in installed))
    return executable(tmp_path / "dpkg-query", FAKE_DPKG_QUERY.format(home=tmp_path))


def apt_settings(
    tmp_path: Path, script: Path, lock: Path, installed: tuple[str, ...] = (), root: bool = True
) -> AptSettings:
    return AptSettings(
        command=(str(script),), query=(str(fake_dpkg_query(tmp_path, installed)),),
        lock_paths=(str(lock),), lock_wait=30, poll=0.05, is_root=lambda: root,
    )  # fmt: skip


def apt_calls(tmp_path: Path) -> list[str]:
    calls = tmp_path / "apt-calls"
    return calls.read_text().splitlines() if calls.exists() else []


def test_a_held_apt_lock_is_waited_for_then_the_install_goes_on(archive_server, tmp_path):
    lock = tmp_path / "lock-frontend"
    lock.touch()
    script = fake_apt(tmp_path)
    installer = make_installer(tmp_path, apt=apt_settings(tmp_path, script, lock))
    # Another process holds the lock, as cloud-init's apt would.
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(lock)], text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "locked"
        installer.want([wanted(archive_server.url, archive_server.sha256, packages=["libgomp1"])])
        passing = threading.Thread(target=installer.converge_once)
        passing.start()
        wait_until(lambda: installer.statuses()[0].words == "waiting: another apt-get is running")
        assert not (tmp_path / "apt-calls").exists()  # not run while the lock is held
    finally:
        holder.stdin.close()  # the other apt-get finishes
        holder.wait(10)
    passing.join(20)

    assert installer.statuses()[0].status == "installed"
    assert apt_calls(tmp_path) == ["update", "install -y --no-install-recommends -- libgomp1"]


def test_any_other_apt_failure_is_reported_at_once_with_its_last_lines(archive_server, tmp_path):
    script = fake_apt(tmp_path, exit_code=100, says="E: Unable to locate package libgomp9")
    installer = make_installer(tmp_path, apt=apt_settings(tmp_path, script, tmp_path / "none"))

    installer.want([wanted(archive_server.url, archive_server.sha256, packages=["libgomp9"])])
    installer.converge_once()

    status = installer.statuses()[0]
    assert status.status == "failed"
    assert "install -y --no-install-recommends -- libgomp9 failed" in status.detail
    assert "E: Unable to locate package libgomp9" in status.detail
    assert len(apt_calls(tmp_path)) == 2  # update, install: neither retried


def test_a_fresh_image_updates_its_package_lists_before_installing(archive_server, tmp_path):
    # A new image ships without package lists: install alone says "Unable to locate".
    script = executable(tmp_path / "apt-get", FRESH_APT.format(home=tmp_path))
    installer = make_installer(tmp_path, apt=apt_settings(tmp_path, script, tmp_path / "none"))

    installer.want([wanted(archive_server.url, archive_server.sha256,
                           packages=["libgomp1", "libcurl4"])])  # fmt: skip
    installer.converge_once()

    assert installer.statuses()[0].status == "installed", installer.statuses()[0].detail
    assert apt_calls(tmp_path) == [
        "update", "install -y --no-install-recommends -- libgomp1 libcurl4"
    ]  # fmt: skip


def test_a_lock_on_the_package_lists_is_waited_for_like_any_other(archive_server, tmp_path):
    script = executable(tmp_path / "apt-get", FRESH_APT.format(home=tmp_path))
    (tmp_path / "lists-locked").touch()  # cloud-init's apt-get update is running
    installer = make_installer(tmp_path, apt=apt_settings(tmp_path, script, tmp_path / "none"))
    said = []
    installer.on_change = lambda: said.append(installer.statuses()[0].words)

    installer.want([wanted(archive_server.url, archive_server.sha256, packages=["libgomp1"])])
    installer.converge_once()

    assert installer.statuses()[0].status == "installed", installer.statuses()[0].detail
    assert "waiting: another apt-get is running" in said
    assert apt_calls(tmp_path) == [
        "update", "update", "install -y --no-install-recommends -- libgomp1"
    ]  # fmt: skip


def test_packages_apt_would_read_as_options_are_refused_before_apt_runs(archive_server, tmp_path):
    # What a hostile control plane would send: apt-get parses options after its command, and
    # -o DPkg::Pre-Invoke runs any command as root.
    script = fake_apt(tmp_path)
    installer = make_installer(tmp_path, apt=apt_settings(tmp_path, script, tmp_path / "none"))
    hostile = EngineBuild.model_construct(
        name="cpu-x64", url=archive_server.url, sha256=archive_server.sha256,
        packages=["libgomp1", "-o", "DPkg::Pre-Invoke::=touch /tmp/pwned"],
        platform="linux-x86_64", accelerator="cpu",
    )  # fmt: skip

    installer.want([WantedEngine(name="llama.cpp", version="b6000", builds=[hostile])])
    installer.converge_once()

    status = installer.statuses()[0]
    assert status.status == "failed"
    assert "'-o' is not a Debian package name" in status.detail, status.detail
    assert apt_calls(tmp_path) == []


def test_a_build_naming_an_apt_option_as_a_package_is_refused_by_its_schema():
    with pytest.raises(ValueError, match="'-o' is not a Debian package name"):
        EngineBuild(name="b", url="https://x/b.tar.gz", sha256="a" * 64, packages=["-o", "x"])


def test_packages_dpkg_already_has_are_not_installed_again(archive_server, tmp_path):
    script = fake_apt(tmp_path, exit_code=100, says="E: not to be run")
    apt = apt_settings(tmp_path, script, tmp_path / "none", installed=("libgomp1",), root=False)
    installer = make_installer(tmp_path, apt=apt)

    installer.want([wanted(archive_server.url, archive_server.sha256, packages=["libgomp1"])])
    installer.converge_once()

    assert installer.statuses()[0].status == "installed", installer.statuses()[0].detail
    assert apt_calls(tmp_path) == []  # nor is root needed for what is there


def test_an_agent_not_allowed_to_install_says_so_in_one_line(archive_server, tmp_path):
    script = fake_apt(tmp_path)
    apt = apt_settings(tmp_path, script, tmp_path / "none", installed=("libgomp1",), root=False)
    installer = make_installer(tmp_path, apt=apt)

    installer.want([wanted(archive_server.url, archive_server.sha256,
                           packages=["libgomp1", "libcurl4"])])  # fmt: skip
    installer.converge_once()

    status = installer.statuses()[0]
    assert status.status == "failed"
    assert "\n" not in status.detail
    assert "needs libcurl4" in status.detail and "libgomp1" not in status.detail
    assert "not root" in status.detail
    assert "apt-get install -y libcurl4" in status.detail  # the fix, ready to paste
    assert apt_calls(tmp_path) == []


def test_a_failed_install_is_retried_after_1_2_4_8_then_every_10_minutes(tmp_path):
    clock = Clock()
    installer = make_installer(tmp_path, clock=clock)
    arm_only = wanted("http://127.0.0.1:9/x.tar.gz", "0" * 64, platform="linux-aarch64")
    installer.want([arm_only])

    delays = []
    for _ in range(6):
        installer.converge_once()
        due = installer.next_attempt_at("llama.cpp", "b6000")
        delays.append(due - clock.now)
        clock.now = due - 1
        installer.converge_once()  # a second early: not tried
        assert installer.next_attempt_at("llama.cpp", "b6000") == due
        clock.now = due

    assert delays == [60, 120, 240, 480, 600, 600]
    assert "has no build for linux-x86_64" in installer.statuses()[0].detail


def build(name: str, **fields) -> EngineBuild:
    return EngineBuild(name=name, url=f"https://x/{name}.tar.gz", sha256="a" * 64, **fields)


ENGINE = WantedEngine(
    name="llama.cpp",
    version="b6000",
    builds=[
        build("cpu-x64"),
        build("cuda-x64", accelerator="cuda>=12.4"),
        build("cpu-arm", platform="linux-aarch64"),
        build("cuda-arm", platform="linux-aarch64", accelerator="cuda>=12.8"),
    ],
)


@pytest.mark.parametrize(
    ("platform", "cuda", "chosen"),
    [
        ("linux-x86_64", "12.6", "cuda-x64"),  # a driver, and a build it can run
        ("linux-x86_64", "", "cpu-x64"),  # no driver
        ("linux-x86_64", "12.2", "cpu-x64"),  # the driver is too old for the CUDA build
        ("linux-aarch64", "12.8", "cuda-arm"),
    ],
)
def test_the_build_that_fits_the_node_is_chosen(platform, cuda, chosen):
    assert choose_build(ENGINE, NodeTarget(platform, cuda)).name == chosen


def test_no_fitting_build_is_explained():
    cuda_only = WantedEngine(name="llama.cpp", version="b6000",
                             builds=[build("cuda-x64", accelerator="cuda>=12.4")])  # fmt: skip

    with pytest.raises(InstallError, match="only CUDA builds this node's driver \\(CUDA 12.2\\)"):
        choose_build(cuda_only, NodeTarget("linux-x86_64", "12.2"))
    with pytest.raises(InstallError, match="only CUDA builds, and this node has no NVIDIA driver"):
        choose_build(cuda_only, NodeTarget("linux-x86_64"))
    with pytest.raises(InstallError, match="no build for linux-aarch64 \\(builds: cuda-x64 for"):
        choose_build(cuda_only, NodeTarget("linux-aarch64"))


def test_the_shipped_agent_unit_runs_the_agent_as_root_so_apt_can_install():
    # As onboarding's unit does: an agent under a user of its own could install no package.
    unit = Path(__file__).resolve().parents[2] / "deploy" / "systemd" / "llmgw-agent.service"
    users = [line for line in unit.read_text().splitlines() if line.startswith("User=")]
    assert users in ([], ["User=root"])


@pytest.mark.skipif(shutil.which("dpkg-query") is None, reason="no dpkg on this machine")
def test_the_real_dpkg_says_what_is_installed():
    assert dpkg_has("dpkg", AptSettings())
    assert not dpkg_has("llmgw-no-such-package", AptSettings())
