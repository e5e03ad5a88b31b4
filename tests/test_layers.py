"""The floors of DESIGN.md ("Apps and what each may import"), read from the source with
``ast`` so they stay true: a package imports only from its own floor or below."""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterable
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
    "llmgw_cli/management/commands/llmgw_admin.py": "the first operator account, made before "
    "there is anyone to act: Django's createsuperuser, as `llmgw up` runs it",
}
QUERY_WRITES = {"update", "create", "get_or_create", "update_or_create", "bulk_create",
                "bulk_update", "delete"}  # fmt: skip
QUERY_CHAIN = {"objects", "_default_manager", "filter", "exclude", "all", "select_for_update"}
# What only a related manager writes with (``node.shards.add(shard)``), beside QUERY_WRITES.
RELATED_WRITES = {"add", "remove", "clear", "set"}
RAW_WRITES = ("UPDATE", "INSERT", "DELETE")


def python_files(package: str, root: Path = ROOT) -> list[Path]:
    return [p for p in sorted((root / package).rglob("*.py")) if "migrations" not in p.parts]


def is_verb_home(path: Path) -> bool:
    """``fleet/actions/*.py`` and ``catalog/actions/*.py``: where the verbs live."""
    return "actions" in path.relative_to(ROOT).parts[:-1] or path.stem == "actions"


@functools.cache
def related_managers() -> frozenset[str]:
    """The names our models give their reverse relations (``related_name="shards"``), by
    which a row reaches the rows that point at it: ``node.shards.create(…)`` writes."""
    names = set()
    for package in OURS:
        for path in python_files(package):
            if path.name != "models.py":
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                for keyword in getattr(node, "keywords", []) if isinstance(node, ast.Call) else []:
                    value = keyword.value
                    if keyword.arg == "related_name" and isinstance(value, ast.Constant):
                        names.add(value.value)
    return frozenset(name for name in names if name.isidentifier())


def _chain(node: ast.expr) -> tuple[list[str], str | None]:
    """The attribute names along a call chain, nearest first, and the name it starts from:
    ``Node.objects.filter(…).update`` → ``(["filter", "objects"], "Node")``."""
    names = []
    while isinstance(node, ast.Call | ast.Attribute):
        if isinstance(node, ast.Attribute):
            names.append(node.attr)
            node = node.value
        else:
            node = node.func
    return names, node.id if isinstance(node, ast.Name) else None


def _assignments(tree: ast.AST) -> list[tuple[str, ast.expr]]:
    """Every ``name = value`` in the tree, at any depth (a local is as good as a constant)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign | ast.NamedExpr) and node.value is not None:
            targets = [node.target]
        else:
            continue
        found += [(target.id, node.value) for target in targets if isinstance(target, ast.Name)]
    return found


def _sql_texts(node: ast.expr, strings: dict[str, list[str]]) -> list[str]:
    """The SQL a statement argument may hold: a literal, an f-string's start, a
    concatenation's or ``%``'s left side, a ``.format()``'s text, or a name's every value."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.JoinedStr) and node.values:
        return _sql_texts(node.values[0], strings)
    if isinstance(node, ast.BinOp):
        return _sql_texts(node.left, strings)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return _sql_texts(node.func.value, strings) if node.func.attr == "format" else []
    if isinstance(node, ast.Name):
        return strings.get(node.id, [])
    return []


def writes_in(
    source: str, where: str = "<source>", related: frozenset[str] = frozenset()
) -> list[str]:
    """Every call in ``source`` that writes rows: a queryset's update/create/delete (held in
    a variable or not), a related manager's (``node.shards.create``), an instance's
    save()/delete(), or SQL that updates, inserts or deletes (literal, or in a variable)."""
    tree = ast.parse(source, where)
    assigned = _assignments(tree)
    strings: dict[str, list[str]] = {}
    for name, value in assigned:
        strings.setdefault(name, []).extend(_sql_texts(value, {}))
    manages = set(related)

    def is_query(receiver: ast.expr, querysets: set[str]) -> bool:
        attrs, root = _chain(receiver)
        return bool(QUERY_CHAIN & set(attrs) or root in querysets or manages & set(attrs)) or any(
            attr.endswith("_set") for attr in attrs
        )

    # Names that hold a queryset, and names that hold one made from those (qs2 = qs.filter()).
    querysets: set[str] = set()
    while True:
        held = {name for name, value in assigned if is_query(value, querysets)}
        if held <= querysets:
            break
        querysets |= held
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        method, receiver = node.func.attr, node.func.value
        if method in QUERY_WRITES and is_query(receiver, querysets):
            found.append(f"{node.lineno}: .{method}()")
        elif (
            method in RELATED_WRITES
            and isinstance(receiver, ast.Attribute)
            and (receiver.attr in manages or receiver.attr.endswith("_set"))
        ):
            found.append(f"{node.lineno}: .{receiver.attr}.{method}()")
        elif method in ("save", "delete") and not node.args:
            if not any(keyword.arg == "commit" for keyword in node.keywords):  # a form's save
                found.append(f"{node.lineno}: .{method}()")
        elif method in ("execute", "executemany") and node.args:
            for text in _sql_texts(node.args[0], strings):
                words = text.split()
                if words and words[0].upper() in RAW_WRITES:
                    found.append(f"{node.lineno}: {words[0]} in SQL")
                    break
    return found


