"""What is installed is what was reviewed: the lock files pin every dependency pyproject.toml
names, each with the sha256 of its files, the test lock agrees with the run lock, and every
installer (`make run`, `make test`, a node's install.sh, the image) requires the hashes.
A dependency added to pyproject.toml without `make lock` fails here, not on a node.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parent.parent
RUN_LOCK = REPO / "fleet" / "ctl" / "requirements.lock"
TEST_LOCK = REPO / "requirements-test.lock"
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)((?:\s*\\\n\s*--hash=sha256:[0-9a-f]{64})*)",
                 re.MULTILINE)  # fmt: skip


def pins(text: str) -> dict[str, tuple[str, int]]:
    """Each pinned package: its version and how many file hashes the lock gives it."""
    return {
        canonicalize_name(name): (version, hashes.count("--hash=sha256:"))
        for name, version, hashes in PIN.findall(text)
    }


def declared(extra: str | None = None) -> set[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    names = project["dependencies"] if extra is None else project["optional-dependencies"][extra]
    return {canonicalize_name(Requirement(name).name) for name in names}


def test_every_dependency_is_pinned_with_its_hashes():
    run, test = pins(RUN_LOCK.read_text()), pins(TEST_LOCK.read_text())
    assert len(run) > 30 and len(test) > len(run), "the lock's pins were not read"
    assert declared() - run.keys() == set(), "run `make lock` after changing pyproject.toml"
    assert declared("test") - test.keys() == set(), "run `make lock`"
    assert [name for name, (_, hashes) in {**run, **test}.items() if hashes == 0] == []


def test_the_test_lock_installs_the_run_lock_s_versions():
    run, test = pins(RUN_LOCK.read_text()), pins(TEST_LOCK.read_text())
    assert {name: test.get(name, ("missing", 0))[0] for name in run} == {
        name: version for name, (version, _) in run.items()
    }


def test_every_installer_requires_the_hashes():
    makefile = (REPO / "Makefile").read_text()
    install_sh = (REPO / "fleet" / "ctl" / "onboard_install.sh").read_text()
    dockerfile = (REPO / "Dockerfile").read_text()
    llama = (REPO / "scripts" / "ensure-llama-server").read_text()
    assert "pip install --quiet --require-hashes -r $(RUN_LOCK)" in makefile
    assert "pip install --quiet --require-hashes -r $(TEST_LOCK)" in makefile
    assert install_sh.count('--require-hashes -r "$HERE/requirements.lock"') == 2
    assert "--require-hashes -r fleet/ctl/requirements.lock" in dockerfile
    assert re.search(r"^source_sha256=[0-9a-f]{64}$", llama, re.MULTILINE)
    assert "--require-hashes" in llama
    # Nothing else the Makefile installs skips the locks, but the tools that write the lock
    # and compile llama-server.
    unlocked = [line.strip() for line in makefile.splitlines() if "pip install" in line
                and "--require-hashes" not in line and "--no-deps" not in line]  # fmt: skip
    assert unlocked == [
        "$(BIN)/pip install --quiet ninja cmake",
        '$(BIN)/pip install --quiet "pip-tools>=7.4"',
    ]
