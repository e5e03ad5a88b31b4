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


# --- Who writes, who acts, and what imports what (issue 22) ---------------------------

# The apps that own models; only their verbs write them.
MODEL_OWNERS = ("audit", "catalog", "fleet", "router")
# Writes outside the verbs, each for a reason no verb could serve.
ALLOWED_WRITERS = {
    "audit/events.py": "the Event writer: record_event is how every verb records itself",
    "fleet/transitions.py": "the compare-and-swap every state change goes through, with its Event",
    "fleet/link/heartbeats.py": "the batched heartbeat UPDATE: one statement for every node heard, "
    "where a verb per heartbeat would cost the control plane the fleet",
    "fleet/leadership.py": "the epoch fence: the highest leader epoch, kept where a Redis "
    "restart cannot take it back",
    "router/usage/accounting.py": "the router's usage table: its own rows, upserted in batches "
    "off the request path by a process that has no verbs (it never writes the catalog)",
}
QUERY_WRITES = {"update", "create", "get_or_create", "update_or_create", "bulk_create",
                "bulk_update", "delete"}  # fmt: skip
QUERY_CHAIN = {"objects", "_default_manager", "filter", "exclude", "all", "select_for_update"}
RAW_WRITES = ("UPDATE", "INSERT", "DELETE")


def python_files(package: str) -> list[Path]:
    return [p for p in sorted((ROOT / package).rglob("*.py")) if "migrations" not in p.parts]


def is_verb_home(path: Path) -> bool:
    """``fleet/actions/*.py`` and ``catalog/actions.py``: where the verbs live."""
    return "actions" in path.relative_to(ROOT).parts[:-1] or path.stem == "actions"


def _chain(node: ast.expr) -> set[str]:
    """The attribute names along a call chain: Node.objects.filter(…).update → {objects, filter}."""
    names = set()
    while isinstance(node, ast.Call | ast.Attribute):
        if isinstance(node, ast.Attribute):
            names.add(node.attr)
            node = node.value
        else:
            node = node.func
    return names


def _sql_text(node: ast.expr, constants: dict[str, str]) -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and node.values:
        return _sql_text(node.values[0], constants)
    if isinstance(node, ast.Name):
        return constants.get(node.id, "")
    return ""


def model_writes(path: Path) -> list[str]:
    """Every call in ``path`` that writes rows: a queryset's update/create/delete, an
    instance's save()/delete(), or SQL that updates, inserts or deletes."""
    tree = ast.parse(path.read_text(), str(path))
    constants = {
        target.id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
        for target in node.targets
        if isinstance(target, ast.Name)
    }  # fmt: skip
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        method, receiver = node.func.attr, node.func.value
        if method in QUERY_WRITES and QUERY_CHAIN & _chain(receiver):
            found.append(f"{node.lineno}: .{method}()")
        elif method in ("save", "delete") and not node.args:
            if not any(keyword.arg == "commit" for keyword in node.keywords):  # a form's save
                found.append(f"{node.lineno}: .{method}()")
        elif method in ("execute", "executemany") and node.args:
            words = _sql_text(node.args[0], constants).split()
            if words and words[0].upper() in RAW_WRITES:
                found.append(f"{node.lineno}: {words[0]} in SQL")
    return found


@pytest.mark.parametrize("package", MODEL_OWNERS)
def test_only_verbs_write_models(package):
    """Views, the API, llmgw_ctl, the admin and the reconciler call verbs; they never save
    a row themselves (DESIGN.md: "Every operator action is one verb function")."""
    stray = [
        f"{path.relative_to(ROOT)}:{write}"
        for path in python_files(package)
        if not is_verb_home(path) and str(path.relative_to(ROOT)) not in ALLOWED_WRITERS
        for write in model_writes(path)
    ]
    assert not stray, "writes outside a verb (move them into one):\n" + "\n".join(stray)


def test_the_rules_find_writes_and_every_allowed_writer_still_writes():
    """A rule that finds nothing passes everything; an allowance nothing uses hides the next."""
    assert model_writes(ROOT / "fleet" / "actions" / "nodes.py")
    idle = [where for where in ALLOWED_WRITERS if not model_writes(ROOT / where)]
    assert not idle, f"allowed writers that no longer write (drop them): {idle}"