def model_writes(path: Path) -> list[str]:
    return writes_in(path.read_text(), str(path), related_managers())


@pytest.mark.parametrize("package", sorted(OURS))
def test_only_verbs_write_models(package):
    """Views, the API, llmgw_ctl, the admin and the reconciler call verbs; they never save
    a row themselves (DESIGN.md: "Every operator action is one verb function"). Every
    package is read: one with no models of its own may still write another's."""
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
    assert "shards" in related_managers(), "the models' related names were not read"
    idle = [where for where in ALLOWED_WRITERS if not model_writes(ROOT / where)]
    assert not idle, f"allowed writers that no longer write (drop them): {idle}"


WRITES = {
    "a queryset's write": 'Node.objects.filter(id="a").update(state="lost")',
    "a create on the manager": 'Replica.objects.create(model_name="m")',
    "an instance's save": "node.save()",
    "an instance's delete": "node.delete()",
    "a queryset in a variable": 'qs = Node.objects.filter(id="a")\nqs.update(state="lost")',
    "a queryset made from one in a variable": (
        'qs = Node.objects.all()\nlive = qs.exclude(state="lost")\nlive.update(draining=True)'
    ),
    "an annotated queryset in a function": (
        "def f():\n    qs: QuerySet = Shard.objects.all()\n    return qs.delete()"
    ),
    "a related manager's create": "node.shards.create(rank=0)",
    "a related manager's update": 'replica.shards.update(state="stopped")',
    "a related manager's add": "replica.shards.add(shard)",
    "a default related manager's create": "node.shard_set.create(rank=0)",
    "SQL in a literal": 'cursor.execute("UPDATE fleet_node SET state = %s", ["lost"])',
    "SQL in a module constant": 'SQL = "DELETE FROM fleet_node"\ncursor.execute(SQL)',
    "SQL in a local variable": (
        'def f(cursor):\n    sql = "INSERT INTO fleet_node (id) VALUES (%s)"\n'
        '    cursor.execute(sql, ["a"])'
    ),
    "SQL in an f-string local": (
        'def f(cursor, table):\n    sql = f"UPDATE {table} SET state = 1"\n    cursor.execute(sql)'
    ),
    "SQL in a concatenation": 'cursor.execute("DELETE FROM " + table)',
}
NOT_WRITES = {
    "a dict's update": "fields = {}\nfields.update(other)",
    "a cache's clear": "self.cache.clear()",
    "a set's add": "seen = set()\nseen.add(1)",
    "a read in SQL": 'sql = "SELECT 1"\ncursor.execute(sql)',
    "a form's save without commit": "form.save(commit=False)",
    "a file's write": 'path.write_text("x")',
}


@pytest.mark.parametrize("source", WRITES.values(), ids=WRITES.keys())
def test_the_write_detector_finds_each_shape_of_write(source):
    assert writes_in(source, related=frozenset({"shards"})), source


@pytest.mark.parametrize("source", NOT_WRITES.values(), ids=NOT_WRITES.keys())
def test_the_write_detector_leaves_what_writes_no_row(source):
    assert not writes_in(source, related=frozenset({"shards"})), source


# The functions that record an Event or move a state, by the module that defines them.
EVENT_WRITERS = {
    "audit.events": {"record_event", "record_events", "record_news"},
    "fleet.transitions": {"transition"},
}
EVENT_WRITER_HOMES = {
    "audit/events.py": "where record_event, record_events and record_news are defined",
    "fleet/transitions.py": "the compare-and-swap, which records its own Event",
}


