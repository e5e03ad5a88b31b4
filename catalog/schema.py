"""The catalog file's format, validated field by field.

``parse_catalog`` turns YAML text into a ``CatalogFile`` or raises ``CatalogError``
listing every problem with file, entry and field named, so an operator fixes a
typo in one pass instead of one per run.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from catalog.models import KNOWN_ENGINES, LAUNCH_MODES, STRATEGIES
from protocol.engine_args import common_flag_problems
from protocol.engine_serves import (
    ENGINE_SERVES,
    effective_serves,
    prefix_cache_switched_off,
    serve_arg_problems,
    serve_problems,
)
from protocol.engines import PIP_ENGINES, EngineBuild, check_path_token
from protocol.routing import PREFIX, ROUTING_POLICIES
from protocol.shard import ADAPTER_SEPARATOR, adapter_id, loras_of
from protocol.sources import check_source
from protocol.units import parse_duration, parse_size

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$")

# Counts and durations land in PostgreSQL integer columns, sizes in bigint ones: a larger
# number is refused here, at its place in the file, not by the database mid-apply.
INTEGER_MAX, BIGINT_MAX = 2**31 - 1, 2**63 - 1
Size = Annotated[int, BeforeValidator(parse_size), Field(le=BIGINT_MAX)]
Duration = Annotated[int, BeforeValidator(parse_duration), Field(le=INTEGER_MAX)]


class CatalogError(Exception):
    """Every problem found in a catalog file, each naming file, entry and field."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


class _Entry(BaseModel):
    """Any part of the catalog file: an unknown field is a typo, and spaces around a value
    are not meant."""

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)


def _check_name(value: str) -> str:
    if not NAME.match(value):
        raise ValueError(
            f"{value!r} is not a usable name; use letters, digits and . _ - : / (128 at most)"
        )
    return value


Name = Annotated[str, AfterValidator(_check_name)]


def _check_engine(value: str) -> str:
    if value not in KNOWN_ENGINES:
        raise ValueError(f"unknown engine {value!r}; llmgw runs {', '.join(KNOWN_ENGINES)}")
    return value


class EngineEntry(_Entry):
    name: str
    version: str
    # One archive per platform and accelerator; vLLM and SGLang are pip installs, no builds.
    builds: list[EngineBuild] = []

    _engine = field_validator("name")(_check_engine)

    @field_validator("version")
    @classmethod
    def version_is_a_token(cls, value: str) -> str:
        return check_path_token("version", value)

    @model_validator(mode="after")
    def builds_only_for_archives(self) -> EngineEntry:
        if self.builds and self.name in PIP_ENGINES:
            raise ValueError(
                f"{self.name} is installed on each node with pip ({self.name}=={self.version}), "
                "not from an archive; remove its builds:"
            )
        return self


class NamedEntry(_Entry):
    name: str
    description: str = ""

    _name = field_validator("name")(_check_name)


class RolloutEntry(_Entry):
    """How a profile's stale replicas are replaced: new ones beside, or old ones first."""

    surge: int = Field(default=1, ge=0, le=INTEGER_MAX)
    unavailable: int = Field(default=0, ge=0, le=INTEGER_MAX)

    @model_validator(mode="after")
    def can_replace(self) -> RolloutEntry:
        if not self.surge and not self.unavailable:
            raise ValueError(
                "surge and unavailable are both 0, so no replica could ever be replaced; set "
                "surge: 1 to start each new replica beside the old ones, or unavailable: 1 to "
                "replace them in place"
            )
        return self


class AutoscaleEntry(_Entry):
    """Replicas that follow demand (fleet/reconcile/autoscale.py): between min and max, up as
    soon as the requests per replica pass target_inflight, down after scale_down_after below
    it."""

    min: int = Field(default=1, ge=0, le=INTEGER_MAX)
    max: int = Field(ge=1, le=INTEGER_MAX)
    target_inflight: float = 4
    scale_down_after: Duration = 300

    @field_validator("target_inflight")
    @classmethod
    def target_is_positive(cls, value: float) -> float:
        if value <= 0:
            raise ValueError(
                f"{value:g} cannot be a target: it is the requests in flight per replica that "
                "calls for another replica; give a number above 0, such as 4"
            )
        return value

    @model_validator(mode="after")
    def min_within_max(self) -> AutoscaleEntry:
        if self.min > self.max:
            raise ValueError(f"min {self.min} is more than max {self.max}; make min at most max")
        return self


