"""The floors of DESIGN.md ("Apps and what each may import"), read from the source with
``ast`` so they stay true: a package imports only from its own floor or below."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
OURS = {
    "protocol", "core", "placement", "audit", "catalog", "fleet", "router", "agent_worker",
    "llmgw_site", "llmgw_cli",
}  # fmt: skip

# What each package may import of ours, besides itself.
MAY_IMPORT = {
    "protocol": set(),
    "core": set(),
    "placement": {"core"},
    "audit": {"protocol", "core"},
    "catalog": {"protocol", "core", "audit"},
    "fleet": {"protocol", "core", "placement", "audit", "catalog"},
    "router": {"protocol", "core", "audit", "catalog", "fleet"},
    "agent_worker": {"protocol", "core"},
    "llmgw_site": {"protocol", "core", "audit", "catalog", "fleet", "router"},
    "llmgw_cli": OURS,
}
# Floors that never touch the database: no Django models, nor the ORM under them.
NO_MODELS = ("protocol", "core", "placement", "agent_worker")


def imports_of(package: str) -> list[tuple[str, int, str]]:
    """(file, line, imported module) for every absolute import in ``package``."""
    found = []
    for path in sorted((ROOT / package).rglob("*.py")):
        if "migrations" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                modules = [node.module]
            else:
                continue
            where = str(path.relative_to(ROOT))
            found += [(where, node.lineno, module) for module in modules]
    return found


@pytest.mark.parametrize("package", sorted(MAY_IMPORT))
def test_each_package_imports_only_its_floor_or_below(package):
    allowed = MAY_IMPORT[package] | {package}
    climbing = [
        f"{where}:{line} imports {module}"
        for where, line, module in imports_of(package)
        if module.split(".")[0] in OURS and module.split(".")[0] not in allowed
    ]
    assert not climbing, "\n".join(climbing)


@pytest.mark.parametrize("package", NO_MODELS)
def test_the_floors_without_a_database_import_no_models(package):
    def touches_models(module: str) -> bool:
        top = module.split(".")[0]
        return (
            module.startswith(("django.db", "django.contrib"))
            or module.endswith(".models")
            and top in OURS
        )

    offending = [
        f"{where}:{line} imports {module}"
        for where, line, module in imports_of(package)
        if touches_models(module)
    ]
    assert not offending, "\n".join(offending)


def test_the_agent_imports_no_django_at_all():
    """It runs on nodes that have no database and no settings."""
    django = [
        f"{where}:{line} imports {module}"
        for where, line, module in imports_of("agent_worker")
        if module.split(".")[0] == "django"
    ]
    assert not django, "\n".join(django)


def test_the_rules_read_real_imports():
    """A check that finds no imports would pass everything: make sure it reads them."""
    fleet = {module for _where, _line, module in imports_of("fleet")}
    assert {"catalog.models", "placement", "audit.events"} <= fleet


@pytest.mark.parametrize("package", ("protocol", "core", "placement"))
def test_the_bottom_floors_import_no_django(package):
    """Settings are read above them: they take what they need as arguments."""
    offending = [
        f"{where}:{line} imports {module}"
        for where, line, module in imports_of(package)
        if module.split(".")[0] in ("django", "rest_framework", "channels")
    ]
    assert not offending, "\n".join(offending)