def event_writes_in(source: str, where: str = "<source>") -> list[str]:
    """Every call in ``source`` of an Event writer or ``transition``: by the name imported
    from its module, or through the module (``events.record_event``), wherever imported."""
    tree = ast.parse(source, where)
    functions: dict[str, str] = {}  # local name -> the writer it is
    modules: dict[str, str] = {}  # local name -> the writers' module it is
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in EVENT_WRITERS:
            for alias in node.names:
                if alias.name in EVENT_WRITERS[node.module]:
                    functions[alias.asname or alias.name] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                if f"{node.module}.{alias.name}" in EVENT_WRITERS:
                    modules[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in EVENT_WRITERS:
                    modules[alias.asname or alias.name] = alias.name
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id in functions:
            found.append(f"{node.lineno} calls {functions[func.id]}()")
        elif isinstance(func, ast.Attribute):
            module = ast.unparse(func.value)
            if func.attr in EVENT_WRITERS.get(modules.get(module, module), ()):
                found.append(f"{node.lineno} calls {func.attr}()")
    return found


@pytest.mark.parametrize("package", sorted(OURS))
def test_only_verbs_record_events_and_move_states(package):
    """An Event or a state change outside a verb is a write in all but name: the liveness
    check, the heartbeat batch, the reconciler and sign-in call verbs for theirs too."""
    stray = [
        f"{path.relative_to(ROOT)}:{write}"
        for path in python_files(package)
        if not is_verb_home(path) and str(path.relative_to(ROOT)) not in EVENT_WRITER_HOMES
        for write in event_writes_in(path.read_text(), str(path))
    ]
    assert not stray, "Events or transitions outside a verb (make it one):\n" + "\n".join(stray)


EVENT_WRITES = {
    "an imported writer": "from audit.events import record_event\nrecord_event(k, s, r, actor=a)",
    "a renamed writer": "from audit.events import record_news as say\nsay(kind, s, r, actor=a)",
    "a writer through its module": "from audit import events\nevents.record_events(k, [s], r)",
    "a transition in a function": (
        "def f():\n    from fleet.transitions import transition\n"
        "    transition(Node, 'a', 'lost', 'silent', actor=a)"
    ),
    "a transition by its dotted path": (
        "import fleet.transitions\nfleet.transitions.transition(Node, 'a', 'lost', 'r', actor=a)"
    ),
}


@pytest.mark.parametrize("source", EVENT_WRITES.values(), ids=EVENT_WRITES.keys())
def test_the_event_detector_finds_each_shape(source):
    assert event_writes_in(source), source


def test_the_event_detector_leaves_other_transitions_alone():
    """The agent's shard runs have a ``transition`` method of their own: not a write."""
    assert not event_writes_in("run.transition('ready', reason, seq=1)")


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


def test_every_verb_reads_its_actor():
    """A verb that is told who acted and never says so (in its Event, or to the verb it
    calls) keeps the rule in letter only."""
    unread = [
        f"{where} {verb.name}"
        for where, verb in verbs()
        if not any(isinstance(node, ast.Name) and node.id == "actor" for node in ast.walk(verb))
    ]
    assert not unread, "verbs that never read their actor:\n" + "\n".join(unread)


def module_imports(packages: Iterable[str] = OURS, root: Path = ROOT) -> dict[str, set[str]]:
    """Each of our modules and the modules of ours it imports, wherever the import stands
    (in a function or under TYPE_CHECKING too: a hidden cycle is still one)."""
    paths = {}
    for package in packages:
        for path in python_files(package, root):
            parts = path.relative_to(root).with_suffix("").parts
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


@functools.cache
def our_imports() -> dict[str, set[str]]:
    """``module_imports()`` of every package of ours, read once for all the tests here."""
    return module_imports()


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
    graph = our_imports()
    assert "fleet.reconcile.report" in graph["fleet.reconcile.passes"], "the imports were not read"
    cycles = import_cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(group) for group in cycles)


def test_the_cycle_finder_finds_a_cycle():
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


# --- Rooms that form floors (issue 37) ----------------------------------------------