class ProfileEntry(_Entry):
    name: str
    engine: str
    engine_version: str = ""
    replicas: int = Field(default=1, ge=0, le=INTEGER_MAX)
    gpus_per_rank: int = Field(default=0, ge=0, le=INTEGER_MAX)
    tensor_parallel: int = Field(default=1, ge=1, le=INTEGER_MAX)
    nodes: int = Field(default=1, ge=1, le=INTEGER_MAX)
    memory: Size = 0
    gpu_memory: Size = 0
    disk: Size = 0
    context: int = Field(default=0, ge=0, le=INTEGER_MAX)
    pool: str = ""
    launch_mode: str = "native"
    strategy: str = "pack"
    # What its replicas serve (chat, embeddings, rerank, …); empty: the engine's default.
    serves: list[str] = []
    args: list[str] = []
    env: dict[str, str] = {}
    startup_timeout: Duration = 600
    rollout: RolloutEntry = Field(default_factory=RolloutEntry)
    drain_timeout: Duration = 30
    # Requests one replica serves at once; more wait in the routers. 0: no limit.
    concurrency: int = Field(default=0, ge=0, le=INTEGER_MAX)
    autoscale: AutoscaleEntry | None = None
    # LoRA adapters one vLLM replica holds in a batch (--max-loras), and their highest rank;
    # 0: vLLM's LoRA stays off (adapters then need it set) and its default rank (16).
    max_loras: int = Field(default=0, ge=0, le=INTEGER_MAX)
    max_lora_rank: int = Field(default=0, ge=0, le=INTEGER_MAX)
    # Last: its check reads engine, args and env, which pydantic validates first.
    routing: str = "least_outstanding"

    _name = field_validator("name")(_check_name)

    _engine = field_validator("engine")(_check_engine)

    @field_validator("engine_version")
    @classmethod
    def engine_version_is_a_token(cls, value: str) -> str:
        return check_path_token("engine_version", value) if value else value

    @field_validator("routing")
    @classmethod
    def routing_is_usable(cls, value: str, info: ValidationInfo) -> str:
        if value not in ROUTING_POLICIES:
            raise ValueError(f"unknown routing {value!r}; use {' or '.join(ROUTING_POLICIES)}")
        engine, args, env = (info.data.get(name) for name in ("engine", "args", "env"))
        if value == PREFIX and engine and args is not None and env is not None:
            switch = prefix_cache_switched_off(engine, args, env)
            if switch:
                raise ValueError(
                    f"prefix routing keeps requests that share a prompt prefix on one replica "
                    f"so that its prefix cache serves them, but {switch} turns {engine}'s "
                    f"prefix cache off; remove {switch}, or use routing: least_outstanding"
                )
        return value

    @field_validator("launch_mode")
    @classmethod
    def launch_mode_is_known(cls, value: str) -> str:
        if value not in LAUNCH_MODES:
            raise ValueError(f"unknown launch_mode {value!r}; use one of {', '.join(LAUNCH_MODES)}")
        return value

    @field_validator("strategy")
    @classmethod
    def strategy_is_known(cls, value: str) -> str:
        if value not in STRATEGIES:
            raise ValueError(f"unknown strategy {value!r}; use pack or spread")
        return value

    @field_validator("startup_timeout")
    @classmethod
    def startup_timeout_positive(cls, value: int) -> int:
        if value < 1:
            raise ValueError("startup_timeout must be at least 1s")
        return value

    @model_validator(mode="after")
    def parallelism_fits(self) -> ProfileEntry:
        if self.gpus_per_rank and self.gpus_per_rank % self.tensor_parallel:
            raise ValueError(
                f"tensor_parallel {self.tensor_parallel} does not divide gpus_per_rank "
                f"{self.gpus_per_rank}; use a tensor_parallel that divides it"
            )
        if not self.gpus_per_rank and self.tensor_parallel > 1:
            raise ValueError("tensor_parallel above 1 needs gpus_per_rank; a CPU rank has none")
        if self.engine == "sglang" and self.launch_mode == "ray":
            raise ValueError("sglang has no ray launch mode; use native")
        if (self.max_loras or self.max_lora_rank) and not loras_of(self.engine).at_runtime:
            raise ValueError(
                f"max_loras and max_lora_rank are vLLM's; {self.engine} loads every adapter "
                "its model lists at start; remove them"
            )
        return self

    @model_validator(mode="after")
    def engine_serves_it(self) -> ProfileEntry:
        """Refuse what the engine cannot serve and flags llmgw sets itself (the agent's
        adapter would, at launch), and keep serves: in one spelling: the fingerprint, and
        so rolling restarts, follow it."""
        problems = serve_problems(self.engine, self.serves)
        problems += serve_arg_problems(self.engine, self.serves, self.args, self.env)
        problems += common_flag_problems(self.args)
        if problems:
            raise ValueError("; ".join(problems))
        served = effective_serves(self.engine, self.serves)
        self.serves = [] if tuple(served) == ENGINE_SERVES[self.engine].default else served
        return self