def verbs() -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every public function of a verb home, as (where, definition)."""
    found = []
    for package in MODEL_OWNERS:
        for path in python_files(package):
            if not is_verb_home(path):
                continue
            for node in ast.parse(path.read_text(), str(path)).body:
                public = not getattr(node, "name", "_").startswith("_")
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and public:
                    found.append((f"{path.relative_to(ROOT)}:{node.lineno}", node))
    return found


def test_every_verb_takes_a_keyword_only_actor_it_must_be_given():
    """Every write says who acted: an operator, or which part of llmgw (audit.actors)."""
    found = verbs()
    assert len(found) > 20, "the verbs were not found"
    missing = []
    for where, verb in found:
        arguments = verb.args
        names = [argument.arg for argument in arguments.kwonlyargs]
        if "actor" not in names or arguments.kw_defaults[names.index("actor")] is not None:
            missing.append(f"{where} {verb.name}")
    assert not missing, "verbs without a required keyword-only actor:\n" + "\n".join(missing)


def module_imports() -> dict[str, set[str]]:
    """Each of our modules and the modules of ours it imports, wherever the import stands
    (in a function or under TYPE_CHECKING too: a hidden cycle is still one)."""
    paths = {}
    for package in OURS:
        for path in python_files(package):
            parts = path.relative_to(ROOT).with_suffix("").parts
            paths[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, *([node.module] if node.module else [])])
                for alias in node.names:
                    # `from pkg import module` depends on the module, not on pkg/__init__.
                    sub = f"{base}.{alias.name}"
                    targets.add(sub if sub in paths else base)
        graph[name] = {target for target in targets if target in paths and target != name}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in sorted(graph[module]):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return cycles


def test_no_module_imports_itself_back_through_others():
    graph = module_imports()
    assert "fleet.reconcile.report" in graph["fleet.reconcile.passes"], "the imports were not read"
    cycles = import_cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(group) for group in cycles)


def test_the_cycle_finder_finds_a_cycle():
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


# --- Rooms a newcomer can find (issue 22) ---------------------------------------------

MOST_TOP_LEVEL_MODULES = 15
# Packages still flatter than that, each with the reason it may be, for now.
FLAT_FOR_NOW: dict[str, str] = {}


def top_level_modules(package: str) -> list[str]:
    """The modules directly in ``package`` (``__init__`` aside; subpackages are rooms)."""
    return sorted(p.stem for p in (ROOT / package).glob("*.py") if p.stem != "__init__")


@pytest.mark.parametrize("package", sorted(OURS))
def test_no_package_is_a_flat_heap_of_modules(package):
    """Past a dozen or so modules a package needs rooms (subpackages) a newcomer can find
    their way by, as ``fleet/`` has: ``actions``, ``link``, ``reconcile``, ``pages``…"""
    modules = top_level_modules(package)
    if package in FLAT_FOR_NOW:
        assert len(modules) > MOST_TOP_LEVEL_MODULES, f"{package} has rooms now: drop it"
        return
    assert len(modules) <= MOST_TOP_LEVEL_MODULES, (
        f"{package} has {len(modules)} top-level modules (at most {MOST_TOP_LEVEL_MODULES}): "
        f"put some in rooms: {', '.join(modules)}"
    )


def test_the_module_count_reads_real_packages():
    assert {"models", "transitions", "tasks"} <= set(top_level_modules("fleet"))
    assert "reconcile" not in top_level_modules("fleet"), "a subpackage is not a module"


def test_no_test_module_imports_another():
    """A test module imported by another runs its tests' imports (and fixtures) twice and
    ties the two together: what they share lives in tests/support/ or a helper module
    beside them."""
    tests = ROOT / "tests"
    found = []
    for path in sorted(tests.rglob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                if node.level:
                    package = path.relative_to(ROOT).parent.parts
                    up = package[: len(package) - node.level + 1]
                    modules = [".".join([*up, node.module])]
                else:
                    # `from tests.fleet import test_reconciler` imports the test module too.
                    modules = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            else:
                continue
            found += [
                f"{path.relative_to(ROOT)}:{node.lineno} imports {module}"
                for module in modules
                if module.split(".")[0] == "tests" and module.split(".")[-1].startswith("test_")
            ]
    assert not found, "test modules importing test modules:\n" + "\n".join(found)


# --- One concept, one name (issue 22) -------------------------------------------------

# Top-level class names that may repeat across the packages, each with its reason.
SHARED_CLASS_NAMES = {
    "Command": "Django finds a management command by this name in its module "
    "(llmgw_cli/management/commands/*.py)",
}


def top_level_classes() -> dict[str, list[str]]:
    """Each class name defined at the top of a module of ours, and where (migrations aside)."""
    found: dict[str, list[str]] = {}
    for package in sorted(OURS):
        for path in python_files(package):
            for node in ast.parse(path.read_text(), str(path)).body:
                if isinstance(node, ast.ClassDef):
                    where = f"{path.relative_to(ROOT)}:{node.lineno}"
                    found.setdefault(node.name, []).append(where)
    return found


def test_each_top_level_class_name_names_one_class():
    """Two ``RouterConfig``s (the router's knobs, its Django app) or three ``Usage``s (a
    node's heartbeat, the router's pending counts, its usage rows) make every import of
    one a question; a name met in a traceback or a grep leads to one definition."""
    repeated = [
        f"{name}: {', '.join(places)}"
        for name, places in sorted(top_level_classes().items())
        if len(places) > 1 and name not in SHARED_CLASS_NAMES
    ]
    assert not repeated, "class names defined more than once (rename all but one):\n" + (
        "\n".join(repeated)
    )


def test_the_class_names_read_are_real_and_every_shared_name_is_still_shared():
    classes = top_level_classes()
    assert {"Node", "RoutingTable", "NodeUsage"} <= set(classes), "the classes were not read"
    idle = [name for name in SHARED_CLASS_NAMES if len(classes.get(name, ())) < 2]
    assert not idle, f"shared class names no longer shared (drop them): {idle}"