def room_imports(package: str, graph: dict[str, set[str]]) -> dict[str, dict[str, list[str]]]:
    """Each room of ``package`` (a subpackage, or a module at its top; its ``__init__`` is
    a room of its own) and, for each room of the package it imports, the imports that do."""
    depth = package.count(".") + 1

    def room(module: str) -> str | None:
        parts = module.split(".")
        if parts[:depth] != package.split("."):
            return None
        return parts[depth] if len(parts) > depth else "__init__"

    rooms: dict[str, dict[str, list[str]]] = {}
    for module, targets in sorted(graph.items()):
        here = room(module)
        if here is None:
            continue
        imported = rooms.setdefault(here, {})
        for target in sorted(targets):
            there = room(target)
            if there is not None and there != here:
                imported.setdefault(there, []).append(f"{module} imports {target}")
    return rooms


def room_loops(package: str, graph: dict[str, set[str]]) -> list[str]:
    """Rooms of ``package``, or of any package inside it, that import each other (however
    indirectly), each loop with the imports that close it."""
    packages = {package} | {
        module.rpartition(".")[0] for module in graph if module.startswith(f"{package}.")
    }
    loops = []
    for inside in sorted(p for p in packages if p == package or p in graph):
        rooms = room_imports(inside, graph)
        for group in import_cycles({room: set(targets) for room, targets in rooms.items()}):
            closing = [
                why for a in group for b, whys in rooms[a].items() if b in group for why in whys
            ]
            loops.append(f"{inside}: {' <-> '.join(group)} ({'; '.join(closing)})")
    return loops


@pytest.mark.parametrize("package", sorted(OURS))
def test_rooms_form_floors(package):
    """Inside a package a room imports only rooms below it (STYLE.md, "Rooms form floors
    too"): what two rooms both need lives in a room under both, not beside its first user.
    Imports in functions and under TYPE_CHECKING count: a loop one hides is still one."""
    loops = room_loops(package, our_imports())
    assert not loops, "rooms that import each other:\n" + "\n".join(loops)


def test_the_room_rule_reads_real_rooms():
    rooms = room_imports("fleet", our_imports())
    assert {"actions", "planning", "reconcile", "models"} <= set(rooms), "the rooms were not read"
    assert "planning" in rooms["reconcile"] and "planning" in rooms["actions"]


HIDDEN_IMPORTS = {
    "in a function": "def verb():\n    from tiny.high import verb\n    return verb\n",
    "under TYPE_CHECKING": (
        "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from tiny.high import verb\n"
    ),
}


@pytest.mark.parametrize("hidden", HIDDEN_IMPORTS.values(), ids=HIDDEN_IMPORTS.keys())
def test_the_room_rule_fails_on_a_planted_loop(tmp_path, hidden):
    """Two rooms of a tiny package that import each other, one of them out of sight."""
    tiny = tmp_path / "tiny"
    (tiny / "low").mkdir(parents=True)
    (tiny / "__init__.py").write_text('"""Rooms: ``low`` and ``high``."""\n')
    (tiny / "low" / "__init__.py").write_text("")
    (tiny / "low" / "helpers.py").write_text(hidden)
    (tiny / "high.py").write_text("from tiny.low.helpers import verb\n")
    (tiny / "apart.py").write_text("from tiny.high import verb\n")  # above both: no loop

    loops = room_loops("tiny", module_imports(["tiny"], tmp_path))

    assert loops == [
        "tiny: high <-> low (tiny.high imports tiny.low.helpers; "
        "tiny.low.helpers imports tiny.high)"
    ]


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


# --- Small modules, short functions (issue 37) ----------------------------------------

MOST_LINES_A_MODULE = 450
MOST_LINES_A_FUNCTION = 80


@pytest.mark.parametrize("package", sorted(OURS))
def test_no_module_or_function_outgrows_one_concept(package):
    """Past ~450 lines a module holds more than one concept, past 80 a function does more
    than one thing (STYLE.md): split by concept before it gets there."""
    too_long = []
    for path in python_files(package):
        where = path.relative_to(ROOT)
        text = path.read_text()
        if (lines := len(text.splitlines())) > MOST_LINES_A_MODULE:
            too_long.append(f"{where}: {lines} lines")
        for node in ast.walk(ast.parse(text, str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MOST_LINES_A_FUNCTION:
                    too_long.append(f"{where}:{node.lineno} {node.name}(): {length} lines")
    assert not too_long, "too long (split by concept):\n" + "\n".join(too_long)


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