ADAPTER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class AdapterEntry(_Entry):
    """A LoRA adapter served on its model's replicas, asked for as ``<model>:<name>``."""

    name: str
    source: str
    sha256: str = Field(default="", pattern=r"^([0-9a-f]{64})?$")
    aliases: list[Name] = []
    scale: float = Field(default=1.0, gt=0, le=100)  # 1: as trained
    # The model's profiles that serve it; empty: every one whose engine can.
    profiles: list[str] = []
    description: str = ""

    @field_validator("name")
    @classmethod
    def name_is_usable(cls, value: str) -> str:
        if not ADAPTER_NAME.match(value):
            raise ValueError(
                f"{value!r} is not a usable adapter name; use letters, digits and . _ - "
                f"(64 at most): clients ask for it as <model>{ADAPTER_SEPARATOR}<adapter>"
            )
        return value

    _source = field_validator("source")(check_source)


class ModelEntry(_Entry):
    name: str
    source: str
    sha256: str = Field(default="", pattern=r"^([0-9a-f]{64})?$")
    aliases: list[Name] = []
    description: str = ""
    profiles: list[ProfileEntry] = []
    adapters: list[AdapterEntry] = []

    _name = field_validator("name")(_check_name)

    _source = field_validator("source")(check_source)

    @model_validator(mode="after")
    def profile_names_unique(self) -> ModelEntry:
        names = [profile.name for profile in self.profiles]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"profile {duplicates[0]!r} is named twice")
        return self

    @model_validator(mode="after")
    def adapters_can_be_served(self) -> ModelEntry:
        """Every problem of every adapter at once, each naming the adapter and its fix."""
        problems = []
        profiles = {profile.name: profile for profile in self.profiles}
        seen: set[str] = set()
        for adapter in self.adapters:
            where = f"adapters: {adapter.name}"
            if adapter.name in seen:
                problems.append(f"{where}: named twice; give each adapter its own name")
            seen.add(adapter.name)
            unknown = [name for name in adapter.profiles if name not in profiles]
            if unknown:
                problems.append(
                    f"{where}: profiles: {', '.join(map(repr, unknown))} not among this "
                    f"model's profiles ({', '.join(profiles) or 'none'}); list only those"
                )
            named = [profiles[name] for name in adapter.profiles if name in profiles]
            for profile in named or self.profiles:
                problems += _adapter_on_profile(adapter, profile, where, bool(named))
        if problems:
            raise ValueError("; ".join(problems))
        return self


def _adapter_on_profile(
    adapter: AdapterEntry, profile: ProfileEntry, where: str, named: bool
) -> list[str]:
    """Why ``profile`` cannot serve ``adapter``; a profile the adapter does not name only
    when its engine could (an SGLang profile beside a vLLM one just leaves it out)."""
    loras = loras_of(profile.engine)
    if loras.refused and not named:
        return []
    why = loras.problem(adapter.source, profile.max_loras)
    return [f"{where}: profile {profile.name} runs {profile.engine}: {why}"] if why else []


