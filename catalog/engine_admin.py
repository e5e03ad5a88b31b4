"""What only an engine admin may put in the catalog: whatever makes nodes run code of its
author's choosing, as root.

That is every engine version (an archive is a program and its sha256 is its author's own
word; a pip version is whatever the index serves; apt packages are installed as root), a
profile env name that a loader or an interpreter reads to find code (``LD_PRELOAD``,
``PATH``, ``PYTHONPATH``…), and an engine flag that imports or writes code beyond the
engine's own release (``--trust-remote-code`` runs the Python a model's repository ships).
An operator may keep what an engine admin set: only what a change adds is checked, and
the refusal names the field, the value and the group that may.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from django.db import models

from audit.actors import Actor
from catalog.models import Engine, Profile
from catalog.permissions import ENGINE_ADMINS_GROUP, is_engine_admin
from catalog.plan import Change
from catalog.schema import CatalogError, CatalogFile

Settings = tuple[Iterable[Any], Mapping[str, Any]]  # a profile's (args, env)
NO_SETTINGS: Settings = ((), {})

# Names a dynamic loader, a shell or an interpreter reads to decide what code to load.
CODE_ENV_NAMES = {
    "PATH": "chooses which programs the engine runs",
    "HOME": "chooses the Python user site (~/.local) the engine imports from",
    "BASH_ENV": "is a script every non-interactive bash runs first",
    "ENV": "is a script every sh runs first",
    "SHELLOPTS": "changes how every bash the engine starts runs",
    "BASHOPTS": "changes how every bash the engine starts runs",
    "PS4": "is expanded, commands included, by every traced shell",
    "GCONV_PATH": "chooses the libraries glibc loads to convert text",
    "OPENSSL_CONF": "can make OpenSSL load any library",
    "OPENSSL_MODULES": "chooses the libraries OpenSSL loads",
    "OPENSSL_ENGINES": "chooses the libraries OpenSSL loads",
    "CUDA_INJECTION64_PATH": "is a library CUDA loads into the engine",
    "NCCL_NET_PLUGIN": "is a library NCCL loads into the engine",
    "NCCL_TUNER_PLUGIN": "is a library NCCL loads into the engine",
    "NCCL_PROFILER_PLUGIN": "is a library NCCL loads into the engine",
    "TRITON_LIBCUDA_PATH": "chooses the CUDA library Triton loads",
    "NODE_OPTIONS": "passes options, --require included, to every node",
    "NODE_PATH": "chooses the modules node imports",
    "PERL5LIB": "chooses the modules perl imports",
    "PERL5OPT": "passes options, -M included, to every perl",
    "PERLLIB": "chooses the modules perl imports",
    "RUBYOPT": "passes options, -r included, to every ruby",
    "RUBYLIB": "chooses the libraries ruby loads",
    "JAVA_TOOL_OPTIONS": "passes options, -javaagent included, to every JVM",
    "_JAVA_OPTIONS": "passes options, -javaagent included, to every JVM",
    "VLLM_ALLOW_INSECURE_SERIALIZATION": "lets vLLM unpickle what its peers send (code)",
}
CODE_ENV_PREFIXES = {
    "LD_": "is read by the dynamic loader (LD_PRELOAD, LD_LIBRARY_PATH, LD_AUDIT load code)",
    "PYTHON": "is read by Python (PYTHONPATH, PYTHONSTARTUP and PYTHONHOME load code)",
}
# Python settings that only tune output, and load nothing.
HARMLESS_PYTHON_ENV = {
    "PYTHONUNBUFFERED", "PYTHONHASHSEED", "PYTHONDONTWRITEBYTECODE", "PYTHONIOENCODING",
    "PYTHONFAULTHANDLER", "PYTHONUTF8",
}  # fmt: skip

# Engine flags that import code the engine's release does not hold, or write files as root.
CODE_FLAGS = {
    "--trust-remote-code": "runs the Python code a model's repository ships",
    "--config": "reads more flags from a file, past these checks (vLLM)",
    "--middleware": "imports Python classes by name into the server (vLLM)",
    "--tool-parser-plugin": "imports a Python file (vLLM)",
    "--reasoning-parser-plugin": "imports a Python file (vLLM)",
    "--logits-processors": "imports Python classes by name (vLLM)",
    "--worker-cls": "imports a Python class by name (vLLM)",
    "--worker-extension-cls": "imports a Python class by name (vLLM)",
    "--enable-custom-logit-processor": "lets every request send Python code to run (SGLang)",
    "--custom-weight-loader": "imports Python functions by name (SGLang)",
    "--slot-save-path": "writes files wherever it says, as root (llama.cpp)",
    "--log-file": "writes a file wherever it says, as root",
    "--path": "serves a directory over HTTP: any file the engine can read (llama.cpp)",
}


def why_env_loads_code(name: str) -> str | None:
    """Why a profile env ``name`` makes the engine load code; None when it does not."""
    if name in CODE_ENV_NAMES:
        return CODE_ENV_NAMES[name]
    if name in HARMLESS_PYTHON_ENV:
        return None
    return next((why for prefix, why in CODE_ENV_PREFIXES.items() if name.startswith(prefix)), None)


def why_flag_loads_code(arg: str) -> str | None:
    """Why an argument's flag makes the engine load code; None when it does not. Python
    engines take ``_`` for ``-`` and any unambiguous abbreviation, so those count too."""
    flag = arg.split("=", 1)[0].replace("_", "-")
    if not flag.startswith("--") or len(flag) <= 3:
        return None
    if flag in CODE_FLAGS:
        return CODE_FLAGS[flag]
    return next((why for code, why in CODE_FLAGS.items() if code.startswith(flag)), None)


def code_in_profile(args: Iterable[Any], env: Mapping[str, Any]) -> dict[str, str]:
    """Each thing in a profile's args and env that loads code, as written (``env
    LD_PRELOAD=/x``, ``args --tool-parser-plugin /p.py``) -> why."""
    found: dict[str, str] = {}
    listed = [str(arg) for arg in args]
    for index, arg in enumerate(listed):
        why = why_flag_loads_code(arg)
        if why is None:
            continue
        value = listed[index + 1] if index + 1 < len(listed) else ""
        written = arg if "=" in arg or not value or value.startswith("-") else f"{arg} {value}"
        found[f"args {written}"] = why
    for name, value in env.items():
        why = why_env_loads_code(str(name))
        if why is not None:
            found[f"env {name}={value}"] = why
    return found


class EngineAdminRequired(CatalogError):
    """A change that would make nodes run code of its author's choosing, by someone not
    in the engine-admin group: each problem names the field, the value and the group."""


def refuse_unless_engine_admin(actor: Actor, problems: list[str]) -> None:
    """Raise EngineAdminRequired with ``problems`` unless ``actor`` may make nodes run code."""
    if problems and not is_engine_admin(actor):
        raise EngineAdminRequired(
            [*problems, f"ask an admin to add you to {ENGINE_ADMINS_GROUP!r}, or leave these out"]
        )


def check_planned(changes: list[Change], catalog: CatalogFile, filename: str, actor: Actor) -> None:
    """Refuse an apply whose planned ``changes`` add code for nodes, unless by an engine admin."""
    problems = []
    for change in changes:
        if change.action == "delete":
            continue  # removing runs nothing
        if change.kind == "engine":
            problems.append(engine_problem(f"{filename}: engines: {change.name}"))
        elif change.kind == "profile":
            model_name, name = change.name.rsplit("/", 1)
            [entry] = [p for m in catalog.models if m.name == model_name
                       for p in m.profiles if p.name == name]  # fmt: skip
            before = NO_SETTINGS
            if change.action == "update":  # fields holds (before, after) of what changes
                before = (change.fields.get("args", (entry.args,))[0],
                          change.fields.get("env", (entry.env,))[0])  # fmt: skip
            where = f"{filename}: models: {model_name}: profiles: {name}"
            problems += profile_problems(where, before, (entry.args, entry.env))
    refuse_unless_engine_admin(actor, problems)


def check_row(row: models.Model, actor: Actor) -> None:
    """Refuse saving an engine or profile row (the API, the admin) that adds code for nodes,
    compared with the row as stored, unless by an engine admin."""
    if isinstance(row, Engine):
        version = Engine.objects.filter(pk=row.pk).values("name", "version", "builds").first()
        if version != {"name": row.name, "version": row.version, "builds": row.builds}:
            refuse_unless_engine_admin(actor, [engine_problem(f"engine {row}")])
    elif isinstance(row, Profile):
        stored = Profile.objects.filter(pk=row.pk).values("args", "env").first()
        before = (stored["args"], stored["env"]) if stored else NO_SETTINGS
        # A new model's profile from the admin has no saved model to name yet.
        where = f"profile {row}" if row.model_id else f"profile {row.name}"
        refuse_unless_engine_admin(actor, profile_problems(where, before, (row.args, row.env)))


def profile_problems(where: str, before: Settings, after: Settings) -> list[str]:
    """What a profile's change from ``before`` to ``after`` adds that loads code, each as a
    refusal naming it; a setting kept as it was is the engine admin's who made it."""
    kept = code_in_profile(*before)
    return [
        f"{where}: {written} {why}; setting it needs the {ENGINE_ADMINS_GROUP} group"
        for written, why in code_in_profile(*after).items()
        if written not in kept
    ]


def engine_problem(where: str) -> str:
    return (
        f"{where}: an engine version is installed and run as root on every node (its builds, "
        f"their sha256, apt packages, or pip's release); declaring or changing one needs the "
        f"{ENGINE_ADMINS_GROUP} group"
    )