class CatalogFile(_Entry):
    engines: list[EngineEntry] = []
    pools: list[NamedEntry] = []
    fabrics: list[NamedEntry] = []
    models: list[ModelEntry] = []


def parse_catalog(text: str, filename: str = "catalog.yaml") -> CatalogFile:
    """Parse and validate a catalog file, or raise CatalogError naming every problem."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise CatalogError([f"{filename}: not valid YAML: {exc}"]) from None
    except RecursionError:  # the YAML reader's own limit, reached by nesting alone
        raise CatalogError([f"{filename}: nested too deeply to be read"]) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise CatalogError(
            [f"{filename}: the top level must be a mapping with models:, engines: …"]
        )
    try:
        catalog = CatalogFile.model_validate(data)
    except ValidationError as exc:
        raise CatalogError([_describe(filename, data, error) for error in exc.errors()]) from None
    problems = _cross_check(catalog, filename)
    if problems:
        raise CatalogError(problems)
    return catalog


def validate_fields(
    entry_class: type[_Entry], data: dict[str, Any]
) -> tuple[_Entry | None, dict[str, list[str]]]:
    """One entry checked by the file's rules, for a form or the API: the entry, or each
    problem filed under the field it names (``non_field_errors`` for the entry's own)."""
    try:
        return entry_class.model_validate(data), {}
    except ValidationError as exc:
        errors: dict[str, list[str]] = {}
        for error in exc.errors():
            field = str(error["loc"][0]) if error["loc"] else "non_field_errors"
            message = error["msg"].removeprefix("Value error, ")
            if error["type"] == "extra_forbidden":
                message = f"unknown field {field!r}; check its spelling"
            errors.setdefault(field, []).append(message)
        return None, errors


def _describe(filename: str, data: Any, error: Any) -> str:
    """Name the entry (by index and name) and the field a pydantic error is about."""
    parts: list[str] = []
    node = data
    for key in error["loc"]:
        if isinstance(key, int) and isinstance(node, list) and key < len(node):
            node = node[key]
            name = node.get("name") if isinstance(node, dict) else None
            parts[-1] = f"{parts[-1]}[{key}]" + (f" ({name})" if name else "")
        elif isinstance(node, dict) and key in node:
            node = node[key]
            parts.append(str(key))
        else:
            parts.append(str(key))
    where = ": ".join(parts) if parts else "top level"
    message = error["msg"].removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        message = f"unknown key {parts[-1]!r}; check its spelling"
    elif error["type"] == "missing":
        message = "is required"
    return f"{filename}: {where}: {message}"


def _cross_check(catalog: CatalogFile, filename: str) -> list[str]:
    """Problems that span entries: duplicates, names clients could confuse, undeclared pools."""
    problems = []
    for section in ("engines", "pools", "fabrics", "models"):
        seen: set[tuple[str, ...]] = set()
        for index, entry in enumerate(getattr(catalog, section)):
            key = (entry.name, getattr(entry, "version", ""))
            if key in seen:
                problems.append(f"{filename}: {section}[{index}] ({entry.name}): named twice")
            seen.add(key)
    served: dict[str, str] = {}  # name -> "model 'x'" or "adapter 'x:y'"
    for index, model in enumerate(catalog.models):
        # (name, what it names): a model's own names, then each adapter's.
        names = [(name, f"model {model.name!r}") for name in [model.name, *model.aliases]]
        for adapter in model.adapters:
            full = adapter_id(model.name, adapter.name)
            names += [(name, f"adapter {full!r}") for name in [full, *adapter.aliases]]
        for name, owner in names:
            if name in served and served[name] != owner:
                problems.append(
                    f"{filename}: models[{index}] ({model.name}): {name!r} is already a name "
                    f"of {served[name]}; clients could not tell them apart"
                )
            served.setdefault(name, owner)
    return problems
